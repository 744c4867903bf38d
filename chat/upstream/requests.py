"""Requests to an upstream: a stream read as SSE events as they arrive, a whole answer, the model list."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson

from ..sse import LineTooLong, ServerSentEvent, SSEDecoder
from .errors import UpstreamError, describe_error_body, scrub

MAX_ERROR_BODY = 64 * 1024
# A connection that broke mid-body, as each transport says it (aiohttp's timeouts are caught first).
CUT_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)


@dataclass(slots=True, frozen=True)
class Timeouts:
    """Connect, first-byte and between-bytes read timeouts plus an overall deadline, in seconds.

    first_byte bounds the wait from sending a streaming request to the first byte of
    its body (headers included): a dead upstream is noticed in a minute, not in `read`.
    """

    connect: float = 10.0
    read: float = 300.0
    deadline: float = 1800.0
    first_byte: float = 60.0

    def for_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.read, write=self.connect, pool=self.connect)


# --- requests -----------------------------------------------------------------


def _headers(api_key: str, *, stream: bool) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if stream:
        headers["Accept"] = "text/event-stream"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


@functools.lru_cache(maxsize=256)
def endpoint(base_url: str, path: str) -> httpx.URL:
    """`path` under `base_url`, parsed once per process: httpx parses a URL given as a string on every
    request, 30 µs of a stream start's CPU. A URL is immutable, so one serves every request."""
    return httpx.URL(base_url.rstrip("/") + "/" + path.lstrip("/"))


def build_payload(
    model: str,
    messages: list[dict[str, Any]],
    params: dict[str, Any] | None = None,
    *,
    max_tokens: int = 8192,
) -> dict[str, Any]:
    """A streaming request body: explicit max_tokens (i14 stops at 100 otherwise) and usage asked for."""
    payload: dict[str, Any] = {"model": model, "messages": messages, **(params or {})}
    payload.setdefault("max_tokens", max_tokens)
    payload["stream"] = True
    payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    return payload


async def _send(client: httpx.AsyncClient, request: httpx.Request, *, stream: bool) -> httpx.Response:
    """Send, once more if the connection broke before any response.

    Upstreams close idle keep-alive connections on their own schedule, and a request
    written to one just closed fails with no answer at all. Sending it again on a new
    connection is what the OpenAI SDKs do too; timeouts and refused connections are
    not retried.
    """
    try:
        return await client.send(request, stream=stream)
    except httpx.HTTPError as exc:
        if not _broken_connection(exc):
            raise _request_failed(exc) from exc
    try:
        return await client.send(request, stream=stream)
    except httpx.HTTPError as exc:
        raise _request_failed(exc) from exc


def _timed_out(exc: httpx.HTTPError) -> bool:
    """A real timeout. httpx-aiohttp reports every aiohttp connection error as ConnectTimeout,
    so the aiohttp exception behind it decides."""
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientConnectionError):
        return isinstance(cause, aiohttp.ServerTimeoutError)
    return isinstance(exc, httpx.TimeoutException)


def _broken_connection(exc: httpx.HTTPError) -> bool:
    """The connection broke after it was made (not a timeout, not a refused connection)."""
    if _timed_out(exc):
        return False
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientConnectionError):
        return not isinstance(cause, aiohttp.ClientConnectorError)
    return isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError)


def _request_failed(exc: httpx.HTTPError) -> UpstreamError:
    """A timeout or a connection failure before any response."""
    cause = exc.__cause__
    if _timed_out(exc):
        return UpstreamError("timeout", "the upstream did not answer in time")
    reason = getattr(cause, "strerror", None) or getattr(exc, "strerror", None) or type(cause or exc).__name__
    return UpstreamError("connect", f"cannot connect ({reason})")


async def _error_from(response: httpx.Response, api_key: str) -> UpstreamError:
    body = b""
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) >= MAX_ERROR_BODY:
            break
    return _http_error(response, body[:MAX_ERROR_BODY], api_key)


def _http_error(response: httpx.Response, body: bytes, api_key: str) -> UpstreamError:
    """An error status as an UpstreamError whose message and body carry no secret and no HTML."""
    text = scrub(body.decode("utf-8", "replace"), [api_key])
    message, code = describe_error_body(text, response.reason_phrase or "error")
    return UpstreamError(
        "http", message, status=response.status_code, code=code, body=text.encode(), headers=response.headers
    )


