"""Streams whose process died: marked interrupted with estimated usage, and their watchers told.

A process that starts alone takes every stream not its own as dead (chat/apps.py); beside
others (REDIS_URL) each process sweeps for streams whose worker's lease expired; a stop or
an attach to a stream whose owner is gone recovers that one stream at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import models, transaction
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.translation import gettext_noop

from chat.metering.budgets import price_unpriced
from chat.models import Message, Usage, Worker
from chat.models.workers import INTERRUPTED_ERROR
from chat.runtime import db_threads, metrics, process_loops
from chat.runtime.failures import FailureStreak, stop_if_cancelled
from chat.streaming import tool_loop, tool_rounds, upstream
from chat.streaming.frames import send_done
from chat.streaming.generation import running_generation, running_messages

log = logging.getLogger(__name__)


def recover_orphans(
    lease: timedelta | None = None, *, only: int | None = None, before: datetime | None = None
) -> list[Message]:
    """Mark streams whose owning process is dead as interrupted, with estimated usage.

    A stream is orphaned when its worker's lease is older than `lease`; lease=None
    takes every stream not owned by this process (one process, just started), with
    or without a worker. This process's own streams are never touched: it is alive.
    `before` (with lease=None): only streams last written before then, when this process
    began serving; one it started before its lease was registered is its own.
    API usage rows (no message) of dead workers are closed the same way.
    `only` limits the sweep to one message (attach/stop to a stream whose owner is gone).
    """
    now = timezone.now()
    mine = Worker.current_id()
    if lease is None:
        dead = ~Q(worker=mine) | Q(worker__isnull=True) if mine is not None else Q()
    else:
        # A row without a worker predates leases or comes from a process that did not
        # register: only a lone process at start-up (lease=None) may take it as dead.
        dead = Q(worker__heartbeat__lt=now - lease) & ~Q(worker=mine)
    dead_messages, dead_api_rows = dead, dead
    if lease is None and before is not None:
        dead_messages, dead_api_rows = dead & Q(updated__lt=before), dead & Q(started__lt=before)
    candidates = Message.objects.streaming().filter(dead_messages)
    if only is not None:
        candidates = candidates.filter(pk=only)
    orphans = _end_each(candidates, lambda message: _end(message, Message.Status.INTERRUPTED, INTERRUPTED_ERROR, now))
    if only is None:
        # API streams keep no text: their usage is closed with what the row has (their checkpoints).
        rows = Usage.objects.filter(dead_api_rows, message__isnull=True, status=Message.Status.STREAMING)
        _close_each(rows, status=Message.Status.INTERRUPTED, estimated=True, ended=now, error=INTERRUPTED_ERROR)
    # The swept rows (chat and API) get the price table's cost, like any final save.
    price_unpriced(Usage.objects.filter(status=Message.Status.INTERRUPTED, ended=now, cost__isnull=True))
    return orphans


def _end_each(candidates, end: Callable[[Message], None]) -> list[Message]:
    """Call `end` on each of these streaming replies that still is one, read again under its row lock; those ended.

    Each in a transaction of its own: ending a reply writes its usage row, whose summaries are locked in one order
    (chat/metering/summary_triggers.py). One transaction for many held one row's person summary while it waited
    for another row's shard, which a start's insert held while it waited for that person summary: a deadlock.
    """
    ended = []
    for pk in list(candidates.order_by("pk").values_list("pk", flat=True)):
        with transaction.atomic():
            message = candidates.filter(pk=pk).select_for_update(of=("self",)).first()
            if message is not None:
                end(message)
                ended.append(message)
    return ended


def _close_each(rows, **fields) -> int:
    """Write `fields` on each of these usage rows, each in a transaction of its own (see _end_each); how many."""
    return sum(rows.filter(pk=pk).update(**fields) for pk in list(rows.order_by("pk").values_list("pk", flat=True)))


def _end(message: Message, status: str, error: str, now: datetime) -> None:
    """End a streaming reply nobody streams any more, and its usage row with estimated tokens (in a transaction)."""
    message.status, message.error, message.updated = status, error, now
    # A call it was waiting on or running when its stream ended ended with it: not shown running for ever,
    # and its round goes in the audit, which the turn would have written when the round ended.
    message.tool_rounds, cut = tool_loop.ended_rounds(message.tool_rounds, CALL_ENDED)
    message.save(update_fields=["status", "error", "updated", "tool_rounds"])
    if cut:
        tool_rounds.record_ended(message.conversation.owner_id, message.conversation_id, message.pk, cut)
    # A continued answer's earlier streams metered their part of the text already.
    earlier = Usage.objects.filter(message=message).exclude(status=Message.Status.STREAMING)
    before = earlier.aggregate(out=Sum("completion_tokens"), thought=Sum("reasoning_tokens"))
    completion = upstream.estimate_tokens(len(message.content) + len(message.reasoning))
    completion = max(0, completion - (before["out"] or 0))
    reasoning = max(0, upstream.estimate_tokens(len(message.reasoning)) - (before["thought"] or 0))
    Usage.objects.filter(message=message, status=Message.Status.STREAMING).update(
        status=status,
        completion_tokens=completion,
        reasoning_tokens=reasoning,
        total_tokens=models.F("prompt_tokens") + completion,
        estimated=True,
        ended=now,
        error=error,
    )


CALL_ENDED = "the answer's stream ended during the call"
# A reply of this process that no stream of this process runs, this long after its last write, is an
# orphan of its own (a turn whose start failed after it was stored): longer than any start takes.
OWN_ORPHAN_GRACE = timedelta(seconds=5)
NEVER_STARTED = gettext_noop("The answer could not be started; nothing was sent to the model. Try again.")
LOST_STREAM = gettext_noop("The stream of this answer ended without saving it; the text saved before was kept.")


def own_orphans(worker_id: int, grace: timedelta = OWN_ORPHAN_GRACE) -> list[int]:
    """This process's streaming replies last written more than `grace` ago (the caller drops those it runs)."""
    cutoff = timezone.now() - grace
    return list(Message.objects.streaming().filter(worker=worker_id, updated__lt=cutoff).values_list("pk", flat=True))


