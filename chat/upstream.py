"""Streaming client for OpenAI-compatible chat completion upstreams (no Django here).

Three dialects are understood (README, "Providers"): i14 (reasoning in
`delta.reasoning_content`, a usage-only chunk with `choices: []`, `x_i14_perf`),
api14 (reasoning in `delta.reasoning`, usage with `cost` on the finish chunk,
`:` keep-alive comments, mid-stream errors as a chunk with `error` and
`finish_reason: "error"`) and infyrence (mid-stream errors as `data: {"error": ...}`
followed by `[DONE]`, `X-Request-Id`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
import socket
import time
import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson

from .sse import LineTooLong, ServerSentEvent, SSEDecoder

log = logging.getLogger(__name__)

DONE = b"[DONE]"
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


class UpstreamError(Exception):
    """The upstream refused, failed or broke off a request.

    kind: "http" (an error status before the first byte), "connect", "timeout",
    "cut" (the connection ended without a finish), "protocol" (unreadable data: too
    many malformed events, an over-long line), "too_large" (a reply or a response
    past its size cap), "stream" (an error the upstream reported mid-stream) or
    "busy" (no free connection to the provider within the wait, chat/limits.py).
    The message is a sentence already scrubbed of secrets (see scrub()).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        body: bytes | None = None,
        headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.code = code
        self.body = body
        self.headers = headers or httpx.Headers()

    @property
    def retry_after(self) -> str | None:
        return self.headers.get("retry-after")

    @property
    def request_id(self) -> str | None:
        return self.headers.get("x-request-id")

    def __str__(self) -> str:
        prefix = f"upstream {self.status}" if self.status else f"upstream {self.kind}"
        return f"{prefix}: {self.message}"


# --- secrets and HTML out of upstream text ------------------------------------

REDACTED = "[redacted]"
# An Authorization value an upstream echoes back, and keys that look like OpenAI-style secrets.
_BEARER_RE = re.compile(r"(?i)\b(bearer)\s+[^\s\"'<>,;]+")
_KEY_RE = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")
_HTML_RE = re.compile(r"(?is)^\s*(<!doctype\s+html|<html|<head|<body)")
_TITLE_RE = re.compile(r"(?is)<title[^>]*>(.*?)</title>")
_H1_RE = re.compile(r"(?is)<h1[^>]*>(.*?)</h1>")
_TAG_RE = re.compile(r"<[^>]+>")


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """Upstream-derived text with the given secrets and anything like `Bearer …` / `sk-…` removed."""
    for secret in secrets:
        # Very short keys (the test fakes' "x") would blank out ordinary words.
        if secret and len(secret) >= 6 and secret in text:
            text = text.replace(secret, REDACTED)
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _KEY_RE.sub(REDACTED, text)


def is_html(text: str) -> bool:
    return _HTML_RE.match(text) is not None


def html_summary(text: str, fallback: str) -> str:
    """One line for an HTML error page: its title (or first heading), never the page."""
    found = _TITLE_RE.search(text) or _H1_RE.search(text)
    title = " ".join(_TAG_RE.sub(" ", found.group(1)).split()) if found else ""
    return title[:200] or fallback


def shorten(text: str, limit: int = 500) -> str:
    """At most `limit` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the shared client --------------------------------------------------------


def make_client(
    max_connections: int = 1000, transport: str = "aiohttp", *, allow_link_local: bool = False
) -> httpx.AsyncClient:
    """A client for many concurrent long streams; `transport` is "aiohttp" or "httpx".

    Unless `allow_link_local`, it refuses to send anything to a link-local or cloud metadata address.
    """
    # Idle connections are dropped after 4 s, before the 5 s after which many servers
    # (uvicorn, Node) close them: fewer requests written to a connection closing under them.
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections // 4, keepalive_expiry=4.0
    )
    hooks = {} if allow_link_local else {"request": [DestinationGuard()]}
    if transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport, HttpxAiohttpClient

        made = AiohttpTransport(limits=limits, trust_env=False)

        def session() -> aiohttp.ClientSession:
            # httpx-aiohttp's own session, but with no cookie jar (see below).
            connector = aiohttp.TCPConnector(
                limit=max_connections, keepalive_timeout=limits.keepalive_expiry, ssl=made.ssl_context
            )
            return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

        made.client = session  # called once, in the event loop, at the first request
        client = HttpxAiohttpClient(limits=limits, trust_env=False, event_hooks=hooks, transport=made)
    else:
        client = httpx.AsyncClient(limits=limits, trust_env=False, event_hooks=hooks)
    # One client serves everyone's requests: a cookie set in answer to one person (a CDN's
    # __cf_bm, a gateway's session) must not go out with everybody's next ones. httpx would
    # keep it (and parse every answer's headers through urllib's cookie machinery to look:
    # 2 % of a stream start's CPU), so would aiohttp's session; neither jar keeps anything now.
    client._cookies = NoCookies()  # the `cookies` setter would copy it into a plain jar
    return client


class NoCookies(httpx.Cookies):
    """A client's cookie jar that keeps none of the cookies its answers set."""

    def extract_cookies(self, response: httpx.Response) -> None:
        pass


