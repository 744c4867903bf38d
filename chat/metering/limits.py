"""Limits per person, per token, per socket and per provider (settings in chatsite/settings.py).

Streams at once and streams a minute are counted on the usage rows, which every
stream writes when it starts (status `streaming` until it ends): the count holds
across server processes with no store beyond the database, and the check runs in
the transaction that creates the new row, with the user's row locked
(chat/metering/metered_streams.py), so two requests at the same moment cannot both
take the last place. Django's cache would need Redis or a database table configured
to be shared by processes; the usage rows are already there.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext as _

from chat.metering import budgets
from chat.models.base import ChatError, Status
from chat.models.usage import Usage

WINDOW = timedelta(minutes=1)
FRAME_LIMIT_CLOSE_CODE = 4429


class LimitExceeded(ChatError):
    """Too many streams at once (`too_many_streams`) or a minute (`rate_limited`)."""

    def __init__(self, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(code, detail)
        self.retry_after = retry_after


COUNTS_WIDTH = 4  # counts_sql()'s columns


def counts_sql(user, *, source: str, token=None, now: datetime) -> tuple[str, list]:
    """The statement whose one row enforce() checks: a start's read, sent with its others (metered_streams)."""
    user_rate = settings.RATE_LIMIT_PER_MINUTE
    token_rate = settings.API_TOKEN_RATE_LIMIT_PER_MINUTE if token is not None else 0
    # No stream outlives UPSTREAM_DEADLINE: an older row still `streaming` was left by a dead
    # process and must not hold a place until something sweeps it (nor a budget's reservation).
    return _counts_sql(
        user.pk, source, token.pk if token is not None else None,
        alive_since=budgets.alive_since(now), since=now - WINDOW if user_rate or token_rate else None,
    )  # fmt: skip


def enforce(user, *, source: str, token=None, counted: tuple | None = None, now: datetime | None = None,
            ahead: int = 0) -> None:  # fmt: skip
    """Refuse a new stream over the caps; a start's step (chat/metering/metered_streams.py), after its lock.

    `counted`: counts_sql()'s row for `now`, when the start read it already. `ahead`: starts of the
    same person, source and token admitted before this one in its transaction, not yet written.
    """
    if counted is None:
        now = timezone.now()
        sql, params = counts_sql(user, source=source, token=token, now=now)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            counted = cursor.fetchone()
    now = now or timezone.now()
    user_rate = settings.RATE_LIMIT_PER_MINUTE
    token_rate = settings.API_TOKEN_RATE_LIMIT_PER_MINUTE if token is not None else 0
    mine, by_token, mine_recent, token_recent = (int(n or 0) + ahead for n in counted)
    cap = settings.CHAT_MAX_STREAMS if source == Usage.Source.CHAT else settings.API_MAX_STREAMS
    _cap_streams(mine, cap, "you have")
    if token is not None:
        _cap_streams(by_token, settings.API_TOKEN_MAX_STREAMS, "this token has")
    _cap_rate(mine_recent, {"user": user}, user_rate, "you", now)
    if token is not None:
        _cap_rate(token_recent, {"token": token}, token_rate, "this token", now)


def _counts_sql(user_id: int, source: str, token_id: int | None, *, alive_since: datetime,
                since: datetime | None) -> tuple[str, list]:  # fmt: skip
    """Streams running (the person's of this source, the token's) and started since `since`, in plain SQL.

    With `since` None (no rate cap is set) the starts are not counted: they are 0.

    It runs on every stream start, where compiling the ORM's filtered counts cost more than
    the query. One statement, after the start has locked the person's row (metered_streams.admit):
    read after the lock is had, the counts see the rows of the start it waited for.
    """
    ops = connection.ops
    table = ops.quote_name(Usage._meta.db_table)
    # Two ranges of the person's rows, not one: the streams running come from the partial
    # index of rows still `streaming` (a handful), the starts from the last minute only. One
    # count over the whole half hour a stream may run would read every row the person started
    # in it, so a busy script's starts would grow dearer with its own traffic. The
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
    return f"SELECT * FROM ({running}) running, ({recent}) recent", params


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
        return  # the common case builds no queryset: compiling one costs more than the check
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
