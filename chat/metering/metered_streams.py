"""A metered stream's start and settle: how a chat turn, a /v1 request and a title open and close their usage row.

A start locks the person's row, so that their starts run one at a time whichever process
takes them, refuses a stream over the limits (chat/metering/limits.py) or the monthly budget
(chat/metering/budgets.py), and writes the stream's usage row as `streaming` with its
reservation, all in one transaction: a refusal stores nothing, and two starts at the same
moment cannot both take the last place or the last of a budget. The settle is the stream's
final save on that row: its counts and cost, and a status off `streaming`, which releases the
reservation.

Here, not in chat/actions: the generation task (chat/streaming) settles its stream, and may
only import what lies below it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from chat.metering import budgets, limits, stream_metrics
from chat.models.base import Read, Status, commit_with, insert_read, read_together, side_by_side, update_read
from chat.models.providers import Provider
from chat.models.usage import Usage


def admit(user, *, source: str, token=None, check_limits: bool = True, provider: Provider | None = None,
          model: str | None = None, now: datetime | None = None,
          before: list[Read] = ()) -> list | None:  # fmt: skip
    """A start's first step, in its transaction: lock the person's row, then refuse a stream over the limits.

    With `provider` and `model` (the usage row follows at once: open_row() with `read` and `started`=`now`),
    the budget's reads go with the lock and the limits' in one round trip, and their rows are returned.
    `before`: writes of the caller's sent ahead of the lock in that round trip.
    """
    now = now or timezone.now()
    counted, read = _admission(user, source=source, token=token, check_limits=check_limits, provider=provider,
                               model=model, now=now, before=before)  # fmt: skip
    if counted is not None:
        limits.enforce(user, source=source, token=token, counted=counted, now=now)
    return read


def _admission(user, *, source: str, token, check_limits: bool, provider: Provider | None, model: str | None,
               now: datetime, before: list[Read] = ()) -> tuple[tuple | None, list | None]:  # fmt: skip
    """Lock the person's row and read what admitting a start takes, in one round trip on PostgreSQL:
    the limits' counts (None unless `check_limits`) and the budget's rows (None without a provider and model).

    The reads go in one statement: the ones of one row each (the counts, the months) side by side, the budget rows
    joined to them.
    """
    budgeted = provider is not None and model is not None
    one_row = (
        [(*limits.counts_sql(user, source=source, token=token, now=now), limits.COUNTS_WIDTH)] if check_limits else []
    )
    budget_rows = None
    if budgeted:
        budget_rows, months = budgets.reserve_reads(user, token=token, provider_id=provider.pk, model=model, now=now)
        one_row += months
    found = _locked_reads(user.pk, [side_by_side(one_row, budget_rows)] if one_row else [], before)
    rows = found[0] if one_row else []
    counted = rows.pop(0) if check_limits else None
    return counted, [rows[-1], *([row] for row in rows[:-1])] if budgeted else None


def open_row(user, *, source: str, provider: Provider, model: str, prompt_tokens: int, max_tokens: int, token=None,
             message=None, worker_id: int | None = None, started: datetime | None = None,
             read: list | None = None) -> Usage:  # fmt: skip
    """A start's last step, after admit() in the same transaction: reserve the worst case, write the usage row.

    The row's insert goes with the transaction's COMMIT (commit_with: call it last in the outermost
    atomic block), which ends the person's lock one round trip sooner. Raises BudgetExceeded over a budget.
    `max_tokens`: the most completion tokens the request can produce; `message`: a chat reply's row;
    `read`: what admit() returned, when it was given the provider, the model and `started` as its `now`.
    """
    started = started or timezone.now()
    reservation = _reserve(user, source=source, token=token, provider=provider, model=model,
                           prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=started, read=read)  # fmt: skip
    [usage] = commit_with([insert_read(_row(user, source=source, token=token, provider=provider, model=model,
                                            prompt_tokens=prompt_tokens, reservation=reservation, message=message,
                                            worker_id=worker_id, started=started))])  # fmt: skip
    stream_metrics.opened(usage.pk, source, provider.name, prompt_tokens)
    return usage


def start(user, *, source: str, provider: Provider, model: str, prompt_tokens: int, max_tokens: int,
          token=None, worker_id: int | None = None, started: datetime | None = None,
          check_limits: bool = True, message=None, before: list[Read] = ()) -> Usage:  # fmt: skip
    """Start a metered stream: the person's lock, the limits, the budget and the usage row in one transaction;
    its usage row, `streaming`.

    Raises LimitExceeded or BudgetExceeded. Starts of one person (with the same token, provider and
    model) that arrive while one of theirs holds the lock are made together, in the next
    transaction (_Together): one lock and one set of reads for all of them, each admitted as if
    one after another; a start inside the caller's own atomic block is made alone, in it.
    `before`: the caller's own writes (a new chat's rows, whose ids were taken ahead), sent with the
    usage row if the start is admitted, and not at all if it is refused; `message`: a chat reply's row.
    A chat turn that must read or write in between (an existing conversation, uploads) takes admit()
    and open_row() itself, in its own transaction (chat/actions/turns.py).
    """
    started = started or timezone.now()
    mine = _Start(started, prompt_tokens, max_tokens, worker_id, message, list(before))

    def make(starts: list[_Start]) -> None:
        _start_together(user, starts, source=source, provider=provider, model=model, token=token,
                        check_limits=check_limits)  # fmt: skip

    if connection.in_atomic_block:
        make([mine])  # in the caller's transaction, which another thread's could not stand for
    else:
        key = (user.pk, source, token.pk if token is not None else None, provider.pk, model, check_limits,
               budgets.month_start(started))  # fmt: skip
        _Together.join(key, mine, make)
    if mine.error is not None:
        raise mine.error
    return mine.usage


@dataclass(eq=False)
class _Start:
    """One start waiting to be made with its person's others (start()), and what became of it."""

    started: datetime
    prompt_tokens: int
    max_tokens: int
    worker_id: int | None
    message: Any = None
    before: list[Read] = field(default_factory=list)
    usage: Usage | None = None
    error: BaseException | None = None
    lead: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class _Together:
    """A person's starts, queued per key while one of theirs is being made, then made in one go by one thread.

    The thread whose start finds no other being made leads: it makes every start queued under
    its key by then, and hands the lead to the first start queued after, whose thread was waiting.
    Nothing waits on purpose: a start alone is made at once, and a queue forms only behind a start
    already under way, whose lock the queued ones would have waited for anyway, one at a time.
    """

    _queued: dict[tuple, list[_Start]] = {}
    _leading: set[tuple] = set()
    _guard = threading.Lock()

    @classmethod
    def join(cls, key: tuple, mine: _Start, make: Callable[[list[_Start]], None]) -> None:
        with cls._guard:
            cls._queued.setdefault(key, []).append(mine)
            if key not in cls._leading:
                cls._leading.add(key)
                mine.lead = True
        if not mine.lead:
            mine.done.wait()  # made by another thread, or handed the lead
        if mine.lead:
            cls._lead(key, make)

    @classmethod
    def _lead(cls, key: tuple, make: Callable[[list[_Start]], None]) -> None:
        with cls._guard:
            starts = cls._queued.pop(key)
        try:
            make(starts)
        except BaseException as exc:  # the transaction failed: every start of it fails with its error
            for start in starts:
                if start.usage is None and start.error is None:
                    start.error = exc
        finally:
            with cls._guard:
                waiting = cls._queued.get(key)
                if waiting:
                    waiting[0].lead = True
                else:
                    cls._leading.discard(key)
            for start in [*starts, *waiting[:1]] if waiting else starts:
                start.done.set()