# One client per event loop: a client's connections belong to the loop that opened them.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def shared_client(
    max_connections: int = 1000, transport: str = "aiohttp", *, allow_link_local: bool = False
) -> httpx.AsyncClient:
    """This process's client for the running event loop, created on first use."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = _clients[loop] = make_client(max_connections, transport, allow_link_local=allow_link_local)
    return client


async def close_shared_client() -> None:
    """Close the running loop's client (tests and shutdown)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


# --- where requests may go ----------------------------------------------------

# Link-local networks hold the cloud metadata services (169.254.169.254; fd00:ec2::254 on
# AWS over IPv6; 100.100.100.200 on Alibaba Cloud), which hand credentials to whoever asks.
REFUSED_NETWORKS = tuple(
    ipaddress.ip_network(network)
    for network in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32")
)
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | str | None]:
    """(scheme, host, port) of a URL, the scheme's default port filled in: the server a key is sent to."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port: int | str | None = parts.port
    except ValueError:
        port = parts.netloc.rsplit(":", 1)[-1]  # not a valid port: compared as written
    return scheme, (parts.hostname or "").rstrip("."), port or DEFAULT_PORTS.get(scheme)


def refused_ip(address: str) -> bool:
    """Whether an IP address (IPv4, IPv6, IPv4-mapped IPv6) is link-local or a metadata service."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return any(ip in network for network in REFUSED_NETWORKS)


