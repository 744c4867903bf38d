"""What each serving process runs beside its streams: its lease, its control listener, the orphan sweep.

Each serving process has, from its start (chatsite.server), one Worker row (a lease,
renewed every CHAT_LEASE_SECONDS/4 by a loop of its own) and ONE control listener on a
process-wide channel, started once and never cancelled while the process serves: every
streaming row records its worker, so a socket on any process sends `stop` and `snapshot`
requests to the owner's channel with the message id, and the listener routes them to the
running stream. A per-stream listener cancelled at the end of each stream would, on
channels-redis, drop whatever message its BZPOPMIN had just popped (channels-redis #151,
#165); chat/layers.py also makes every receive cancel-safe. With several processes
(REDIS_URL), each one sweeps for streams whose worker's lease expired, marks them
interrupted with estimated usage and tells their watchers with `done`.
Every API_CHECKPOINT_SECONDS each process writes its /v1 streams' tokens so far on their
usage rows, which is what such a sweep keeps of them (/v1 keeps no text to estimate from).
On SQLite it also copies the write-ahead log into the database file every second, so that no
stream start has to. Every MEMORY_TRIM_SECONDS it gives the C library's free memory back to
the system.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from . import db, relay, sessions
from .generation import Generation, running_generation, running_users, send_done, stop_user, track
from .models import Message, Usage, Worker

log = logging.getLogger(__name__)


def lease() -> timedelta:
    """A worker whose heartbeat is older than this is dead; its streams are orphans."""
    return timedelta(seconds=settings.CHAT_LEASE_SECONDS)


# --- orphans ------------------------------------------------------------------


async def announce_recovered(messages: list[Message]) -> None:
    """Tell sockets watching a recovered conversation that its stream ended."""
    for message in messages:
        usage = await Usage.objects.filter(message=message).afirst()
        await send_done(
            message.conversation_id,
            message.pk,
            message.status,
            None,
            usage.as_frame() if usage else None,
            message.error,
        )


# --- the process: its lease, its control listener, its sweep -------------------


@dataclass
class Process:
    """What this serving process runs beside its streams, per event loop."""

    loop: asyncio.AbstractEventLoop
    worker_id: int
    channel: str
    # loop time since which every lease renewal succeeded (None: the last one failed)
    renewed_since: float | None
    tasks: list[asyncio.Task]


_process: Process | None = None
_starting: dict[asyncio.AbstractEventLoop, asyncio.Future] = {}


async def ensure_started() -> Process | None:
    """Register this process's lease and start its control listener (and, with Redis, lease and sweep) once."""
    loop = asyncio.get_running_loop()
    if _process is not None and _process.loop is loop:
        return _process
    starting = _starting.get(loop)
    if starting is None:
        starting = _starting[loop] = loop.create_task(_start(loop))
        starting.add_done_callback(lambda _: _starting.pop(loop, None))
    return await asyncio.shield(starting)


async def _start(loop: asyncio.AbstractEventLoop) -> Process | None:
    global _process
    channel = await get_channel_layer().new_channel()
    try:
        # Off the thread every socket's database work shares: a locked SQLite must not stall them all here.
        worker = await database_sync_to_async(Worker.register, thread_sensitive=False)(channel)
    except Exception as exc:
        log.error("cannot register this process's lease (%s); will try again with the next socket", exc)
        return None
    process = Process(loop, worker.pk, channel, loop.time(), [])
    process.tasks.append(loop.create_task(_listen_forever(channel), name="control-listener"))
    process.tasks.append(loop.create_task(_watch_accounts_forever(), name="account-watch"))
    process.tasks.append(loop.create_task(_checkpoint_forever(), name="api-checkpoints"))
    if connection.vendor == "sqlite":
        process.tasks.append(loop.create_task(_checkpoint_wal_forever(), name="wal-checkpoints"))
    trim = malloc_trim() if settings.MEMORY_TRIM_SECONDS > 0 else None
    if trim is not None:
        process.tasks.append(loop.create_task(_trim_memory_forever(trim), name="memory-trim"))
    if settings.REDIS_URL:  # other processes may own streams: keep our lease, sweep theirs
        process.tasks.append(loop.create_task(_renew_forever(process), name="lease"))
        process.tasks.append(loop.create_task(_sweep_forever(process), name="orphan-sweeper"))
    _process = process
    return process


def worker_id() -> int | None:
    """This process's worker id on the running loop (None before ensure_started)."""
    if _process is not None and _process.loop is asyncio.get_running_loop():
        return _process.worker_id
    return None


class Outage:
    """A loop's run of failures: logged at the first and when it ends, not at every retry."""

    def __init__(self, failing: str, again: str) -> None:
        self.failing, self.again, self.failures = failing, again, 0

    def failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("%s (%s); retrying", self.failing, exc)

    def over(self) -> None:
        if self.failures:
            log.warning("%s after %d failure(s)", self.again, self.failures)
            self.failures = 0


