"""Database work from the event loop, on a few long-lived threads that keep their connections.

Channels' `database_sync_to_async` closes the connection after every call (`CONN_MAX_AGE=0`,
the only safe setting under ASGI, where Django's request threads come and go), and Django
gives each HTTP request a thread of its own. On the path of every stream (its start, its
saves, its final save) that meant a new connection per call (about 0.5 ms of CPU on SQLite,
a new backend on PostgreSQL), a new thread per `/v1` request, and on PostgreSQL one
connection per stream starting at that moment: 400 streams on two processes ran the server
out of connections. Here DATABASE_THREADS threads do that work, each keeping its one
connection, so a process holds at most that many for it; on SQLite the default is one
thread, and stream starts queue in order inside the process instead of polling for the
file's write lock against each other.

A connection is looked at before a call when it has been idle IDLE_CHECK seconds and after
a call that raised a database error; a broken one is closed, so the next call opens a new
one: through an outage each call fails at once (and its caller retries), and the first call
after it works.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.conf import settings
from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")

# A connection idle this long is checked (PostgreSQL: `SELECT 1`) before it is used again.
IDLE_CHECK = 5.0

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_local = threading.local()


def threads() -> int:
    """How many database threads a process runs."""
    return settings.DATABASE_THREADS


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(max_workers=threads(), thread_name_prefix="chat-db")
    return _executor


def run(function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`function`, made awaitable: it runs on a database thread, with the caller's context."""

    @functools.wraps(function)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        context = contextvars.copy_context()  # the language, like sync_to_async
        job = functools.partial(context.run, _call, function, args, kwargs)
        return await asyncio.get_running_loop().run_in_executor(_pool(), job)

    return call


def _call(function, args, kwargs):
    now = time.monotonic()
    if now - getattr(_local, "used", now) > IDLE_CHECK:
        _drop_broken(check=True)
    try:
        return function(*args, **kwargs)
    finally:
        _drop_broken(check=False)
        _local.used = time.monotonic()


def _drop_broken(check: bool) -> None:
    """Close this thread's connections that are broken: all idle ones if `check`, else those that saw an error."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block:
            # A call never leaves a transaction open; if one did, it must not leak into the next call.
            connection.close()
        elif check or connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def close_all() -> None:
    """Close every database thread's connection (tests, before their database is dropped)."""
    if _executor is None:
        return
    count = threads()
    barrier = threading.Barrier(count, timeout=30)

    def close() -> None:
        connections.close_all()
        barrier.wait()  # so each thread takes exactly one of these

    futures = [_executor.submit(close) for _ in range(count)]
    for future in futures:
        future.result()
