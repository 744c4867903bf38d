"""The MCP client: a server's tools listed, one tool called, through the official `mcp` SDK (no Django).

Each use opens its own session (Streamable HTTP, or a stdio server's process started for it)
and closes it afterwards, within a time limit: a server that hangs, fails or answers too much
costs the caller that time at most, never the process. Headers and bearer secrets go only to
the server; errors are described without them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2

from chat.streaming.upstream.client import DestinationGuard

# A server's response (a tool result, as one SSE event or one JSON body) may be this large; a larger one fails
# the call as it arrives, before it is held whole (the chat keeps far less of it). A 10 MB text result comes
# twice in its response (as text and as structured content), and is still read and cut.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
# Every request to a server is checked as upstream requests are: its name may have come to resolve to
# a link-local or cloud metadata address since the admin saved it (that save checked it too).
_guard = DestinationGuard()


@dataclass(frozen=True)
class Endpoint:
    """Where a server is: a Streamable HTTP URL with its headers, or a stdio command (from MCP_SERVERS_FILE)."""

    name: str
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    stdio: dict[str, Any] | None = None
    allow_link_local: bool = False  # UPSTREAM_ALLOW_LINK_LOCAL, as for providers

    def __repr__(self) -> str:  # never the headers
        return f"Endpoint({self.name!r})"


@dataclass(frozen=True)
class Result:
    """A call's outcome: its text (cut to the cap), whether the tool said it failed, its size before the cut."""

    text: str
    is_error: bool
    size: int
    truncated: bool


class McpFailure(Exception):
    """A server that cannot be reached, refused, or broke the protocol: a sentence without secrets."""


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that fails once it passes `limit` bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self.inner, self.limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for piece in self.inner:
            received += len(piece)
            if received > self.limit:
                raise httpx2.ReadError(f"the server's response passed {self.limit:,} bytes")
            yield piece

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport, each response body capped (the SDK reads a JSON answer whole, and its SSE
    event limit did not hold a large result back)."""

    def __init__(self, limit: int) -> None:
        self.inner, self.limit = httpx2.AsyncHTTPTransport(), limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        response.stream = _CappedStream(response.stream, self.limit)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def _session(endpoint: Endpoint, seconds: float) -> AsyncIterator[Any]:
    # The SDK is imported at its first use, not with the app: its pydantic models cost every process
    # (and every test's server) over a second of start-up that a team without MCP servers never needs.
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    if endpoint.stdio is not None:
        params = StdioServerParameters(
            command=endpoint.stdio["command"], args=list(endpoint.stdio.get("args") or []),
            env=endpoint.stdio.get("env") or None, cwd=endpoint.stdio.get("cwd") or None,
        )  # fmt: skip
        async with Client(params, cache=None, read_timeout_seconds=seconds) as client:
            yield client
        return
    timeout = httpx2.Timeout(seconds)
    hooks = {"request": [] if endpoint.allow_link_local else [_guard]}
    capped = _CappedTransport(MAX_RESPONSE_BYTES)
    async with httpx2.AsyncClient(
        headers=endpoint.headers, timeout=timeout, event_hooks=hooks, transport=capped
    ) as http:
        transport = streamable_http_client(endpoint.url, http_client=http, max_sse_event_size=MAX_RESPONSE_BYTES)
        async with Client(transport, cache=None, read_timeout_seconds=seconds) as client:
            yield client


def _describe(exc: BaseException, endpoint: Endpoint) -> str:
    """An error as one line, with the server's secrets taken out."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    for secret in endpoint.headers.values():
        if secret:
            text = text.replace(secret, "…")
    return " ".join(text.split())[:300]


async def list_tools(endpoint: Endpoint, seconds: float) -> list[dict[str, Any]]:
    """The server's tools as [{"name", "description", "input_schema"}]; McpFailure if it cannot say."""
    try:
        async with asyncio.timeout(seconds):
            async with _session(endpoint, seconds) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor or len(tools) > 500:
                        break
    except TimeoutError:
        raise McpFailure(f"no answer within {seconds:g} s") from None
    except Exception as exc:
        raise McpFailure(_describe(exc, endpoint)) from None
    return [
        {"name": tool.name, "description": (tool.description or "")[:2000], "input_schema": tool.input_schema or {}}
        for tool in tools
    ]


def result_text(content: list[Any], structured: Any) -> str:
    """A result's blocks as text: text blocks as they are, other kinds named (images are not passed on)."""
    parts = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            parts.append(getattr(block.resource, "text", "") or f"[a resource: {block.resource.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content left out]")
    if not parts and structured is not None:
        parts.append(str(structured))
    return "\n".join(parts).replace("\x00", "\ufffd")  # stored with the answer: PostgreSQL's text holds no NUL


async def call_tool(endpoint: Endpoint, tool: str, arguments: dict[str, Any], seconds: float,
                    max_chars: int) -> Result:  # fmt: skip
    """Call one tool within `seconds` (TimeoutError past it); its text cut to `max_chars`; McpFailure if the
    server could not answer.

    The session closes in a task of its own: past the limit, or on a Stop, the caller is answered at once
    while it closes (the SDK waits seconds for a stdio server to exit before it ends the process).
    """
    call = asyncio.ensure_future(_call(endpoint, tool, arguments, seconds))
    try:
        done, _ = await asyncio.wait({call}, timeout=seconds)
    except asyncio.CancelledError:
        _leave_closing(call)
        raise
    if not done:
        _leave_closing(call)
        raise TimeoutError
    text, is_error = call.result()
    size = len(text)
    return Result(text=text[:max_chars], is_error=is_error, size=size, truncated=size > max_chars)


# Calls given up on (past their limit, or stopped), still closing their sessions: kept referenced until they have.
_closing: set[asyncio.Task] = set()


def _leave_closing(call: asyncio.Task) -> None:
    call.cancel()
    _closing.add(call)
    call.add_done_callback(_closing.discard)
    call.add_done_callback(lambda task: task.cancelled() or task.exception())  # its error is no one's now


async def _call(endpoint: Endpoint, tool: str, arguments: dict[str, Any], seconds: float) -> tuple[str, bool]:
    """The call itself, its session opened and closed within the time limit: the result's text and is_error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with asyncio.timeout_at(deadline):
        try:
            async with _session(endpoint, seconds) as client:
                answer = await client.call_tool(tool, arguments)
        except TimeoutError:
            raise
        except Exception as exc:
            # The SDK's and httpx's own timers end at about the same time as ours; on a stalled event loop
            # theirs can win and raise their own error. Past the deadline it is a timeout whoever raised it.
            if loop.time() >= deadline:
                raise TimeoutError from None
            raise McpFailure(_describe(exc, endpoint)) from None
    return result_text(answer.content, answer.structured_content), bool(answer.is_error)
