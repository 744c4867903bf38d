"""A long-lived loop's failures: logged when a streak begins and when it ends, never at every retry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


def stop_if_cancelled() -> None:
    """Raise CancelledError in a forever-loop whose task was cancelled, even if the cancellation was lost.

    On Python 3.11, asyncio.wait_for returns its inner future's result when the cancellation comes
    as that future ends (python/cpython#86296, fixed in 3.12), and redis-py's writes go through it:
    the loop went on, and whoever awaited its end (a shutdown, a test's event loop) waited forever.
    The task's cancelling() count still says it was asked to stop.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class FailureStreak:
    """A loop's run of failures: one line at the first, one when it ends."""

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


async def every(
    interval: Callable[[int], float], step: Callable[[], Awaitable[object]], failing: str, again: str
) -> None:
    """Await `step()` forever, `interval(failures so far)` seconds apart; a failure is logged and retried."""
    streak = FailureStreak(failing, again)
    while True:
        stop_if_cancelled()
        await asyncio.sleep(interval(streak.failures))
        try:
            await step()
        except Exception as exc:
            streak.failed(exc)
            continue
        streak.over()
