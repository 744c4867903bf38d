"""The fake upstream's ASGI app: routes, reads and checks each request, then answers it as planned.

``app`` is what ``uvicorn fakeupstream.app:app`` serves, its API key, pause between
chunks and log length read from FAKE_UPSTREAM_KEY, FAKE_UPSTREAM_DELAY and
FAKE_UPSTREAM_MAX_RECORDS.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import deque
from typing import Any

from fakeupstream.answers import UpstreamCut, stream_answer, whole_answer
from fakeupstream.dialects import (
    I14_MODEL,
    MODELS,
    models_body,
    new_completion_id,
    new_request_id,
)
from fakeupstream.directives import error_status, last_user_text, nonneg_int, read_directives
from fakeupstream.embeddings import EmbeddingRefused
from fakeupstream.embeddings import answer as embeddings_answer
from fakeupstream.plan import plan_answer
from fakeupstream.records import ConnectionState, StreamRecord, mark_disconnected
from fakeupstream.replies import html_error_page, respond, send_error

__all__ = ["MODELS", "FakeUpstream", "StreamRecord", "UpstreamCut", "app"]

ROUTE_RE = re.compile(r"/(i14|api14|infyrence)/v1/(models|chat/completions|embeddings)$")
DIALECT_RE = re.compile(r"/(i14|api14|infyrence)/v1(?:/|$)")


class FakeUpstream:
    """ASGI app reproducing the i14, api14 and infyrence wire formats, with faults on demand (see directives)."""

    def __init__(
        self, api_key: str = "fake-key", *, delay: float = 0.0, max_records: int = 1000,
        caps: dict[str, int] | None = None, keep_bytes: bool = True,
    ) -> None:  # fmt: skip
        self.api_key = api_key
        self.delay = delay
        self.max_records = max_records
        self.caps = caps
        self.keep_bytes = keep_bytes
        self.streams: deque[StreamRecord] = deque(maxlen=max_records or None)
        # The bodies of the embeddings requests, newest last.
        self.embedding_requests: deque[Any] = deque(maxlen=max_records or None)

    def last(self) -> StreamRecord:
        """The record of the latest chat/completions request."""
        return self.streams[-1]

    def reset(self) -> None:
        """Forget the recorded requests."""
        self.streams.clear()
        self.embedding_requests.clear()

    # ------------------------------------------------------------------ ASGI entry

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif kind == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1008})

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Route a request: an unknown route, the model list, or a recorded chat/completions."""
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        match = ROUTE_RE.search(path)
        if match is None:
            await self._read_body(receive)
            guess = DIALECT_RE.search(path)
            dialect = guess.group(1) if guess else None
            rid = new_request_id()
            await send_error(send, dialect, 404, f"Unknown route: {method} {path}", rid=rid)
            return
        dialect, endpoint = match.groups()

        if endpoint == "models":
            await self._read_body(receive)
            rid = new_request_id()
            if method not in ("GET", "HEAD"):
                await send_error(send, dialect, 405, f"Method {method} not allowed.", rid=rid, allow="GET")
            elif not self._authorized(headers):
                await send_error(send, dialect, 401, rid=rid)
            else:
                await self._models(send, dialect, rid)
            return

        if endpoint == "embeddings":
            raw, _ = await self._read_body(receive)
            await self._embeddings(send, dialect, method, headers, raw)
            return

        record = StreamRecord(dialect=dialect, path=path, headers=headers)
        record.id = new_completion_id(dialect)
        self.streams.append(record)
        state = ConnectionState()
        watcher: asyncio.Task[None] | None = None
        try:
            raw, disconnected = await self._read_body(receive)
            if disconnected:
                mark_disconnected(record, state)
                return
            watcher = asyncio.ensure_future(self._watch(receive, record, state))
            await self._completions(send, record, state, watcher, method, raw)
        finally:
            if watcher is not None:
                watcher.cancel()
            record.completed.set()

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    async def _read_body(receive: Any) -> tuple[bytes, bool]:
        """The request body, and whether the client left before sending all of it."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks), True
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def _watch(self, receive: Any, record: StreamRecord, state: ConnectionState) -> None:
        """Wait for the client to leave, and note it unless the answer had ended."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not state.ended:
                    mark_disconnected(record, state)
                return

    def _authorized(self, headers: dict[str, str]) -> bool:
        """Whether the request carries this app's API key."""
        return headers.get("authorization") == f"Bearer {self.api_key}"

    async def _models(self, send: Any, dialect: str, rid: str) -> None:
        """Send the dialect's model list."""
        headers = [(b"x-request-id", rid.encode())] if dialect == "infyrence" else []
        await respond(send, 200, models_body(dialect), headers)

    async def _embeddings(self, send: Any, dialect: str, method: str, headers: dict[str, str], raw: bytes) -> None:
        """Answer an embeddings request (fakeupstream/embeddings.py), in the dialect's errors when refused."""
        rid = new_request_id()
        if method != "POST":
            return await send_error(send, dialect, 405, f"Method {method} not allowed.", rid=rid, allow="POST")
        if not self._authorized(headers):
            return await send_error(send, dialect, 401, rid=rid)
        try:
            body = json.loads(raw)
        except ValueError:
            return await send_error(send, dialect, 400, "The request body is not valid JSON.", rid=rid)
        self.embedding_requests.append(body)
        try:
            content = embeddings_answer(dialect, MODELS[dialect], body)
        except EmbeddingRefused as exc:
            return await send_error(send, dialect, exc.status, exc.message, type_=exc.type_, code=exc.code, rid=rid)
        await respond(send, 200, content, [(b"x-request-id", rid.encode())] if dialect == "infyrence" else [])

    # ------------------------------------------------------------------ chat/completions

    async def _completions(
        self,
        send: Any,
        record: StreamRecord,
        state: ConnectionState,
        watcher: asyncio.Task[None],
        method: str,
        raw: bytes,
    ) -> None:
        """Check a chat/completions request, then fail it as asked or send its planned answer."""
        dialect = record.dialect
        rid = record.id

        async def fail(status: int, message: str | None = None, **kw: Any) -> None:
            state.ended = True  # a disconnect seen after this is the normal end, not a client leaving
            await send_error(send, dialect, status, message, rid=rid, record=record, **kw)

        if method != "POST":
            return await fail(405, f"Method {method} not allowed.", allow="POST")
        if not self._authorized(record.headers):
            return await fail(401)
        try:
            body = json.loads(raw)
        except ValueError:
            return await fail(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return await fail(400, "The request body must be a JSON object.")
        record.body = body
        record.stream = bool(body.get("stream"))
        messages = body.get("messages")
        if not isinstance(messages, list):
            return await fail(400, "'messages' is required and must be an array.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return await fail(400, "'model' is required.")
        record.model = model
        info = MODELS[dialect].get(model)
        if info is None:
            if dialect == "i14":
                return await fail(
                    403,
                    f"Model '{model}' is not allowed. Use {I14_MODEL}.",
                    type_="permission_error",
                    code="model_not_allowed",
                )
            return await fail(404, f"Model '{model}' not found.", code="model_not_found")
        if info.embedding:
            return await fail(400, f"Model '{model}' makes embeddings, not chat completions.", code="invalid_model")
        max_tokens = body.get("max_tokens")  # the seeds document no other limit field
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            return await fail(400, "'max_tokens' must be a positive integer.")

        directives, clean = read_directives(last_user_text(messages), self.caps)
        record.directives = directives
        if "longid" in directives:
            record.id = rid = (record.id + "x" * 300)[:300]

        wait = nonneg_int(directives.get("wait"))
        if wait:
            await asyncio.wait({watcher}, timeout=wait / 1000)  # silence, unless the client leaves
            if state.disconnected:
                return

        status = error_status(directives)
        if status is not None and "html" in directives:
            state.ended = True
            record.status = status
            return await respond(send, status, html_error_page(status), [(b"content-type", b"text/html")])
        if status is not None and "echoauth" in directives:
            authorization = record.headers.get("authorization", "")
            return await fail(status, f"Request refused (you sent Authorization: {authorization}).")
        if status is not None:
            return await fail(status)

        plan = plan_answer(
            dialect=dialect,
            model=model,
            info=info,
            cid=record.id,
            body=body,
            messages=messages,
            directives=directives,
            clean=clean,
            max_tokens=max_tokens,
            default_delay=self.delay,
        )
        if record.stream:
            await stream_answer(send, record, state, plan, watcher, keep_bytes=self.keep_bytes)
        else:
            await whole_answer(send, record, state, plan, watcher)


app = FakeUpstream(
    api_key=os.environ.get("FAKE_UPSTREAM_KEY", "fake-key"),
    delay=float(os.environ.get("FAKE_UPSTREAM_DELAY", "0")),
    max_records=int(os.environ.get("FAKE_UPSTREAM_MAX_RECORDS", "100")),
)