class UpstreamStream:
    """An open streaming response; iterate `events()` once."""

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

    async def events(self) -> AsyncIterator[ServerSentEvent]:
        """Every SSE event (comment-only blocks included) as it arrives."""
        decoder = SSEDecoder(self.max_event)
        loop = asyncio.get_running_loop()
        aio = _aiohttp_response(self.response)
        pieces = self.response.aiter_bytes() if aio is None else _reads(aio, self.idle)
        try:
            if self.first_byte_at is not None:
                try:
                    async with asyncio.timeout_at(self.first_byte_at):
                        first = await anext(pieces, b"")
                except TimeoutError:
                    raise UpstreamError("timeout", "the upstream sent nothing after the request") from None
                for event in decoder.feed(first):
                    yield event
            async for piece in pieces:
                for event in decoder.feed(piece):
                    yield event
                if loop.time() > self.deadline_at:
                    raise UpstreamError("timeout", "the stream ran past its overall deadline")
        except LineTooLong as exc:
            raise UpstreamError("protocol", str(exc)) from None
        except (httpx.TimeoutException, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamError("timeout", "the upstream sent no data for too long") from exc
        except CUT_ERRORS as exc:
            for event in decoder.close():
                yield event
            raise UpstreamError("cut", "the upstream connection ended mid-stream") from exc
        finally:
            await pieces.aclose()  # now, not when collected: _reads() stops its timer
        for event in decoder.close():
            yield event


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
    read: 4 % of a websocket chunk's CPU in py-spy, and a heap of cancelled timers in the
    event loop. Here its timer is off (as aiohttp does for its own websockets) and one timer
    per stream, when it fires, fails the read if it has been waiting `idle` seconds and
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


@asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient,
    base_url: str,
    api_key: str,
    payload: dict[str, Any],
    timeouts: Timeouts = Timeouts(),
    *,
    max_event: int | None = None,
) -> AsyncIterator[UpstreamStream]:
    """POST a streaming chat completion; raise UpstreamError for any failure before the first byte.

    max_event caps one SSE event (in practice one `data:` line), in bytes.
    """
    now = asyncio.get_running_loop().time()
    deadline_at = now + timeouts.deadline
    first_byte_at = now + timeouts.first_byte
    request = client.build_request(
        "POST",
        endpoint(base_url, "chat/completions"),
        content=orjson.dumps(payload),
        headers=_headers(api_key, stream=True),
        timeout=timeouts.for_httpx(),
    )
    try:
        async with asyncio.timeout_at(first_byte_at):
            response = await _send(client, request, stream=True)
    except TimeoutError:
        raise UpstreamError("timeout", "the upstream did not answer in time") from None
    try:
        if response.status_code >= 400:
            raise await _error_from(response, api_key)
        yield UpstreamStream(
            response, deadline_at, first_byte_at=first_byte_at, max_event=max_event, idle=timeouts.read
        )
    finally:
        await response.aclose()


@dataclass(slots=True, frozen=True)
class Answer:
    """A whole (non-stream) response, read up to a size cap."""

    status_code: int
    headers: httpx.Headers
    content: bytes


async def _read_capped(response: httpx.Response, limit: int | None, what: str) -> bytes:
    """The body, or a too_large error as soon as it passes `limit` bytes (never buffered whole)."""
    pieces: list[bytes] = []
    size = 0
    try:
        async for piece in response.aiter_bytes():
            size += len(piece)
            if limit is not None and size > limit:
                raise UpstreamError("too_large", f"{what} is larger than {limit} bytes")
            pieces.append(piece)
    except httpx.TimeoutException as exc:
        raise UpstreamError("timeout", "the upstream sent no data for too long") from exc
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        raise UpstreamError("cut", "the upstream connection ended mid-response") from exc
    return b"".join(pieces)


async def post_json(
    client: httpx.AsyncClient,
    base_url: str,
    api_key: str,
    payload: dict[str, Any],
    timeouts: Timeouts = Timeouts(),
    *,
    max_bytes: int | None = None,
) -> Answer:
    """A non-streaming chat completion; raise UpstreamError on an error status or past max_bytes."""
    request = client.build_request(
        "POST",
        endpoint(base_url, "chat/completions"),
        content=orjson.dumps(payload),
        headers=_headers(api_key, stream=False),
        timeout=httpx.Timeout(timeouts.read, connect=timeouts.connect),
    )
    response = await _send(client, request, stream=True)
    try:
        if response.status_code >= 400:
            raise await _error_from(response, api_key)
        content = await _read_capped(response, max_bytes, "the upstream's response")
    finally:
        await response.aclose()
    return Answer(response.status_code, response.headers, content)


MAX_MODEL_LIST = 4 * 1024 * 1024


async def list_models(
    client: httpx.AsyncClient, base_url: str, api_key: str, timeouts: Timeouts = Timeouts()
) -> list[str]:
    """The model ids from the upstream's GET /models."""
    request = client.build_request(
        "GET",
        endpoint(base_url, "models"),
        headers=_headers(api_key, stream=False),
        timeout=httpx.Timeout(timeouts.connect * 2, connect=timeouts.connect),
    )
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise _request_failed(exc) from exc
    try:
        if response.status_code >= 400:
            raise await _error_from(response, api_key)
        content = await _read_capped(response, MAX_MODEL_LIST, "the model list")
    finally:
        await response.aclose()
    try:
        data = orjson.loads(content).get("data", [])
        return [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    except (orjson.JSONDecodeError, AttributeError) as exc:
        raise UpstreamError("protocol", "the model list is not OpenAI's list shape") from exc
