"""One piece of work in flight per key: callers that miss a cache together share it (no stampede)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

# (key, event loop) -> the work under way: a future belongs to the loop that made it.
_running: dict[tuple, asyncio.Future] = {}


async def shared(key: Hashable, work: Callable[[], Awaitable[T]]) -> T:
    """`work()`'s result; while one for `key` runs on this event loop, a caller awaits that one instead.

    Shielded: a caller that goes away (a closed tab, a cancelled request) does not cancel the
    work the others wait for.
    """
    running = (key, asyncio.get_running_loop())
    future = _running.get(running)
    if future is None:
        future = _running[running] = asyncio.ensure_future(work())
        future.add_done_callback(lambda _: _running.pop(running, None))
    return await asyncio.shield(future)
