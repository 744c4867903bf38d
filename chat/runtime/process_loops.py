"""What each serving process runs beside its streams: its lease, and the loops the features add.

Each serving process has, from its start (chatsite.server), one Worker row: a lease, renewed
every CHAT_LEASE_SECONDS/4 by a loop of its own when other processes may share the work
(REDIS_URL). The features add their loops in ChatConfig.ready() (chat/apps.py): the control
listener (chat/runtime/control.py), the orphan sweep, the /v1 progress checkpoints, the
account watch. This module runs them all from the process's first socket or request, once
per event loop; on SQLite it also copies the write-ahead log into the database file every
second, and every MEMORY_TRIM_SECONDS it gives the C library's free memory back to the system.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from chat.models import Worker
from chat.runtime.failures import FailureStreak, every, stop_if_cancelled

log = logging.getLogger(__name__)


def lease() -> timedelta:
    """A worker whose heartbeat is older than this is dead; its streams are orphans."""
    return timedelta(seconds=settings.CHAT_LEASE_SECONDS)


@dataclass
class Process:
    """What this serving process runs beside its streams, per event loop."""

    loop: asyncio.AbstractEventLoop
    worker_id: int
    channel: str
    # loop time since which every lease renewal succeeded (None: the last one failed)
    renewed_since: float | None
    tasks: list[asyncio.Task]


@dataclass(frozen=True)
class Loop:
    """A loop a feature runs in every serving process, started with the process's lease."""

    start: Callable[[Process], Coroutine[Any, Any, None]]
    needs_redis: bool = False  # only where other processes may own streams


_loops: dict[str, Loop] = {}
_process: Process | None = None
_starting: dict[asyncio.AbstractEventLoop, asyncio.Future] = {}


def add_loop(name: str, start: Callable[[Process], Coroutine[Any, Any, None]], *, needs_redis: bool = False) -> None:
    """Run `start(process)` in every serving process from its start (called from ChatConfig.ready())."""
    _loops[name] = Loop(start, needs_redis)


async def ensure_started() -> Process | None:
    """Register this process's lease and start its loops, once per event loop."""
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
    for name, added in _loops.items():
        if settings.REDIS_URL or not added.needs_redis:
            process.tasks.append(loop.create_task(added.start(process), name=name))
    if connection.vendor == "sqlite":
        process.tasks.append(loop.create_task(_checkpoint_wal_forever(), name="wal-checkpoints"))
    trim = malloc_trim() if settings.MEMORY_TRIM_SECONDS > 0 else None
    if trim is not None:
        process.tasks.append(loop.create_task(_trim_memory_forever(trim), name="memory-trim"))
    if settings.REDIS_URL:  # other processes may own streams: keep our lease
        process.tasks.append(loop.create_task(_renew_forever(process), name="lease"))
    _process = process
    return process


def current() -> Process | None:
    """This process's loops on the running event loop (None before ensure_started)."""
    if _process is not None and _process.loop is asyncio.get_running_loop():
        return _process
    return None


def worker_id() -> int | None:
    """This process's worker id on the running loop (None before ensure_started)."""
    process = current()
    return process.worker_id if process is not None else None


async def _renew_forever(process: Process) -> None:
    """Renew this process's lease every CHAT_LEASE_SECONDS/4, in a thread of its own so saves never delay it."""
    renew = database_sync_to_async(Worker.renew, thread_sensitive=False)
    loop, streak = asyncio.get_running_loop(), FailureStreak("cannot renew this process's lease", "lease renewed again")
    while True:
        stop_if_cancelled()
        await asyncio.sleep(settings.CHAT_LEASE_SECONDS / 4)
        try:
            if not await renew(process.worker_id, process.channel):
                log.error("this process's lease row %s had vanished; written again", process.worker_id)
        except Exception as exc:
            process.renewed_since = None
            streak.failed(exc)
            continue
        streak.over()
        if process.renewed_since is None:
            process.renewed_since = loop.time()


# SQLite copies its write-ahead log into the database file (a WAL checkpoint) in the commit that
# leaves the log over `wal_autocheckpoint` pages, and that commit waits for it: with SQLite's
# 1,000, now and then a stream start waited for the copy and its two fsyncs, and so did every
# start queued behind it on the database thread.
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
    checkpoint = database_sync_to_async(lambda: checkpoint_wal(), thread_sensitive=False)
    await every(
        lambda failures: interval,
        checkpoint,
        "cannot checkpoint SQLite's write-ahead log",
        "SQLite's write-ahead log checkpointed again",
    )


# glibc's malloc keeps what the streams' larger objects (their chunks' bytes, their buffers and
# dicts) free inside its heaps, in pieces between blocks still in use, and gives memory back to
# the system only from the top of a heap. Under many streams the memory in use stays flat while
# the free pieces between blocks grow, and the RSS with them (bench/soak.py shows it).
# malloc_trim() returns every free page; on a thread of its own it holds up no stream.


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
    # ctypes lets go of the GIL for the call; on a thread the loop's streams go on meanwhile.
    await every(
        lambda failures: settings.MEMORY_TRIM_SECONDS,
        lambda: asyncio.to_thread(trim, 0),
        "cannot give free memory back to the system",
        "free memory given back again",
    )