def end_own_orphans(worker_id: int, ids: list[int], grace: timedelta = OWN_ORPHAN_GRACE) -> list[Message]:
    """End these replies of this live process, which runs no stream for them: failed if nothing was streamed.

    Read again under a row lock, so a reply saved since (or ended) is left alone.
    """
    now = timezone.now()

    def end(message: Message) -> None:
        if message.content or message.reasoning:
            _end(message, Message.Status.INTERRUPTED, LOST_STREAM, now)
        else:
            _end(message, Message.Status.FAILED, NEVER_STARTED, now)

    orphans = _end_each(Message.objects.streaming().filter(pk__in=ids, worker=worker_id, updated__lt=now - grace), end)
    price_unpriced(Usage.objects.filter(message__in=orphans, ended=now, cost__isnull=True))
    return orphans


def end_unstarted(message_id: int) -> list[Message]:
    """A turn stored but whose stream could not be started (its socket's start failed): failed, with a sentence."""
    worker_id = Message.objects.filter(pk=message_id).values_list("worker", flat=True).first()
    return end_own_orphans(worker_id, [message_id], timedelta(0)) if worker_id is not None else []


async def sweep_own_forever(process: process_loops.Process) -> None:
    """End this process's own orphans: replies it stores as streaming but runs no stream for."""
    find, end = db_threads.run(own_orphans), db_threads.run(end_own_orphans)
    streak = FailureStreak("own orphan sweep failed", "own orphan sweep works again")
    while True:
        stop_if_cancelled()
        await asyncio.sleep(OWN_ORPHAN_SWEEP_SECONDS)
        try:
            ids = [pk for pk in await find(process.worker_id) if running_generation(pk) is None]
            ended = await end(process.worker_id, ids) if ids else []
            if ended:
                log.warning("ended %d reply(ies) of this process that no stream ran: %s", len(ended),
                            ", ".join(str(message.pk) for message in ended))  # fmt: skip
                await announce_recovered(ended)
        except Exception as exc:
            streak.failed(exc)
            continue
        streak.over()


