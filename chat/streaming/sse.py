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


class LineTooLong(ValueError):
    """An event grew past the decoder's cap before its line or its event ended."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the upstream sent an event longer than {limit} bytes")
        self.limit = limit


class SSEDecoder:
    """Incremental decoder: feed() network reads, close() at end of stream.

    max_event caps the bytes of one unfinished event (its lines so far and the line
    being read); past it feed() raises LineTooLong instead of buffering on.
    """

    __slots__ = (
        "_comment", "_cr_pending", "_data", "_event", "_last_id", "_partial", "_partial_len", "_raw",
        "_raw_len", "_retry", "max_event",
    )  # fmt: skip

    def __init__(self, max_event: int | None = None) -> None:
        self.max_event = max_event
        # The unfinished line as the reads that brought it: joined once, when its end
        # arrives, so a long line costs linear time however many reads it spans.
        self._partial: list[bytes] = []
        self._partial_len = 0
        self._cr_pending = False  # the unfinished line ends with CR: maybe half of a CRLF
        self._last_id: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._raw: list[bytes] = []
        self._raw_len = 0
        self._data: list[bytes] = []
        self._event: str | None = None
        self._retry: int | None = None
        self._comment = False

    @property
    def pending(self) -> bytes:
        """Bytes received but not yet part of a dispatched event."""
        return b"".join(self._raw) + b"".join(self._partial)

    def _keep(self, piece: bytes) -> None:
        self._partial.append(piece)
        self._partial_len += len(piece)
        self._check(self._partial_len)

    def _check(self, size: int) -> None:
        if self.max_event is not None and self._raw_len + size > self.max_event:
            raise LineTooLong(self.max_event)

    def _take_partial(self) -> bytes:
        head = b"".join(self._partial) if len(self._partial) > 1 else self._partial[0]
        self._partial, self._partial_len = [], 0
        return head

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode one network read; return the events it completed."""
        events: list[ServerSentEvent] = []
        start, size = 0, len(chunk)
        if not size:
            return events
        if self._cr_pending:
            self._cr_pending = False
            line = self._take_partial()
            if chunk[0] == _LF:
                self._line(line[:-1], line + b"\n", events)
                start = 1
            else:
                self._line(line[:-1], line, events)
        has_cr = b"\r" in chunk
        limit = self.max_event
        while start < size:
            end = chunk.find(b"\n", start)
            if has_cr:
                cr = chunk.find(b"\r", start, end if end != -1 else size)
                if cr != -1:
                    if cr + 1 == size:
                        break  # maybe half of a CRLF: wait for the next read
                    end = cr
            if end == -1:
                break
            following = end + 2 if chunk[end] == _CR and chunk[end + 1] == _LF else end + 1
            if self._partial:
                raw = self._take_partial() + chunk[start:following]
                line = raw[: len(raw) - (following - end)]
            else:
                raw, line = chunk[start:following], chunk[start:end]
            if limit is not None and self._raw_len + len(raw) > limit:
                raise LineTooLong(limit)
            self._line(line, raw, events)
            start = following
        if start < size:
            self._keep(chunk[start:] if start else chunk)
            self._cr_pending = chunk[-1] == _CR
        return events

    def close(self) -> list[ServerSentEvent]:
        """End of stream: dispatch data lines that were complete but never got their blank line.

        A trailing line without its line end is a cut-off fragment and is dropped
        (it stays visible in `pending`).
        """
        events: list[ServerSentEvent] = []
        if self._cr_pending:
            self._cr_pending = False
            line = self._take_partial()
            self._line(line[:-1], line, events)
        if self._data:
            self._line(b"", b"", events)
        return events

    def _line(self, line: bytes, raw: bytes, events: list[ServerSentEvent]) -> None:
        self._raw.append(raw)
        self._raw_len += len(raw)
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
