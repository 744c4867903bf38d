"""What the fake keeps about each chat/completions request, for tests in other threads to read."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class StreamRecord:
    """What the fake saw and did for one chat/completions request."""

    dialect: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    sent_at: list[float] = field(default_factory=list)  # one per data: event, [DONE] included
    sent: list[bytes] = field(default_factory=list)  # exact bytes of each data: event
    disconnected_at: float | None = None
    # threading.Events, not asyncio ones: the tests wait on them from another thread than the server's.
    disconnected: threading.Event = field(default_factory=threading.Event)
    completed: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)  # [[hold:N]]: the test lets it go on
    # Extras, handy for assertions.
    id: str = ""  # completion id (for infyrence also the X-Request-Id)
    model: str | None = None
    stream: bool = False
    status: int | None = None  # HTTP status sent
    directives: dict[str, str] = field(default_factory=dict)
    finish_reason: str | None = None  # None when the stream was faulted/cut
    comments: list[bytes] = field(default_factory=list)  # SSE comment lines written

    def text(self) -> bytes:
        """All data: events joined (comments excluded)."""
        return b"".join(self.sent)


class ConnectionState:
    """Whether the client has gone, and whether the answer ended before it did."""

    __slots__ = ("disconnected", "ended")

    def __init__(self) -> None:
        self.disconnected = False
        self.ended = False


def mark_disconnected(record: StreamRecord, state: ConnectionState) -> None:
    """Note, once, that the client left before the answer ended."""
    if not state.disconnected:
        state.disconnected = True
        record.disconnected_at = time.monotonic()
        record.disconnected.set()