async def _listen_forever(channel: str) -> None:
    """The process's control listener: never cancelled while it serves, survives layer errors."""
    layer = get_channel_layer()
    outage = Outage("control listener: cannot receive", "control listener: receiving again")
    while True:
        try:
            request = await layer.receive(channel)
        except Exception as exc:
            outage.failed(exc)
            await asyncio.sleep(min(0.2 * 2**outage.failures, 5.0))
            continue
        outage.over()
        if request.get("type") == USER_ENDED:
            end_local_streams(request["user"])
            continue
        generation = running_generation(request.get("message"))
        if generation is None:
            continue  # it ended; its `done` reaches the sockets through the conversation group
        track(asyncio.create_task(_handle(generation, request)))


async def _handle(generation: Generation, request: dict) -> None:
    try:
        await generation.handle(request)
    except Exception:
        log.exception("generation %s: control request %s failed", generation.job.message_id, request.get("type"))


def control_request(kind: str, message_id: int, **fields: Any) -> dict:
    """A `stop` or `snapshot` request for the process streaming message_id."""
    return {"type": f"generation.{kind}", "message": message_id, **fields}


async def send_control(reply: Message, kind: str, **fields: Any) -> bool:
    """Send a control request to the process streaming `reply` (worker loaded); False when it is dead.

    A reply whose process is dead is marked interrupted here and now, and its
    watchers get `done`: nobody is left to answer.
    """
    local = running_generation(reply.pk)
    if local is not None:  # streamed here: no need to go through the layer
        track(asyncio.create_task(_handle(local, control_request(kind, reply.pk, **fields))))
        return True
    worker = reply.worker
    if worker is not None and worker.is_alive(lease()):
        process = _process if _process is not None and _process.loop is asyncio.get_running_loop() else None
        if process is None or worker.pk != process.worker_id:
            await get_channel_layer().send(worker.channel, control_request(kind, reply.pk, **fields))
            return True
        # our own lease, but no such stream here: it has just ended, its `done` is on its way
        return True
    if worker is None and settings.REDIS_URL:
        return True  # a process that could not register its lease: nobody to ask, the sweep cannot tell
    stale_after = lease() if worker is not None else None  # without Redis, one process: ours
    recovered = await database_sync_to_async(Message.objects.recover_orphans)(stale_after, only=reply.pk)
    await announce_recovered(recovered)
    return False


async def _renew_forever(process: Process) -> None:
    """Renew this process's lease every CHAT_LEASE_SECONDS/4, in a thread of its own so saves never delay it."""
    renew = database_sync_to_async(Worker.renew, thread_sensitive=False)
    loop, outage = asyncio.get_running_loop(), Outage("cannot renew this process's lease", "lease renewed again")
    while True:
        await asyncio.sleep(settings.CHAT_LEASE_SECONDS / 4)
        try:
            if not await renew(process.worker_id, process.channel):
                log.error("this process's lease row %s had vanished; written again", process.worker_id)
        except Exception as exc:
            process.renewed_since = None
            outage.failed(exc)
            continue
        outage.over()
        if process.renewed_since is None:
            process.renewed_since = loop.time()


async def _checkpoint_forever() -> None:
    """Write the /v1 streams' tokens so far on their usage rows every API_CHECKPOINT_SECONDS.

    /v1 keeps no text: without this, a stream whose process dies is swept with no completion
    tokens. One transaction for all of this process's streams, none per token.
    """
    write = db.run(Usage.objects.checkpoint)
    loop = asyncio.get_running_loop()
    outage = Outage("cannot write the API streams' progress", "API streams' progress written again")
    while True:
        interval = settings.API_CHECKPOINT_SECONDS
        await asyncio.sleep(min(interval * 2**outage.failures, max(interval, 60.0)))
        try:
            await relay.running.checkpoint(write, loop.time())
        except Exception as exc:
            outage.failed(exc)
            continue
        outage.over()


# SQLite copies its write-ahead log into the database file (a WAL checkpoint) in the commit that
# leaves the log over `wal_autocheckpoint` pages, and that commit waits for it: with SQLite's
# 1,000, one stream start in about thirty waited 15 to 25 ms for the copy and its two fsyncs,
# ahead of every start queued behind it on the database thread (bench/compare.py's bursts of 10).
# This loop does it every second, on a thread of its own that the GIL does not hold during the
# copy; the settings raise the commits' threshold to 10,000 pages, a backstop for when it cannot.
WAL_CHECKPOINT_SECONDS = 1.0


def checkpoint_wal() -> tuple[int, int, int]:
    """Copy what it can of SQLite's write-ahead log into the database file, waiting for nobody.

    SQLite's (busy, frames in the log, frames copied).
    """
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return cursor.fetchone()


async def _checkpoint_wal_forever(interval: float = WAL_CHECKPOINT_SECONDS) -> None:
    """Checkpoint SQLite's write-ahead log every `interval` seconds, off the streams' database thread."""
    checkpoint = database_sync_to_async(checkpoint_wal, thread_sensitive=False)
    outage = Outage("cannot checkpoint SQLite's write-ahead log", "SQLite's write-ahead log checkpointed again")
    while True:
        await asyncio.sleep(interval)
        try:
            await checkpoint()
        except Exception as exc:
            outage.failed(exc)
            continue
        outage.over()


