"""Requests to an upstream: a stream (opened here, read in stream.py), a whole answer, the model list."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson

from chat.streaming.upstream.errors import UpstreamError, describe_error_body, scrub
from chat.streaming.upstream.stream import UpstreamStream

MAX_ERROR_BODY = 64 * 1024


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
    request, on every stream's start. A URL is immutable, so one serves every request."""
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
    # The OS's words ("Connection refused"), not the connector's, which name the upstream's address and port:
    # the sentence reaches the person on the page.
    error = getattr(cause, "os_error", None) or cause or exc
    errno = getattr(error, "errno", None)
    reason = os.strerror(errno) if errno else getattr(error, "strerror", None) or type(error).__name__
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
    path: str = "chat/completions",
) -> Answer:
    """A non-streaming POST (a chat completion, else to `path`); UpstreamError on an error status or past max_bytes."""
    request = client.build_request(
        "POST",
        endpoint(base_url, path),
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
    return [item["id"] for item in await list_model_items(client, base_url, api_key, timeouts)]


async def list_model_items(
    client: httpx.AsyncClient, base_url: str, api_key: str, timeouts: Timeouts = Timeouts()
) -> list[dict[str, Any]]:
    """The model objects (each with a string `id`) from the upstream's GET /models, as it sent them."""
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
        return [item for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    except (orjson.JSONDecodeError, AttributeError) as exc:
        raise UpstreamError("protocol", "the model list is not OpenAI's list shape") from exc