def _start_together(user, starts: list[_Start], *, source: str, provider: Provider, model: str, token,
                    check_limits: bool) -> None:  # fmt: skip
    """Make `starts` (one person's, same source, token, provider and model) in one transaction, in order.

    Each is admitted as if the ones before it had been written: the limits count them, the budget
    counts their reservations. A refused one gets its error; the others' rows (their callers' writes
    first) go with the COMMIT.
    """
    now = max(start.started for start in starts)  # the reads see every row written before the latest of them
    admitted: list[tuple[_Start, Usage]] = []
    ahead = budgets.Spent(usd=Decimal(0), tokens=0)
    with transaction.atomic():
        counted, read = _admission(user, source=source, token=token, check_limits=check_limits, provider=provider,
                                   model=model, now=now)  # fmt: skip
        for start in starts:
            try:
                if check_limits:
                    limits.enforce(user, source=source, token=token, counted=counted, now=start.started,
                                   ahead=len(admitted))  # fmt: skip
                reservation = _reserve(user, source=source, token=token, provider=provider, model=model,
                                       prompt_tokens=start.prompt_tokens, max_tokens=start.max_tokens,
                                       now=start.started, read=read, ahead=ahead)  # fmt: skip
            except (limits.LimitExceeded, budgets.BudgetExceeded) as exc:
                start.error = exc
                continue
            admitted.append((start, _row(user, source=source, token=token, provider=provider, model=model,
                                         prompt_tokens=start.prompt_tokens, reservation=reservation,
                                         message=start.message, worker_id=start.worker_id,
                                         started=start.started)))  # fmt: skip
            ahead = budgets.Spent(usd=ahead.usd + (reservation.usd or 0), tokens=ahead.tokens + reservation.tokens)
        if admitted:
            commit_with([read for start, row in admitted for read in (*start.before, insert_read(row))])
    for start, usage in admitted:
        start.usage = usage
        stream_metrics.opened(usage.pk, source, provider.name, start.prompt_tokens)