OWN_ORPHAN_SWEEP_SECONDS = 2.0


async def announce_recovered(messages: list[Message]) -> None:
    """Tell sockets watching a recovered conversation that its stream ended."""
    metrics.interrupted_after_crash.inc(len(messages))  # the sweep's and an attach's alike
    for message in messages:
        usage = await Usage.objects.filter(message=message).afirst()
        await send_done(
            message.conversation_id,
            message.pk,
            message.status,
            None,
            usage.as_frame() if usage else None,
            message.error,
            recovered=True,
        )


async def recover_one(reply: Message, stale_after: timedelta | None) -> None:
    """End one reply whose process is gone (a stop or attach found nobody to ask), and tell its watchers."""
    recovered = await database_sync_to_async(recover_orphans)(stale_after, only=reply.pk)
    await announce_recovered(recovered)


async def sweep_forever(process: process_loops.Process) -> None:
    """End the streams of processes whose lease expired, and tell their watchers."""
    sweep = database_sync_to_async(recover_orphans, thread_sensitive=False)
    loop, streak = asyncio.get_running_loop(), FailureStreak("orphan sweep failed", "orphan sweep works again")
    while True:
        stop_if_cancelled()
        await asyncio.sleep(settings.CHAT_LEASE_SECONDS / 4)
        # After an outage every lease looks expired: give the others one lease to renew theirs first.
        if process.renewed_since is None or loop.time() - process.renewed_since < settings.CHAT_LEASE_SECONDS:
            continue
        try:
            recovered = await sweep(process_loops.lease())
            if recovered:
                log.warning("marked %d stream(s) of a dead process as interrupted", len(recovered))
            await announce_recovered(recovered)
        except Exception as exc:
            streak.failed(exc)
            continue
        streak.over()


# --- the admin: live and orphaned streams told apart, and ended by hand -----------------------

STAFF_INTERRUPTED = "Marked interrupted by staff: no live process was streaming it."


def live_q(*, usage: bool = False) -> Q:
    """Streaming messages (or usage rows) whose process is alive: their stream runs somewhere.

    Beside other processes (REDIS_URL) a process is alive while its lease is current; alone, the one
    serving process is this one (its lease is not renewed). This process's own replies are live only
    while it runs their stream: one of its own that it does not run is an orphan too.
    """
    mine = Worker.current_id()
    if settings.REDIS_URL:
        alive = Q(worker__heartbeat__gte=timezone.now() - process_loops.lease())
    else:
        alive = Q(worker=mine) if mine is not None else Q(pk__in=[])
    if mine is not None:
        running = running_messages()  # a dict's keys, read from the admin's thread
        reply = Q(message__isnull=False) & ~Q(message__in=running) if usage else ~Q(pk__in=running)
        alive &= ~(Q(worker=mine) & reply)
    return alive


def mark_interrupted(message_ids: list[int], api_usage_ids: list[int]) -> tuple[list[Message], int, int]:
    """End by hand the orphaned ones among these streaming replies and /v1 usage rows.

    Gives (the replies ended, how many /v1 rows, how many were live and skipped).

    A live stream is left to its process (stop it instead): its final save would write over this.
    """
    now = timezone.now()
    chosen = Message.objects.streaming().filter(pk__in=message_ids).exclude(live_q())
    orphans = _end_each(chosen, lambda message: _end(message, Message.Status.INTERRUPTED, STAFF_INTERRUPTED, now))
    rows = Usage.objects.filter(pk__in=api_usage_ids, message__isnull=True, status=Message.Status.STREAMING)
    api = _close_each(
        rows.exclude(live_q(usage=True)),
        status=Message.Status.INTERRUPTED, estimated=True, ended=now, error=STAFF_INTERRUPTED,
    )  # fmt: skip
    price_unpriced(Usage.objects.filter(status=Message.Status.INTERRUPTED, ended=now, cost__isnull=True))
    skipped = len(message_ids) + len(api_usage_ids) - len(orphans) - api
    return orphans, api, skipped