# glibc's malloc keeps what the streams' larger objects (their chunks' bytes, their buffers and
# dicts) free inside its heaps, in pieces between blocks still in use, and gives memory back to
# the system only from the top of a heap. Under bench/soak.py's 200 streams the memory in use
# stayed flat (28-32 MiB) while the free pieces grew from 4 to 10 MiB, and the RSS with them:
# +1.5 then +0.7 MiB per 3-minute round. malloc_trim() returns every free page, in 1-15 ms on
# a thread of its own; every 10 s, the rounds' ends came out level (-1.2 MiB).


def malloc_trim():
    """glibc's malloc_trim(), or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


async def _trim_memory_forever(trim) -> None:
    """Give the C library's free memory back to the system with `trim` every MEMORY_TRIM_SECONDS, off the loop."""
    outage = Outage("cannot give free memory back to the system", "free memory given back again")
    while True:
        await asyncio.sleep(settings.MEMORY_TRIM_SECONDS)
        try:
            # ctypes lets go of the GIL for the call; on a thread the loop's streams go on meanwhile.
            await asyncio.to_thread(trim, 0)
        except Exception as exc:
            outage.failed(exc)
            continue
        outage.over()


async def _sweep_forever(process: Process) -> None:
    """End the streams of processes whose lease expired, and tell their watchers."""
    sweep = database_sync_to_async(Message.objects.recover_orphans, thread_sensitive=False)
    loop, outage = asyncio.get_running_loop(), Outage("orphan sweep failed", "orphan sweep works again")
    while True:
        await asyncio.sleep(settings.CHAT_LEASE_SECONDS / 4)
        # After an outage every lease looks expired: give the others one lease to renew theirs first.
        if process.renewed_since is None or loop.time() - process.renewed_since < settings.CHAT_LEASE_SECONDS:
            continue
        try:
            recovered = await sweep(lease())
            if recovered:
                log.warning("marked %d stream(s) of a dead process as interrupted", len(recovered))
            await announce_recovered(recovered)
        except Exception as exc:
            outage.failed(exc)
            continue
        outage.over()


# --- a deactivated user's streams -------------------------------------------------

USER_ENDED = "user.ended"
DEACTIVATED = "the account was deactivated"


def end_user_streams(user_id: int) -> None:
    """Ask every serving process to stop this user's running streams, chat and `/v1` alike (sync code).

    With REDIS_URL every process with a current lease is told through its control channel.
    Without it there is one serving process, reachable only from inside it: from the admin
    it is told, from a management command (another process) it cannot be, and then the
    user's sockets are closed at their next frame and their streams run to their end.
    """
    if settings.REDIS_URL:
        channels = list(Worker.objects.alive(lease()).values_list("channel", flat=True))
    else:
        channels = None  # this process's own, if it serves (looked up on its loop)

    async def tell() -> None:
        targets = channels
        if targets is None:
            here = _process is not None and _process.loop is asyncio.get_running_loop()
            targets = [_process.channel] if here else []
        layer = get_channel_layer()
        for channel in targets:
            await layer.send(channel, {"type": USER_ENDED, "user": user_id})

    try:
        async_to_sync(tell)()
    except Exception as exc:  # the deactivation itself stands; their streams run to their end
        log.warning("could not ask the processes to stop user %s's streams: %r", user_id, exc)


async def _watch_accounts_forever() -> None:
    """Every CHAT_ACCOUNT_CHECK_SECONDS: sign out here the users with a socket or a stream on this process
    who were deactivated or deleted meanwhile, whatever did it.

    The admin tells every process at once (end_user_streams); this catches the rest: a
    `manage.py deactivate` from another process without Redis, a bulk UPDATE. One query
    a second, and only while someone is connected; a database error is logged and retried.
    """
    outage = Outage("cannot check whether connected accounts are still active", "checking connected accounts again")
    while True:
        await asyncio.sleep(settings.CHAT_ACCOUNT_CHECK_SECONDS)
        present = sessions.connected_users() | relay.running.owners() | running_users()
        if not present:
            continue
        try:
            active = await database_sync_to_async(_active_users, thread_sensitive=False)(present)
        except Exception as exc:
            outage.failed(exc)
            continue
        outage.over()
        for user_id in present - active:
            end_local_streams(user_id)
            event = {"type": sessions.CHECK_EVENT, "ended": None}  # each socket finds its session gone
            try:
                await get_channel_layer().group_send(sessions.user_group(user_id), event)
            except Exception as exc:  # their sockets re-check at their next frame anyway
                log.warning("could not tell user %s's sockets to re-check their session: %r", user_id, exc)


def _active_users(ids: set[int]) -> set[int]:
    return set(get_user_model().objects.filter(pk__in=ids, is_active=True).values_list("pk", flat=True))


def end_local_streams(user_id: int) -> None:
    """Stop this process's streams of one user: chat generations and `/v1` relays."""
    stopped = stop_user(user_id) + relay.running.interrupt(DEACTIVATED, owner=user_id)
    if stopped:
        log.info("stopped %d stream(s) of deactivated user %s", stopped, user_id)