def _numeric_addresses(host: str) -> list[str] | None:
    """The address(es) when `host` is an IP address in any spelling the C library accepts, else None."""
    bare = host.strip("[]").split("%", 1)[0]
    try:
        # AI_NUMERICHOST: 2852039166 and 0xa9.0xfe.0xa9.0xfe are 169.254.169.254 too; DNS is never asked.
        infos = socket.getaddrinfo(bare, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    return [info[4][0] for info in infos]


def refused_literal(host: str) -> str | None:
    """The refused address when `host` is written as a link-local or metadata IP address."""
    return next((a for a in _numeric_addresses(host) or [] if refused_ip(a)), None)


class DestinationGuard:
    """An httpx request hook refusing link-local and metadata addresses, written or resolved.

    A name's addresses are looked up before the request and the verdict kept a minute;
    the connection resolves it again, so a DNS server answering differently the second
    time is not caught here (a firewall rule is the complete guard).
    """

    TTL = 60.0

    def __init__(self) -> None:
        self._verdicts: dict[str, tuple[float, str | None]] = {}

    async def __call__(self, request: httpx.Request) -> None:
        host = request.url.host
        now = time.monotonic()
        cached = self._verdicts.get(host)
        if cached and cached[0] > now:
            address = cached[1]
        else:
            addresses = _numeric_addresses(host)
            if addresses is None:
                addresses = await self._resolve(host, request.url.port or DEFAULT_PORTS.get(request.url.scheme, 443))
            address = next((a for a in addresses if refused_ip(a)), None)
            if len(self._verdicts) > 1000:
                self._verdicts.clear()
            self._verdicts[host] = (now + self.TTL, address)
        if address:
            raise UpstreamError(
                "connect", f"its address {address} is link-local or a cloud metadata service, which is refused"
            )

    @staticmethod
    async def _resolve(host: str, port: int) -> list[str]:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return []  # the connection attempt reports it
        return [info[4][0] for info in infos]


# --- requests -----------------------------------------------------------------


def _headers(api_key: str, *, stream: bool) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if stream:
        headers["Accept"] = "text/event-stream"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def endpoint(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + "/" + path.lstrip("/")


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
    message, code = _describe_error_body(text, response.reason_phrase or "error")
    return UpstreamError(
        "http", message, status=response.status_code, code=code, body=text.encode(), headers=response.headers
    )


def _describe_error_body(text: str, fallback: str) -> tuple[str, str | None]:
    """The message and code from OpenAI-style `{"error": {...}}` bodies, whatever their variant."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        if is_html(text):
            return html_summary(text, fallback), None
        return shorten(" ".join(text.split()) or fallback), None
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    message, code = describe_error(error, fallback)
    return shorten(message), (code[:100] if code else code)  # both already scrubbed with the body


def describe_error(error: Any, fallback: str = "upstream error") -> tuple[str, str | None]:
    """Turn an upstream error object (dict or string) into (message, code)."""
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or fallback
        code = error.get("code") or error.get("type")
        if not isinstance(message, str):  # a nested object: JSON, never a Python repr
            message = orjson.dumps(message).decode()
        if code is not None and not isinstance(code, str | int):
            code = None
        return message, (str(code) if code is not None else None)
    if isinstance(error, str) and error:
        return error, None
    return fallback, None


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


# --- what a stream says -------------------------------------------------------


@dataclass(slots=True)
class StreamState:
    """Accumulates one streamed completion, chunk by chunk (no I/O; times are passed in)."""

    started_at: float
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    perf: dict[str, Any] | None = None
    error: Any = None
    upstream_id: str = ""
    request_id: str = ""
    model: str = ""
    done: bool = False
    first_token_at: float | None = None
    # When thinking began and the answer began: how long the model thought, shown under its reasoning.
    first_reasoning_at: float | None = None
    first_content_at: float | None = None
    ended_at: float | None = None
    # Limits (None: none): bytes of content + reasoning, and unreadable events tolerated.
    max_reply: int | None = None
    max_malformed: int = 3
    # Scrubbed from the upstream's error text (the provider's key).
    secrets: tuple[str, ...] = ()
    reply_bytes: int = 0
    malformed: int = 0

    def feed(self, data: bytes, now: float) -> tuple[str, str]:
        """Take one `data:` payload; return the (content, reasoning) text it added."""
        if data == DONE:
            self.done = True
            return "", ""
        chunk = self.parse(data)
        if chunk is None:
            return "", ""
        return self.feed_chunk(chunk, now)

    def parse(self, data: bytes) -> dict[str, Any] | None:
        """One `data:` payload as a chunk, or None for an unreadable one.

        The rule for both the chat and /v1: an unreadable event is skipped and counted,
        and only the max_malformed-th one fails the stream.
        """
        try:
            return parse_chunk(data)
        except UpstreamError:
            self.malformed += 1
            log.warning("stream %s: an unreadable event (%d so far)", self.upstream_id or "?", self.malformed)
            if self.malformed >= self.max_malformed:
                raise UpstreamError(
                    "protocol", f"the upstream sent {self.malformed} events that are not valid JSON"
                ) from None
            return None

    def feed_chunk(self, chunk: dict[str, Any], now: float) -> tuple[str, str]:
        """Take one parsed chunk; return the (content, reasoning) text it added."""
        if not self.upstream_id and isinstance(chunk.get("id"), str):
            self.upstream_id = chunk["id"]
            self.model = chunk.get("model") or ""
        if chunk.get("error") is not None:
            self.error = chunk["error"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        perf = chunk.get("x_i14_perf")
        if isinstance(perf, dict):
            self.perf = perf
        content = reasoning = ""
        choices = chunk.get("choices")
        if choices and isinstance(choices, list):
            choice = choices[0]
            if isinstance(choice, dict):
                delta = choice.get("delta") or choice.get("message") or {}
                if isinstance(delta, dict):
                    content = _text(delta.get("content"))
                    reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
                    if delta.get("tool_calls"):
                        self._merge_tool_calls(delta["tool_calls"])
                        if self.first_token_at is None:
                            self.first_token_at = now
                if choice.get("finish_reason"):
                    self.finish_reason = str(choice["finish_reason"])
        if content or reasoning:
            content, reasoning = self._within_cap(content, reasoning)
        if content:
            self.content.append(content)
            if self.first_content_at is None:
                self.first_content_at = now
        if reasoning:
            self.reasoning.append(reasoning)
            if self.first_reasoning_at is None:
                self.first_reasoning_at = now
        if (content or reasoning) and self.first_token_at is None:
            self.first_token_at = now
        return content, reasoning

    def thinking_ms(self, now: float) -> int | None:
        """Milliseconds from the first reasoning to the first answer text (or the end); None without reasoning."""
        if self.first_reasoning_at is None:
            return None
        until = self.first_content_at or self.ended_at or now
        return max(0, round((until - self.first_reasoning_at) * 1000))

    @property
    def full(self) -> bool:
        """The reply reached max_reply: the caller stops reading (with too_large())."""
        return self.max_reply is not None and self.reply_bytes >= self.max_reply

    def too_large(self) -> UpstreamError:
        return UpstreamError("too_large", f"the answer reached the limit of {self.max_reply} bytes")

    def _within_cap(self, content: str, reasoning: str) -> tuple[str, str]:
        """The new text, cut (on a character boundary) where the reply would pass max_reply."""
        added = _utf8_len(content) + _utf8_len(reasoning)
        self.reply_bytes += added
        if self.max_reply is None or self.reply_bytes <= self.max_reply:
            return content, reasoning
        room = self.max_reply - (self.reply_bytes - added)
        self.reply_bytes = self.max_reply
        reasoning_bytes = reasoning.encode()[:room]
        room -= len(reasoning_bytes)
        cut = lambda raw: raw.decode("utf-8", "ignore")  # noqa: E731  (drops a half character)
        return cut(content.encode()[:room]), cut(reasoning_bytes)

    def _merge_tool_calls(self, fragments: Any) -> None:
        for fragment in fragments if isinstance(fragments, list) else ():
            if not isinstance(fragment, dict):
                continue
            call = self.tool_calls.setdefault(
                int(fragment.get("index", 0)), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if fragment.get("id"):
                call["id"] = fragment["id"]
            if fragment.get("type"):
                call["type"] = fragment["type"]
            function = fragment.get("function") or {}
            if function.get("name"):
                call["function"]["name"] += function["name"]
            if function.get("arguments"):
                call["function"]["arguments"] += function["arguments"]

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def tool_call_list(self) -> list[dict[str, Any]]:
        return [self.tool_calls[index] for index in sorted(self.tool_calls)]

    @property
    def finished(self) -> bool:
        """The upstream said it was done (a finish_reason or [DONE])."""
        return self.done or self.finish_reason is not None

    def error_message(self) -> str:
        """The upstream's mid-stream error as a sentence without secrets or HTML."""
        message = describe_error(self.error, "the upstream reported an error")[0]
        message = scrub(message, self.secrets)
        return html_summary(message, "the upstream reported an error") if is_html(message) else shorten(message)

    def outcome(self) -> str:
        """complete, failed (an upstream error) or interrupted (ended without a finish)."""
        if self.error is not None or self.finish_reason == "error":
            return "failed"
        return "complete" if self.finished else "interrupted"

    def metering(self, prompt_chars: int, now: float) -> dict[str, Any]:
        """Usage in OpenAI's names plus timings; estimated from the text when the upstream sent none."""
        ended = self.ended_at or now
        usage = self.usage or {}
        details = usage.get("completion_tokens_details") or {}
        estimated = not usage
        prompt = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens"))
        reasoning = _int(details.get("reasoning_tokens") if isinstance(details, dict) else None)
        if estimated:
            prompt = estimate_tokens(prompt_chars)
            reasoning = estimate_tokens(sum(map(len, self.reasoning)))
            arguments = sum(len(c["function"]["arguments"]) for c in self.tool_calls.values())
            completion = estimate_tokens(sum(map(len, self.content)) + arguments) + reasoning
        total = _int(usage.get("total_tokens")) or prompt + completion
        ttft = None if self.first_token_at is None else self.first_token_at - self.started_at
        generating = ended - (self.first_token_at or ended)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "reasoning_tokens": reasoning,
            "total_tokens": total,
            "cost": _cost(usage.get("cost")),
            "ttft_ms": None if ttft is None else round(ttft * 1000),
            "duration_ms": round((ended - self.started_at) * 1000),
            "tokens_per_second": round(completion / generating, 2) if completion and generating > 0 else None,
            "estimated": estimated,
        }


def parse_chunk(data: bytes) -> dict[str, Any]:
    """One `data:` payload as a JSON object, or a protocol error."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        chunk = None
    if not isinstance(chunk, dict):
        raise UpstreamError("protocol", "the upstream sent an event that is not a JSON object")
    return chunk


def _utf8_len(text: str) -> int:
    # isascii() is a flag check in CPython: most tokens are counted without encoding them.
    return len(text) if text.isascii() else len(text.encode())


def estimate_tokens(chars: int) -> int:
    """A rough count for text the upstream did not meter: about four characters a token."""
    return math.ceil(chars / 4)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _cost(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None
