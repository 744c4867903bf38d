"""Limits per person, per token, per socket and per provider (settings in chatsite/settings.py).

Streams at once and streams a minute are counted on the usage rows, which every
stream writes when it starts (status `streaming` until it ends): the count holds
across server processes with no store beyond the database, and the check runs in
the transaction that creates the new row, with the user's row locked (PostgreSQL;
SQLite's IMMEDIATE transactions already serialise writers), so two requests at the
same moment cannot both take the last place. Django's cache would need Redis or a
database table configured to be shared by processes; the usage rows are already there.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from contextlib import asynccontextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext as _

from . import budgets, upstream
from .models.base import ChatError, Status
from .models.providers import Provider
from .models.usage import Usage

WINDOW = timedelta(minutes=1)
FRAME_LIMIT_CLOSE_CODE = 4429


class LimitExceeded(ChatError):
    """Too many streams at once (`too_many_streams`) or a minute (`rate_limited`)."""

    def __init__(self, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(code, detail)
        self.retry_after = retry_after


def enforce(user, *, source: str, token=None) -> None:
    """Refuse a new stream over the caps; call inside the transaction that creates its usage row."""
    now = timezone.now()
    user_rate = settings.RATE_LIMIT_PER_MINUTE
    token_rate = settings.API_TOKEN_RATE_LIMIT_PER_MINUTE if token is not None else 0
    # No stream outlives UPSTREAM_DEADLINE: an older row still `streaming` was left by a dead
    # process and must not hold a place until something sweeps it (nor a budget's reservation).
    mine, by_token, mine_recent, token_recent = _counts(
        user.pk, source, token.pk if token is not None else None,
        alive_since=budgets.alive_since(now), since=now - WINDOW if user_rate or token_rate else None,
    )  # fmt: skip
    cap = settings.CHAT_MAX_STREAMS if source == Usage.Source.CHAT else settings.API_MAX_STREAMS
    _cap_streams(mine, cap, "you have")
    if token is not None:
        _cap_streams(by_token, settings.API_TOKEN_MAX_STREAMS, "this token has")
    _cap_rate(mine_recent, {"user": user}, user_rate, "you", now)
    if token is not None:
        _cap_rate(token_recent, {"token": token}, token_rate, "this token", now)


def _counts(user_id: int, source: str, token_id: int | None, *, alive_since: datetime,
            since: datetime | None) -> tuple[int, int, int, int]:  # fmt: skip
    """Streams running (the person's of this source, the token's) and started since `since`, in plain SQL.

    With `since` None (no rate cap is set) the starts are not counted: they are 0.

    It runs on every stream start, where compiling the ORM's filtered counts cost more than
    the query. One statement, after the person's row is locked where the database can
    (PostgreSQL; SQLite's IMMEDIATE transactions already serialise writers): a separate one,
    so that the counts, read after the lock is had, see the rows of the start it waited for.
    """
    ops = connection.ops
    if connection.features.has_select_for_update:
        # Serialise this person's concurrent starts. NO KEY UPDATE on PostgreSQL: it conflicts with
        # itself but not with the key-share lock every insert of a row referencing the person takes
        # (a conversation, a message's usage row), so a start cannot deadlock with another save.
        users = get_user_model()._meta
        mode = "NO KEY UPDATE" if connection.features.has_select_for_no_key_update else "UPDATE"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {ops.quote_name(users.db_table)} WHERE {ops.quote_name(users.pk.column)} = %s "
                f"FOR {mode}",
                [user_id],
            )
    table = ops.quote_name(Usage._meta.db_table)
    # Two ranges of the person's rows, not one: the streams running come from the partial
    # index of rows still `streaming` (a handful), the starts from the last minute only. One
    # count over the whole half hour a stream may run read every row the person had started
    # in it: a script making 10 requests a second had each start count 18,000 rows. The
    # status is written in the SQL, not bound, so that SQLite's planner sees the index's
    # condition in the query.
    running = (
        "SELECT COUNT(CASE WHEN source = %s THEN 1 END), COUNT(CASE WHEN token_id = %s THEN 1 END) "
        f"FROM {table} WHERE user_id = %s AND status = '{Status.STREAMING.value}' AND started > %s"
    )
    params = [source, token_id, user_id, ops.adapt_datetimefield_value(alive_since)]
    recent = "SELECT 0, 0"
    if since is not None:
        recent = (
            "SELECT COUNT(*), COUNT(CASE WHEN token_id = %s THEN 1 END) "
            f"FROM {table} WHERE user_id = %s AND started > %s"
        )
        params += [token_id, user_id, ops.adapt_datetimefield_value(since)]
    sql = f"SELECT * FROM ({running}) running, ({recent}) recent"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return tuple(int(n or 0) for n in row)


def _cap_streams(running: int, cap: int, who: str) -> None:
    if cap and running >= cap:
        # `who` is "you have" or "this token has": whole sentences each, so they translate.
        if who == "you have":
            detail = _(
                "Too many answers streaming at once: you have %(cap)s running. Wait for one to finish or stop one."
            )
        else:
            detail = _(
                "Too many answers streaming at once: this token has %(cap)s running. "
                "Wait for one to finish or stop one."
            )
        raise LimitExceeded("too_many_streams", detail % {"cap": cap})


def _cap_rate(recent: int, whose: dict, cap: int, who: str, now) -> None:
    if not cap or recent < cap:
        return  # the common case builds no queryset: compiling one was 5 % of a start's CPU
    # Over the cap: the oldest of the last `cap` starts leaves the window first.
    rows = Usage.objects.filter(**whose, started__gt=now - WINDOW)
    oldest = rows.order_by("-started").values_list("started", flat=True)[cap - 1]
    retry_after = max(1, math.ceil((oldest + WINDOW - now).total_seconds()))
    if who == "you":
        detail = _("Too many requests: you started %(cap)s in the last minute. Try again in %(seconds)s s.")
    else:
        detail = _("Too many requests: this token started %(cap)s in the last minute. Try again in %(seconds)s s.")
    raise LimitExceeded("rate_limited", detail % {"cap": cap, "seconds": retry_after}, retry_after)


# --- frames per socket --------------------------------------------------------------


class FrameLimiter:
    """A token bucket for one socket's frames; a flood that goes on past a second bucket's worth is closed."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.refused = 0.0  # refused frames, draining at `rate`
        self.last = now

    def take(self, now: float) -> str:
        """ "ok" to handle the frame, "refuse" to answer rate_limited, "close" to end the socket."""
        elapsed, self.last = max(0.0, now - self.last), now
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.refused = max(0.0, self.refused - elapsed * self.rate)
        if self.tokens >= 1:
            self.tokens -= 1
            return "ok"
        self.refused += 1
        return "close" if self.refused > self.burst else "refuse"

    @property
    def first_refusal(self) -> bool:
        """Whether the last refusal began a new spell (only then is the client told)."""
        return self.refused < 2


# --- connections per provider ---------------------------------------------------------

# (loop, provider name) -> (limit, semaphore); per process, as the connection pool is.
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, tuple[int, asyncio.Semaphore]]] = (
    weakref.WeakKeyDictionary()
)


def provider_limit(provider: Provider) -> int:
    return provider.max_connections or settings.UPSTREAM_PROVIDER_MAX_CONNECTIONS


@asynccontextmanager
async def provider_slot(name: str, limit: int):
    """Hold one of a provider's connections for as long as its request lasts; wait a bounded time for one."""
    slots = _slots.setdefault(asyncio.get_running_loop(), {})
    if name not in slots or slots[name][0] != limit:
        # A changed limit takes effect for new requests; running ones release the old semaphore.
        slots[name] = (limit, asyncio.Semaphore(limit))
    semaphore = slots[name][1]
    wait = settings.UPSTREAM_PROVIDER_WAIT
    try:
        async with asyncio.timeout(wait):
            await semaphore.acquire()
    except TimeoutError:
        raise upstream.UpstreamError(
            "busy",
            f"all {limit} connections this server may open to provider {name} "
            f"were busy for {wait:g} s; try again later",
        ) from None
    try:
        yield
    finally:
        semaphore.release()
