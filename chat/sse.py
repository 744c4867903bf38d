"""A server-sent events decoder: bytes in, events out, no I/O.

It follows the WHATWG event-stream rules (LF, CR or CRLF line ends; `:` comments;
`data`, `event`, `id` and `retry` fields; a blank line dispatches) and works on
bytes, so a multi-byte character split across two network reads is never a
problem and the exact bytes of every event stay available for relaying.
"""

from __future__ import annotations

from dataclasses import dataclass

_LF = 0x0A
_CR = 0x0D
_COLON = 0x3A


@dataclass(slots=True, frozen=True)
class ServerSentEvent:
    """One dispatched event; `data` is None for a block of comments only (a keep-alive)."""

    data: bytes | None
    raw: bytes
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental decoder: feed() network reads, close() at end of stream."""

    __slots__ = ("_buffer", "_comment", "_data", "_event", "_last_id", "_raw", "_retry")

    def __init__(self) -> None:
        self._buffer = b""
        self._last_id: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._raw: list[bytes] = []
        self._data: list[bytes] = []
        self._event: str | None = None
        self._retry: int | None = None
        self._comment = False

    @property
    def pending(self) -> bytes:
        """Bytes received but not yet part of a dispatched event."""
        return b"".join(self._raw) + self._buffer

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode one network read; return the events it completed."""
        buf = self._buffer + chunk if self._buffer else chunk
        events: list[ServerSentEvent] = []
        start, size = 0, len(buf)
        has_cr = b"\r" in buf
        while start < size:
            end = buf.find(b"\n", start)
            if has_cr:
                cr = buf.find(b"\r", start, end if end != -1 else size)
                if cr != -1:
                    if cr + 1 == size:
                        break  # maybe half of a CRLF: wait for the next read
                    end = cr
            if end == -1:
                break
            following = end + 2 if buf[end] == _CR and buf[end + 1] == _LF else end + 1
            self._line(buf[start:end], buf[start:following], events)
            start = following
        self._buffer = buf[start:]
        return events

    def close(self) -> list[ServerSentEvent]:
        """End of stream: dispatch data lines that were complete but never got their blank line.

        A trailing line without its line end is a cut-off fragment and is dropped
        (it stays visible in `pending`).
        """
        events: list[ServerSentEvent] = []
        if self._buffer.endswith(b"\r"):
            self._line(self._buffer[:-1], self._buffer, events)
            self._buffer = b""
        if self._data:
            self._line(b"", b"", events)
        return events

    def _line(self, line: bytes, raw: bytes, events: list[ServerSentEvent]) -> None:
        self._raw.append(raw)
        if not line:
            if self._data:
                events.append(
                    ServerSentEvent(
                        data=b"\n".join(self._data),
                        raw=b"".join(self._raw),
                        event=self._event or "message",
                        id=self._last_id,
                        retry=self._retry,
                    )
                )
            elif self._comment:
                events.append(ServerSentEvent(data=None, raw=b"".join(self._raw)))
            self._reset()
            return
        if line[0] == _COLON:
            self._comment = True
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry":
            if value.isdigit():
                self._retry = int(value)
