"""An open stream read into a StreamState: the one loop the chat, /v1 and titles read an upstream with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import httpx

from chat.streaming.sse import LineTooLong, ServerSentEvent, SSEDecoder
from chat.streaming.upstream.errors import UpstreamError
from chat.streaming.upstream.state import DONE, StreamState

# A connection that broke mid-body, as each transport says it (aiohttp's timeouts are caught first).
CUT_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)
READ_TIMEOUTS = (httpx.TimeoutException, aiohttp.ServerTimeoutError)

# Given every event `state` took, in order, with its parsed chunk (None for a comment or [DONE]);
# what it returns, if not None, is awaited before the next event is read.
Forward = Callable[[ServerSentEvent, dict[str, Any] | None], Awaitable[Any] | None]


class UpstreamStream:
    """An open streaming response; `read()` it once."""

    def __init__(
        self, response: httpx.Response, deadline_at: float, *, first_byte_at: float | None = None,
        max_event: int | None = None, idle: float | None = None,
    ) -> None:  # fmt: skip
        self.response = response
        self.deadline_at = deadline_at
        self.first_byte_at = first_byte_at
        self.max_event = max_event
        self.idle = idle  # the between-bytes read timeout, kept by _reads() on aiohttp

    @property
    def request_id(self) -> str | None:
        return self.response.headers.get("x-request-id")

    async def read(
        self, state: StreamState, *, on_text: Callable[[], Any] | None = None, forward: Forward | None = None
    ) -> None:
        """Read the stream into `state` until [DONE] or the end of the body; raise UpstreamError on a failure.

        The failures: a timeout (first byte, between bytes, the deadline), a cut connection (after
        the events that came before it), an event past max_event, too many unreadable events
        (StreamState.parse) and a reply past state.max_reply (after the event that passed it).
        A body that ends without [DONE] is no failure: state.outcome() says how it ended.
        What the caller does with each event: `on_text()` when a chunk added text; `forward`, see Forward.
        """
        decoder = SSEDecoder(self.max_event)
        loop = asyncio.get_running_loop()
        aio = _aiohttp_response(self.response)
        pieces = self.response.aiter_bytes() if aio is None else _reads(aio, self.idle)
        # Bound once: this loop runs for every event of every stream.
        next_piece, decode, clock, deadline_at = pieces.__anext__, decoder.feed, loop.time, self.deadline_at
        parse, feed_chunk = state.parse, state.feed_chunk
        read = next_piece if self.first_byte_at is None else self._first_read(next_piece)
        batch: list[ServerSentEvent] = []
        ended, cut = False, None
        try:
            while True:
                for event in batch:
                    data = event.data
                    if data is None:  # a comment: the upstream's keep-alive
                        if forward is not None and (waiting := forward(event, None)) is not None:
                            await waiting
                        continue
                    if data == DONE:
                        state.done = True
                        if forward is not None and (waiting := forward(event, None)) is not None:
                            await waiting
                        return
                    chunk = parse(data)
                    if chunk is None:
                        continue  # unreadable: skipped and counted
                    content, reasoning = feed_chunk(chunk, clock())
                    if forward is not None and (waiting := forward(event, chunk)) is not None:
                        await waiting
                    if content or reasoning:
                        if on_text is not None:
                            on_text()
                        if state.full:
                            raise state.too_large()
                if ended:
                    break
                if clock() > deadline_at:
                    raise UpstreamError("timeout", "the stream ran past its overall deadline")
                try:
                    batch = decode(await read())
                except StopAsyncIteration:
                    batch, ended = decoder.close(), True
                except READ_TIMEOUTS as exc:
                    raise UpstreamError("timeout", "the upstream sent no data for too long") from exc
                except CUT_ERRORS as exc:
                    # What was complete before the cut is taken first: it may hold the finish or [DONE].
                    batch, ended, cut = decoder.close(), True, exc
                read = next_piece
        except LineTooLong as exc:
            raise UpstreamError("protocol", str(exc)) from None
        finally:
            await pieces.aclose()  # now, not when collected: _reads() stops its timer
        if cut is not None:
            raise UpstreamError("cut", "the upstream connection ended mid-stream") from cut

    def _first_read(self, next_piece: Callable[[], Awaitable[bytes]]) -> Callable[[], Awaitable[bytes]]:
        """The body's first read, within the first-byte timeout (headers came within it already)."""

        async def first() -> bytes:
            try:
                async with asyncio.timeout_at(self.first_byte_at):
                    return await next_piece()
            except TimeoutError:
                raise UpstreamError("timeout", "the upstream sent nothing after the request") from None

        return first


def _aiohttp_response(response: httpx.Response) -> aiohttp.ClientResponse | None:
    """The aiohttp response under an httpx-aiohttp one, or None (the plain httpx transport).

    Read directly, a network read reaches the decoder through one generator instead of
    six (httpx's aiter_bytes, aiter_raw and bound stream, httpx-aiohttp's stream and its
    exception mapping, aiohttp's chunk iterator): about a tenth of a /v1 chunk's CPU.
    The response is still closed through httpx.
    """
    inner = getattr(response.stream, "_stream", None)
    return getattr(inner, "_aiohttp_response", None)


async def _reads(response: aiohttp.ClientResponse, idle: float | None) -> AsyncIterator[bytes]:
    """What arrives, a read at a time, until the body ends; waiting `idle` seconds for a byte times out.

    aiohttp keeps that timeout by cancelling a timer and arming a new one on every network
    read, which costs CPU per chunk and leaves a heap of cancelled timers in the event loop.
    Here its timer is off (as aiohttp does for its own websockets) and one timer per stream,
    when it fires, fails the read if it has been waiting `idle` seconds and
    otherwise re-arms for the rest. As with aiohttp's, time the reader is not waiting (its
    consumer busy, or held back by a slow client) does not count: that is not the peer's.
    """
    reader = response.content
    protocol = None if response.connection is None else response.connection.protocol
    if idle is None or protocol is None:
        while piece := await reader.readany():
            yield piece
        return
    protocol.read_timeout = None  # from its next read on; a timer it armed already may still fire, as ours would
    loop = asyncio.get_running_loop()
    waiting_since: float | None = None

    def check() -> None:
        nonlocal timer
        if waiting_since is not None and loop.time() - waiting_since >= idle:
            reader.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
            return
        timer = loop.call_at((loop.time() if waiting_since is None else waiting_since) + idle, check)

    timer = loop.call_at(loop.time() + idle, check)
    try:
        while True:
            waiting_since = loop.time()
            piece = await reader.readany()
            waiting_since = None
            if not piece:
                return
            yield piece
    finally:
        timer.cancel()
