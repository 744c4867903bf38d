"""The OpenAI-compatible relay: a client's request in, the upstream's SSE out untouched (no Django).

Every upstream event is passed on as the exact bytes it arrived in, in order, as soon
as it arrives. What changes: a comment line opens the stream and another fills every
silence of HEARTBEAT seconds (so proxies keep it open), the usage-only chunk that the
relay itself asked for is dropped when the client did not ask for it, and a stream the
upstream ends without `[DONE]` gets one (after an error event if it ended mid-answer),
and so does a stream the server ends itself (`interrupt`, at shutdown).

The upstream is read with the chat's own loop (UpstreamStream.read), so the chat's rules
bound what is relayed: an event that is not JSON is skipped (not forwarded: the SDKs
would raise on it) and counted, and the stream ends with an error event once there are
StreamState.max_malformed of them or the reply passes StreamState.max_reply; an upstream
error event has secrets scrubbed, and any other event the provider's key (a search of its
bytes, copied only when the key is there).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from chat.lib.attachment_content import image_tokens
from chat.lib.model_params import DEFAULT_MAX_IMAGE_BYTES, ParamError, check_request
from chat.lib.openai_errors import error_body
from chat.lib.token_estimate import CHARS_PER_TOKEN
from chat.streaming.sse import ServerSentEvent
from chat.streaming.upstream import StreamState, UpstreamError, UpstreamStream, redact_secrets, scrub

OPENING = b": connected\n\n"
KEEP_ALIVE = b": keep-alive\n\n"
DONE_EVENT = b"data: [DONE]\n\n"
# How long and how much a stream whose client went away is still read for the upstream's usage:
# enough for what the upstream has already sent (held back by flow control, in the socket buffers
# between us, a few MiB at most), little enough that a client that hung up to stop an answer does
# not pay for much more of it, however fast the upstream writes.
DRAIN_SECONDS = 1.0
DRAIN_BYTES = 8 * 1024 * 1024
_END = object()
_BEAT = object()  # the heartbeat timer's wake-up: a keep-alive is due
IMAGE_CHARS = image_tokens(2048, 2048) * CHARS_PER_TOKEN


class RequestError(Exception):
    """A request the relay refuses, with OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


def parse_request(
    raw: bytes, *, max_tokens: int = 32768, max_n: int = 1, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
) -> dict[str, Any]:
    """The client's chat completion request: only the supported fields, each checked (chat/lib/model_params.py)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RequestError(400, "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    try:
        return check_request(body, max_tokens=max_tokens, max_n=max_n, max_image_bytes=max_image_bytes)
    except ParamError as exc:
        raise RequestError(400, exc.message, code=exc.code, param=exc.param or None) from None


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
    else:  # only for a stream: an upstream may refuse it on a whole answer, as OpenAI does
        out.pop("stream_options", None)
    return out, wants_usage


def message_text(content: Any) -> str:
    """The text of an OpenAI message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """The length of the prompt's text, for estimating its tokens when the upstream does not say.

    Each image part counts as the characters of its tokens at most (OpenAI's estimate for an
    image fitted in 2048 px, which is what attachments are).
    """
    images = sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image_url"
    )
    return sum(len(message_text(message.get("content"))) for message in messages) + images * IMAGE_CHARS


def request_chars(body: dict[str, Any]) -> int:
    """prompt_chars() of a chat request's messages plus its tool definitions, which the model reads too (a
    /v1 request may carry megabytes of them)."""
    tools = body.get("tools")
    return prompt_chars(body["messages"]) + (len(orjson.dumps(tools)) if tools else 0)