def _reserve(user, *, source: str, token, provider: Provider, model: str, prompt_tokens: int, max_tokens: int,
             now: datetime, read: list | None, ahead: budgets.Spent | None = None) -> budgets.Reservation:  # fmt: skip
    try:
        return budgets.reserve(user, token=token, provider_id=provider.pk, model=model, prompt_tokens=prompt_tokens,
                               max_tokens=max_tokens, now=now, read=read, ahead=ahead)  # fmt: skip
    except budgets.BudgetExceeded:
        stream_metrics.refused(source)
        raise


def _row(user, *, source: str, token, provider: Provider, model: str, prompt_tokens: int,
         reservation: budgets.Reservation, started: datetime, worker_id: int | None,
         message=None) -> Usage:  # fmt: skip
    """A new stream's usage row, `streaming`, with its reservation."""
    return Usage(
        user=user, token=token, provider=provider, message=message, source=source, model=model, started=started,
        status=Status.STREAMING, prompt_tokens=prompt_tokens, reserved_usd=reservation.usd,
        reserved_tokens=reservation.tokens,
        worker_id=worker_id,  # this process's lease: if it dies, another one closes the row
    )  # fmt: skip


def settle(pk: int, fields: dict[str, Any], row: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stream's final save on its usage row, with its cost (reported, else priced); returns what was written.

    Moving the row off `streaming` releases its budget reservation. `row`: the row's provider_id,
    model and started when the caller has them (it wrote them), saving a read.
    """
    fields, write = settle_write(pk, fields, row)
    write.get()
    stream_metrics.settled(pk, fields)
    return fields


def settle_write(pk: int, fields: dict[str, Any], row: dict[str, Any] | None = None) -> tuple[dict[str, Any], Read]:
    """settle() as what it writes and the statement that writes it, to send with a transaction's last
    ones (commit_with); the price is read now. The caller counts it (stream_metrics.settled) in that transaction."""
    if row is None:
        row = Usage.objects.filter(pk=pk).values("provider_id", "model", "started").first()
    if row is not None:
        fields = {**fields, **budgets.priced(row["provider_id"], row["model"], row["started"], fields)}
    return fields, update_read(Usage, pk, fields)


def _locked_reads(user_id: int, reads: list[Read], before: list[Read] = ()) -> list:
    """Lock the person's row (see _lock_sql), then run `reads`, each a statement of its own; what they make.

    In one round trip on PostgreSQL (read_together: the lock and the reads sent together, with the
    transaction's BEGIN when they are its first statements), since the row stays locked until the start's
    commit, and every round trip under it is one that every other start of the person waits for.
    Each statement takes its own snapshot after the one before it ends: the reads see the start the
    lock waited for. SQLite has no row locks; its IMMEDIATE transactions already serialise writers.
    """
    first = list(before)
    if connection.features.has_select_for_update:
        first.append(Read(_lock_sql(_START_SETTINGS), [user_id]))
    return read_together([*first, *reads])[len(first) :]


# A start's settings, for its transaction only (set_config's `true`: SET LOCAL), selected by the lock's
# statement (one statement less on every start):
# - synchronous_commit off: the start's commit does not wait for its WAL to reach the disk, as
#   SQLite's (WAL, synchronous=NORMAL) does not: it waited under the lock, every start of the person
#   after it. A crash of the database's machine may lose the last moment's starts, never corrupt;
#   a stream's final save still waits.
# - plan_cache_mode force_generic_plan: the start's statements, prepared on the connection
#   (settings.DATABASE_PREPARED), are planned once, not again at each start. PostgreSQL's own
#   choice kept re-planning the budget's and the limits' reads (custom plans) on every start,
#   which cost the database more CPU than running the whole transaction; each reads a few rows
#   of one person through its indexes, whatever the values.
_START_SETTINGS = (
    "set_config('synchronous_commit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"
)


def lock_person(user_id: int) -> None:
    """Lock the person's row until the caller's transaction ends, as a start does (_lock_sql): what is counted and
    written under it (a stream's start, a tool round's calls this minute) cannot race another of theirs."""
    if connection.features.has_select_for_update:  # SQLite: its IMMEDIATE transactions already serialise writers
        with connection.cursor() as cursor:
            cursor.execute(_lock_sql(), [user_id])


def _lock_sql(select: str = "1") -> str:
    """The statement that locks the person's row, selecting `select`."""
    # NO KEY UPDATE on PostgreSQL: it conflicts with itself but not with the key-share lock every
    # insert of a row referencing the person takes (a conversation, a message's usage row), so a
    # start cannot deadlock with another save.
    mode = "NO KEY UPDATE" if connection.features.has_select_for_no_key_update else "UPDATE"
    users, quote = get_user_model()._meta, connection.ops.quote_name
    return f"SELECT {select} FROM {quote(users.db_table)} WHERE {quote(users.pk.column)} = %s FOR {mode}"
