"""The OpenAI-compatible relay: a client's request in, the upstream's SSE out untouched (no Django).

Every upstream event is passed on as the exact bytes it arrived in, in order, as soon
as it arrives. What changes: a comment line opens the stream and another fills every
silence of HEARTBEAT seconds (so proxies keep it open), the usage-only chunk that the
relay itself asked for is dropped when the client did not ask for it, and a stream the
upstream ends without `[DONE]` gets one (after an error event if it ended mid-answer),
and so does a stream the server ends itself (`interrupt`, at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from .sse import ServerSentEvent
from .upstream import DONE, StreamState, UpstreamError, UpstreamStream, parse_chunk

OPENING = b": connected\n\n"
KEEP_ALIVE = b": keep-alive\n\n"
DONE_EVENT = b"data: [DONE]\n\n"
_END = object()


class RequestError(Exception):
    """A request the relay refuses, with OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> bytes:
    """OpenAI's error shape, which the SDKs turn into their exception classes."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def parse_request(raw: bytes) -> dict[str, Any]:
    """The client's chat completion request, checked as far as the relay needs."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RequestError(400, "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise RequestError(400, "you must provide a model parameter", code="missing_model", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError(400, "`messages` must be a non-empty array of message objects.", param="messages")
    if not isinstance(body.get("stream", False), bool):
        raise RequestError(400, "`stream` must be a boolean.", param="stream")
    return body


def upstream_body(body: dict[str, Any], model: str, max_tokens: int) -> tuple[dict[str, Any], bool]:
    """The body to send upstream and whether the client itself asked for usage.

    The provider prefix leaves the model id, max_tokens is always explicit, and a
    stream always asks for usage so every request can be metered.
    """
    out = {**body, "model": model}
    if "max_tokens" not in out and "max_completion_tokens" not in out:
        out["max_tokens"] = max_tokens
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    wants_usage = bool(options.get("include_usage"))
    if body.get("stream"):
        out["stream_options"] = {**options, "include_usage": True}
    return out, wants_usage


def message_text(content: Any) -> str:
    """The text of an OpenAI message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """The length of the prompt's text, for estimating its tokens when the upstream does not say."""
    return sum(len(message_text(message.get("content"))) for message in messages)


class Relay:
    """Iterate for the bytes to send the client; afterwards `status` and `error` say how it ended."""

    def __init__(self, stream: UpstreamStream, state: StreamState, *, forward_usage: bool, heartbeat: float) -> None:
        self.stream = stream
        self.state = state
        self.forward_usage = forward_usage
        self.heartbeat = heartbeat
        self.failure: UpstreamError | None = None
        self.malformed = 0
        self.interruption: str | None = None
        self._queue: asyncio.Queue[Any] | None = None
        self._pump_task: asyncio.Task | None = None

    def interrupt(self, message: str) -> None:
        """End the stream now, unfinished: the upstream is closed, the client gets an error event and [DONE]."""
        if self.interruption is not None or self.state.done:
            return
        self.interruption = message
        if self._pump_task is not None:
            self._pump_task.cancel()
        if self._queue is not None:
            # Only a relay waiting on an empty queue needs waking; a full one sees the flag first.
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(_END)

    @property
    def status(self) -> str:
        if self.interruption is not None:
            return "interrupted"
        if self.failure is not None:
            return "interrupted" if self.failure.kind == "cut" else "failed"
        if self.malformed:
            return "failed"
        return self.state.outcome()

    @property
    def error(self) -> str:
        if self.interruption is not None:
            return self.interruption
        if self.failure is not None:
            return str(self.failure)
        if self.malformed:
            return f"the upstream sent {self.malformed} malformed event(s)"
        if self.state.outcome() == "failed":
            return self.state.error_message()
        if self.state.outcome() == "interrupted":
            return "the upstream ended the stream before the answer was finished"
        return ""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=256)
        self._queue = queue
        pump = self._pump_task = asyncio.create_task(self._pump(queue))
        try:
            yield OPENING
            while True:
                if queue.empty():
                    try:
                        async with asyncio.timeout(self.heartbeat):
                            item = await queue.get()
                    except TimeoutError:
                        yield KEEP_ALIVE
                        continue
                else:
                    item = queue.get_nowait()
                if item is _END or self.interruption is not None:
                    break
                if isinstance(item, UpstreamError):
                    self.failure = item
                    break
                forwarded = self._take(item)
                if forwarded is not None:
                    yield forwarded
                if self.state.done:
                    return
            yield from_ending(self)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, UpstreamError):
                await pump

    def _take(self, event: ServerSentEvent) -> bytes | None:
        """Account for one upstream event; return its bytes unless they must not be forwarded."""
        if event.data is None:
            return event.raw  # the upstream's own keep-alive
        loop_time = asyncio.get_running_loop().time()
        if event.data == DONE:
            self.state.done = True
            return event.raw
        try:
            chunk = parse_chunk(event.data)
        except UpstreamError:
            self.malformed += 1
            return event.raw
        self.state.feed_chunk(chunk, loop_time)
        if not self.forward_usage and chunk.get("choices") == [] and chunk.get("usage") and "error" not in chunk:
            return None
        return event.raw

    async def _pump(self, queue: asyncio.Queue[Any]) -> None:
        # Reading in a task of its own lets the relay wait for the next event with a
        # timeout (for the keep-alive) without ever cancelling a read half-way.
        events = self.stream.events()
        try:
            async for event in events:
                await queue.put(event)
            await queue.put(_END)
        except UpstreamError as exc:
            await queue.put(exc)
        finally:
            await events.aclose()


def from_ending(relay: Relay) -> bytes:
    """What closes a stream the upstream ended without [DONE]."""
    if relay.interruption is not None:
        error = {"message": relay.interruption, "type": "server_error", "code": "server_shutdown"}
        event = orjson.dumps({"error": error})
        return b"data: " + event + b"\n\n" + DONE_EVENT
    if relay.status in ("interrupted", "failed") and relay.state.error is None and not relay.malformed:
        # Ended mid-answer with no error of its own: say so in OpenAI's form, which SDKs raise.
        message = relay.error or "the upstream stream failed"
        event = orjson.dumps({"error": {"message": message, "type": "upstream_error", "code": "upstream_interrupted"}})
        return b"data: " + event + b"\n\n" + DONE_EVENT
    return DONE_EVENT