class Running:
    """The streams this process is relaying, and whose each is: for ending them at shutdown or deactivation."""

    def __init__(self) -> None:
        self._owners: weakref.WeakKeyDictionary[Relay, int] = weakref.WeakKeyDictionary()
        # Each stream's API token (its id), for ending the streams of a revoked one.
        self._tokens: weakref.WeakKeyDictionary[Relay, int] = weakref.WeakKeyDictionary()
        # Each stream's usage row and the (completion, reasoning) tokens last written on it.
        self._rows: weakref.WeakKeyDictionary[Relay, list[Any]] = weakref.WeakKeyDictionary()

    def add(self, relay: Relay, owner: int, usage_id: int | None = None, token: int | None = None) -> None:
        self._owners[relay] = owner
        if token is not None:
            self._tokens[relay] = token
        if usage_id is not None:
            self._rows[relay] = [usage_id, (0, 0)]

    async def checkpoint(self, write: Callable[[list[tuple[int, int, int]]], Awaitable[None]], now: float) -> int:
        """Give `write` (usage row, completion, reasoning tokens) for each stream that grew since; how many.

        Estimated from the text, as at the end when the upstream sends no usage. Written only once
        `write` returns: after a failed write the next checkpoint gives them again.
        """
        grown = []
        for relay, mark in list(self._rows.items()):
            usage = relay.state.metering(0, now)
            tokens = (usage["completion_tokens"], usage["reasoning_tokens"])
            if tokens != mark[1]:
                grown.append((mark, tokens))
        if grown:
            await write([(mark[0], *tokens) for mark, tokens in grown])
            for mark, tokens in grown:
                mark[1] = tokens
        return len(grown)

    def owners(self) -> set[int]:
        """Whose streams are running."""
        return set(self._owners.values())

    def tokens(self) -> set[int]:
        """The API tokens whose streams are running."""
        return set(self._tokens.values())

    def interrupt(self, reason: str, owner: int | None = None, token: int | None = None,
                  code: str = "server_shutdown") -> int:  # fmt: skip
        """End the running streams (only `owner`'s, or only `token`'s, if given): an error event with `code` and
        [DONE] each; how many."""
        if token is not None:
            ending = [relay for relay, which in list(self._tokens.items()) if which == token]
        else:
            ending = [relay for relay, who in list(self._owners.items()) if owner is None or who == owner]
        for relay in ending:
            relay.interrupt(reason, code)
        return len(ending)


