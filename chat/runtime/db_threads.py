"""Database work from the event loop, on a few long-lived threads that keep their connections.

Channels' `database_sync_to_async` closes the connection after every call (`CONN_MAX_AGE=0`,
the only safe setting under ASGI, where Django's request threads come and go), and Django
gives each HTTP request a thread of its own. On the path of every stream (its start, its
saves, its final save) that meant a new connection per call (a new backend on PostgreSQL),
a new thread per `/v1` request, and on PostgreSQL one connection per stream starting at that
moment: a burst of streams could run the server out of connections. Here DATABASE_THREADS
threads do that work, each keeping its one connection, so a process holds at most that many
for it; on SQLite the default is one thread, and stream starts queue in order inside the
process instead of polling for the file's write lock against each other.

A connection is looked at before a call when it has been idle IDLE_CHECK seconds, when its
socket has something to read while it is idle (the server or a proxy closed it: an idle
connection is sent nothing else), and after a call that raised a database error; a broken one
is closed, so the next call opens a new one: through an outage each call fails at once (and its
caller retries), and the first call after it works.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import queue
import select
import threading
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from django.conf import settings
from django.db import connections
from django.utils import translation

from chat.runtime import metrics

P = ParamSpec("P")
R = TypeVar("R")

# A connection idle this long is checked (PostgreSQL: `SELECT 1`) before it is used again.
IDLE_CHECK = 5.0

# Calls wait in a queue and a thread resolves each caller's future on its loop, instead of going through
# ThreadPoolExecutor and run_in_executor: their hand-off (a concurrent future with its condition, a chained
# asyncio future, a callback to copy the state back) cost more than twice this queue's, and every
# stream makes several calls (docs/decisions/0003-database-threads.md).
_jobs: queue.SimpleQueue = queue.SimpleQueue()
_workers: list[threading.Thread] = []
_lock = threading.Lock()
_local = threading.local()


def threads() -> int:
    """How many database threads a process runs."""
    return settings.DATABASE_THREADS


def run(function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`function`, made awaitable: it runs on a database thread, with the caller's context."""

    @functools.wraps(function)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        if not _workers:
            _start_workers()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        # The call runs in a copy of the caller's context; the active language must be carried apart.
        language = translation.get_language()
        work = function if language == settings.LANGUAGE_CODE else functools.partial(_in_language, language, function)
        _jobs.put((loop, future, contextvars.copy_context(), work, args, kwargs, time.monotonic()))
        return await future

    return call


def _in_language(language: str, function, *args, **kwargs):
    """`function` with the caller's language active: a refusal worded here (a budget used up, a model not allowed)
    is in the language of the page or client that asked. Django keeps the active language in an asgiref Local,
    whose value a copied context does not carry to another thread (asgiref 3.8+: only its own sync_to_async does).
    """
    with translation.override(language):
        return function(*args, **kwargs)


def _start_workers() -> None:
    with _lock:
        while len(_workers) < threads():  # read once: a process keeps the threads it started with
            worker = threading.Thread(target=_work, name=f"chat-db_{len(_workers)}", daemon=True)
            worker.start()
            _workers.append(worker)


def _work() -> None:
    while (job := _jobs.get()) is not None:
        loop, future, context, function, args, kwargs, queued = job
        if future is not None and future.cancelled():
            continue  # its caller stopped waiting before the work began: it is not done
        metrics.db_thread_wait_seconds.observe(time.monotonic() - queued)
        try:
            result, error = context.run(_call, function, args, kwargs), None
        except BaseException as exc:  # handed to the caller, as an executor does
            result, error = None, exc
        if loop is not None:
            _resolve(loop, future, result, error)
        # Nothing of a call (its function and arguments, its result, an exception's frames) is held by an
        # idle thread: a final save's arguments hold a whole request body.
        job = loop = future = context = function = args = kwargs = result = error = None


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result, exc: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, exc)
    except RuntimeError:  # the loop closed while the call ran: nobody is waiting for it
        pass


def _settle(future: asyncio.Future, result, exc: BaseException | None) -> None:
    if future.cancelled():  # the caller gave up while the work ran; it ran to its end all the same
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


@atexit.register
def _stop_workers() -> None:
    """At exit, a call under way finishes (a save is not cut in half); queued ones have nobody waiting."""
    for _ in _workers:
        _jobs.put(None)
    for worker in _workers:
        worker.join(timeout=30)


def _call(function, args, kwargs):
    now = time.monotonic()
    _drop_broken(check=now - getattr(_local, "used", now) > IDLE_CHECK, before=True)
    try:
        return function(*args, **kwargs)
    finally:
        _drop_broken(check=False, before=False)
        _local.used = time.monotonic()


def _drop_broken(check: bool, before: bool) -> None:
    """Close this thread's connections that are broken: all idle ones if `check`, else those that saw an error
    and, `before` a call, those whose server hung up (after a call, the call itself would have seen it)."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block:
            # A call never leaves a transaction open; if one did, it must not leak into the next call.
            connection.close()
        elif check or connection.errors_occurred or (before and _peer_closed(connection.connection)):
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def _peer_closed(raw) -> bool:
    """Whether an idle connection's socket is readable: the server hung up (no LISTEN here sends anything else)."""
    fileno = getattr(raw, "fileno", None)  # psycopg's connections have one, sqlite3's do not
    if fileno is None:
        return False
    try:
        readable, _, _ = select.select([fileno()], [], [], 0)
    except (OSError, ValueError):  # already closed
        return True
    return bool(readable)


def close_all() -> None:
    """Close every database thread's connection (tests, before their database is dropped)."""
    count = len(_workers)
    if not count:
        return
    barrier = threading.Barrier(count, timeout=30)
    done = queue.SimpleQueue()

    def close() -> None:
        try:
            connections.close_all()
            barrier.wait()  # so each thread takes exactly one of these
        finally:
            done.put(None)

    for _ in range(count):
        _jobs.put((None, None, contextvars.copy_context(), close, (), {}, time.monotonic()))
    for _ in range(count):
        done.get(timeout=60)