class Relay:
    """Iterate for the bytes to send the client; afterwards `status` and `error` say how it ended."""

    def __init__(self, stream: UpstreamStream, state: StreamState, *, forward_usage: bool, heartbeat: float) -> None:
        self.stream = stream
        self.state = state
        self.forward_usage = forward_usage
        self.heartbeat = heartbeat
        self.failure: UpstreamError | None = None
        self.interruption: str | None = None
        self.interruption_code = "server_shutdown"
        self._queue: asyncio.Queue[Any] | None = None
        self._pump_task: asyncio.Task | None = None
        # When the client side began waiting on an empty queue (loop time), None while it is not.
        self._idle_since: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_left = DRAIN_BYTES

    async def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        """The client is gone: read what the upstream still sends, unforwarded, for its usage figure.

        An upstream that had finished (its events held back by flow control) is billed as it
        reported; one still answering after `seconds` or DRAIN_BYTES is closed, and its usage estimated.
        """
        pump = self._pump_task
        if pump is None or pump.done() or self.interruption is not None:
            return
        self._draining = True
        while self._queue is not None and not self._queue.empty():  # a read waiting for room goes on
            self._queue.get_nowait()
        await asyncio.wait({pump}, timeout=seconds)
        pump.cancel()

    def interrupt(self, message: str, code: str = "server_shutdown") -> None:
        """End the stream now, unfinished: the upstream is closed, the client gets an error event (`code`) and
        [DONE]."""
        if self.interruption is not None or self.state.done:
            return
        self.interruption, self.interruption_code = message, code
        if self._pump_task is not None:
            self._pump_task.cancel()
        if self._queue is not None:
            # Only a relay waiting on an empty queue needs waking; a full one sees the flag first.
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(_END)

    @property
    def malformed(self) -> int:
        """Unreadable events skipped so far."""
        return self.state.malformed

    @property
    def status(self) -> str:
        if self.interruption is not None:
            return "interrupted"
        return self.state.outcome(self.failure)

    @property
    def error(self) -> str:
        if self.interruption is not None:
            return self.interruption
        if self.failure is not None:
            return str(self.failure)
        if self.state.outcome() == "failed":
            return self.state.error_message()
        if self.state.outcome() == "interrupted":
            return "the upstream ended the stream before the answer was finished"
        return ""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=256)
        self._queue = queue
        loop = self._loop = asyncio.get_running_loop()
        pump = self._pump_task = asyncio.create_task(self._pump(queue))
        # One heartbeat timer a stream, re-armed lazily (see _beat), instead of a timeout per wait.
        self._timer = loop.call_at(loop.time() + self.heartbeat, self._beat)
        try:
            yield OPENING
            while True:
                if queue.empty():
                    self._idle_since = loop.time()
                    try:
                        item = await queue.get()
                    finally:
                        self._idle_since = None
                    if item is _BEAT:
                        yield KEEP_ALIVE
                        continue
                else:
                    item = queue.get_nowait()
                # The events already waiting go out together, in one write: under load a
                # send per event costs more than the event (ASGI, daphne, the socket).
                out, end = self._take_waiting(item, queue)
                if out:
                    yield out[0] if len(out) == 1 else b"".join(out)
                if end == "done":
                    return
                if end == "stop":
                    break
            yield from_ending(self)
        finally:
            self._timer.cancel()
            if not self._draining:  # else drain() ends it (this generator may be closed while it waits)
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, UpstreamError):
                await pump

    def _beat(self) -> None:
        """The heartbeat timer: a keep-alive once the client side has waited `heartbeat` seconds on an empty queue.

        Otherwise it re-arms for when that wait would reach `heartbeat` (or a full period on if
        nothing is waited for), so a stream costs one timer event a period, not one a chunk.
        """
        loop, queue, since = self._loop, self._queue, self._idle_since
        now = loop.time()
        due = now + self.heartbeat
        if since is not None and queue.empty():
            if now >= since + self.heartbeat - getattr(loop, "_clock_resolution", 0.0):
                queue.put_nowait(_BEAT)  # the queue is empty: never full
                self._idle_since = now
            else:
                due = since + self.heartbeat
        self._timer = loop.call_at(due, self._beat)

    def _take_waiting(self, item: Any, queue: asyncio.Queue[Any]) -> tuple[list[bytes], str | None]:
        """The bytes of `item` and of those queued behind it; "done" or "stop" if the stream ends."""
        out: list[bytes] = []
        while True:
            if self.interruption is not None:
                return out, "stop"
            if type(item) is bytes:
                out.append(item)
            elif item is _END:  # after the upstream's [DONE], if it sent one
                return out, "done" if self.state.done else "stop"
            elif isinstance(item, UpstreamError):
                self.failure = item
                return out, "stop"
            # else _BEAT: data arrived behind it, no keep-alive needed
            if queue.empty():
                return out, None
            item = queue.get_nowait()

    def _forward(self, event: ServerSentEvent, chunk: dict[str, Any] | None) -> Awaitable[None] | None:
        """Queue an event the state took for the client, unless it must not go; while the queue is full, the wait."""
        if self._draining:
            self._drain_left -= len(event.raw)
            if self._drain_left < 0 and self._pump_task is not None:
                self._pump_task.cancel()  # this read loop's own task: it ends at its next wait
            return None
        raw = self._client_bytes(event, chunk)
        if raw is None:
            return None
        try:
            self._queue.put_nowait(raw)
        except asyncio.QueueFull:
            return self._queue.put(raw)  # the client is behind: the reading waits for room
        return None

    def _client_bytes(self, event: ServerSentEvent, chunk: dict[str, Any] | None) -> bytes | None:
        """What the client gets of an event: the event as it came, or None."""
        raw = event.raw
        if chunk is not None:
            if "error" in chunk:
                # Rare, so re-encoding is fine: an upstream may echo the request's key in its error.
                scrubbed = scrub(raw.decode("utf-8", "replace"), self.state.secrets).encode()
                raw = scrubbed if scrubbed != raw else raw
            elif not self.forward_usage and chunk.get("choices") == [] and chunk.get("usage"):
                return None  # the usage the relay asked for, not the client
            else:  # the provider's key, were the upstream to echo it in a chunk (one search, no copy)
                raw = redact_secrets(raw, self.state.secrets)
        return raw

    async def _pump(self, queue: asyncio.Queue[Any]) -> None:
        # Reading in a task of its own lets the relay wait for the next event with a
        # timeout (for the keep-alive) without ever cancelling a read half-way.
        try:
            await self.stream.read(self.state, forward=self._forward)
            await queue.put(_END)
        except UpstreamError as exc:
            await queue.put(exc)


# The error event's code, by UpstreamError kind; any other failure is an interruption.
ENDING_CODES = {"too_large": "reply_too_large", "protocol": "upstream_malformed", "timeout": "upstream_timeout"}


def from_ending(relay: Relay) -> bytes:
    """What closes a stream the upstream ended without [DONE]."""
    if relay.interruption is not None:
        kind = "server_error" if relay.interruption_code == "server_shutdown" else "invalid_request_error"
        error = {"message": relay.interruption, "type": kind, "code": relay.interruption_code}
        event = orjson.dumps({"error": error})
        return b"data: " + event + b"\n\n" + DONE_EVENT
    if relay.status in ("interrupted", "failed") and (relay.state.error is None or relay.failure is not None):
        # Ended mid-answer with no error of its own: say so in OpenAI's form, which SDKs raise.
        message = relay.error or "the upstream stream failed"
        code = ENDING_CODES.get(relay.failure.kind if relay.failure else "", "upstream_interrupted")
        event = orjson.dumps({"error": {"message": message, "type": "upstream_error", "code": code}})
        return b"data: " + event + b"\n\n" + DONE_EVENT
    return DONE_EVENT


running = Running()
