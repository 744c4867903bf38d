"""A fake OpenAI-compatible upstream: a pure ASGI app (stdlib only, no Django).

It reproduces, byte for byte, the streaming wire formats documented by three
providers, including their quirks and faults:

* ``i14``: JSON with Python's default ``json.dumps`` separators, reasoning in
  ``delta.reasoning_content``, a finish chunk with ``"usage": null``, then a
  usage-only chunk with ``"choices": []`` and ``x_i14_perf``; ``max_tokens``
  defaults to 100 (thinking counts towards it).
* ``api14``: compact JSON, no ``created``, no ``finish_reason`` key on
  non-final chunks, ``: api14 PROCESSING`` comment lines, reasoning in
  ``delta.reasoning``, usage with ``cost`` (USD) always on the finish chunk and
  mid-stream errors as a chunk with ``error`` and ``finish_reason: "error"``.
* ``infyrence``: compact JSON, an opening ``{"role":"assistant","content":""}``
  chunk, usage only with ``stream_options.include_usage``, ``X-Request-Id`` on
  every response, mid-stream errors as ``data: {"error": ...}`` followed by
  ``[DONE]``.

Routes (any path prefix is accepted, so the app can be mounted anywhere)::

    GET  .../(i14|api14|infyrence)/v1/models
    POST .../(i14|api14|infyrence)/v1/chat/completions

The scenario is chosen by ``[[name]]`` / ``[[name:value]]`` directives in the
last user message: echo, chunks:N, size:N, reasoning:N, delay:MS, wait:MS,
fault:cut|eof|midstream|malformed|stall, malformed:N, status:CODE, html, echoauth, tools,
length, comment, cookie, stamp, shape:paragraph|code (see ``FakeUpstream``).

Every chat/completions request is recorded as a ``StreamRecord`` whose
``threading.Event`` attributes let tests running in another thread wait for the
fake without sleeping. The log keeps the last ``max_records`` requests.

Served as the demo upstream (in the server's own process), ``caps`` bounds the
numeric directives (``DEMO_CAPS``) so one message cannot freeze the process, and
``keep_bytes=False`` keeps the log small.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import os
import random
import re
import secrets
import string
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

__all__ = ["MODELS", "FakeUpstream", "StreamRecord", "UpstreamCut", "app"]

ROUTE_RE = re.compile(r"/(i14|api14|infyrence)/v1/(models|chat/completions)$")
DIALECT_RE = re.compile(r"/(i14|api14|infyrence)/v1(?:/|$)")
DIRECTIVE_RE = re.compile(r"\[\[(\w+)(?::([^\]]*))?\]\]")

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
API14_PROCESSING = b": api14 PROCESSING\n\n"
# Byte for byte the mid-stream error chunk of the api14 streaming doc (its spaces included).
API14_MIDSTREAM = (
    b'data: { "error": { "code": 502, "message": "Provider disconnected" }, '
    b'"choices": [{ "delta": { "content": "" }, "finish_reason": "error" }] }\n\n'
)
INFYRENCE_MIDSTREAM = (
    b'data: {"error":{"message":"Upstream provider unavailable",'
    b'"type":"upstream_error","code":"upstream_unavailable"}}\n\n'
)

I14_MODEL = "i14-sugarglider-nemotron3-super-120B-v1"
I14_DEFAULT_MAX_TOKENS = 100
RETRY_AFTER = "7"
# Replaced by the send time (unix seconds) just before a stamped piece is written.
STAMP = b"@0000000000.000000 "


@dataclass(frozen=True, slots=True)
class ModelInfo:
    owned_by: str
    created: int
    reasoning: int = 0  # default number of reasoning chunks
    price_in: int = 0  # api14 prices in nano-dollars per token
    price_out: int = 0


MODELS: dict[str, dict[str, ModelInfo]] = {
    "i14": {I14_MODEL: ModelInfo("i14", 1788000000, reasoning=8)},
    "api14": {
        # 0.25 $/M in, 2 $/M out: the doc sample (10 + 3 tokens -> 0.0000085) matches exactly.
        "openai/gpt-5-mini": ModelInfo("openai", 1754000000, price_in=250, price_out=2000),
        "deepseek/deepseek-r1": ModelInfo("deepseek", 1737000000, reasoning=8, price_in=550, price_out=2190),
    },
    "infyrence": {
        "claude-sonnet-5": ModelInfo("anthropic", 1770000000),
        "gpt-4.1-mini": ModelInfo("openai", 1744000000),
    },
}

# (type, code, message) per HTTP status, for errors before the first byte.
_ERRORS: dict[int, tuple[str, str, str]] = {
    400: ("invalid_request_error", "invalid_request", "Invalid request."),
    401: ("authentication_error", "invalid_api_key", "Invalid API key provided."),
    402: ("invalid_request_error", "insufficient_balance", "Insufficient balance."),
    403: ("permission_error", "permission_denied", "You do not have access to this resource."),
    404: ("invalid_request_error", "not_found", "Not found."),
    405: ("invalid_request_error", "method_not_allowed", "Method not allowed."),
    408: ("timeout_error", "request_timeout", "Request timed out."),
    413: ("invalid_request_error", "request_too_large", "Request body too large."),
    429: ("rate_limit_error", "rate_limit_exceeded", "Rate limit exceeded, retry after 7 seconds."),
    500: ("server_error", "internal_error", "Internal server error."),
    502: ("server_error", "bad_gateway", "Upstream provider unavailable."),
    503: ("server_error", "service_unavailable", "The service is temporarily overloaded."),
    504: ("server_error", "gateway_timeout", "The upstream timed out."),
}

# Deterministic "token" lengths; the first two give "Ok", "ay, t" as in the i14 doc sample.
_PIECE_LENGTHS = (2, 5, 3, 4, 1, 6, 8, 3, 7, 2, 4, 5)
_REASONING_TEXT = (
    "Okay, the user sent a message to the demo upstream. I should quote it back, "
    "add a small table, a short list and a code sample, and keep the tone friendly. "
)
_FILLER_WORDS = (
    "Streaming tokens from the demo upstream keeps the relay busy while the benchmark "
    "measures latency, throughput and fairness across many concurrent streams."
).split()
# [[shape:paragraph]] and [[shape:code]]: one long paragraph with inline markup, one long code block.
_PARAGRAPH_TEXT = "Some **bold** words, a [link](https://example.com/) and `code` in one long paragraph. "
_CODE_TEXT = (
    "def total(items):\n    result = 0\n    for item in items:\n"
    "        result += item.price * item.count\n    return result\n\n"
)
_TOOL_ARGS = ('{"city": "Paris", "unit": "celsius"}', '{"city": "Tokyo", "unit": "celsius"}')
_ALNUM = string.ascii_letters + string.digits
_PH = "\x00"
_PH_JSON = encode_basestring(_PH)  # '"\\u0000"'
_COST_PH = "\x01cost"
_COST_PH_JSON = encode_basestring(_COST_PH)
_NO_FINISH = object()
MALFORMED_LINE = b"data: {unreadable\n\n"
# Upper bounds of the numeric directives when the fake serves as the demo upstream.
DEMO_CAPS = {"chunks": 5000, "size": 2000, "reasoning": 1000, "delay": 2000, "wait": 10000, "malformed": 10}


class UpstreamCut(Exception):
    """Raised inside the app to abort a response mid-body (the [[fault:cut]] scenario)."""


class _DropUpstreamCut(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, UpstreamCut)


# A deliberate cut is not an application error: keep the servers' logs quiet about it.
for _name in ("uvicorn.error", "daphne.server"):
    logging.getLogger(_name).addFilter(_DropUpstreamCut())


@dataclass(eq=False)
class StreamRecord:
    """What the fake saw and did for one chat/completions request."""

    dialect: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    sent_at: list[float] = field(default_factory=list)  # one per data: event, [DONE] included
    sent: list[bytes] = field(default_factory=list)  # exact bytes of each data: event
    disconnected_at: float | None = None
    disconnected: threading.Event = field(default_factory=threading.Event)
    completed: threading.Event = field(default_factory=threading.Event)
    # Extras, handy for assertions.
    id: str = ""  # completion id (for infyrence also the X-Request-Id)
    model: str | None = None
    stream: bool = False
    status: int | None = None  # HTTP status sent
    directives: dict[str, str] = field(default_factory=dict)
    finish_reason: str | None = None  # None when the stream was faulted/cut
    comments: list[bytes] = field(default_factory=list)  # SSE comment lines written

    def text(self) -> bytes:
        """All data: events joined (comments excluded)."""
        return b"".join(self.sent)


# --------------------------------------------------------------------------- helpers


def _rand(n: int) -> str:
    return "".join(random.choices(_ALNUM, k=n))


def _new_id(dialect: str) -> str:
    if dialect == "i14":
        return "req_" + secrets.token_hex(16)
    if dialect == "api14":
        return f"gen-{int(time.time())}-{_rand(20)}"
    return "chatcmpl_" + _rand(24)


def _split(text: str, start: int = 0) -> list[str]:
    out: list[str] = []
    i = 0
    k = start
    n = len(text)
    while i < n:
        step = _PIECE_LENGTHS[k % len(_PIECE_LENGTHS)]
        out.append(text[i : i + step])
        i += step
        k += 1
    return out


def _cycle_pieces(text: str, n: int) -> list[str]:
    base = _split(text)
    return [base[i % len(base)] for i in range(n)]


def _shaped(shape: str, n: int) -> list[str] | None:
    """N content pieces forming one block: a paragraph, or a python code block (fences included)."""
    if shape == "paragraph":
        return _cycle_pieces(_PARAGRAPH_TEXT, n)
    if shape == "code":
        return ["```python\n", *_cycle_pieces(_CODE_TEXT, max(0, n - 2)), "\n```\n"][:n]
    return None


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def _capped(directives: dict[str, str], caps: dict[str, int]) -> dict[str, str]:
    """The directives with each numeric one lowered to its cap."""
    out = dict(directives)
    for name, cap in caps.items():
        try:
            value = float(out[name])
        except (KeyError, ValueError):
            continue
        if not value <= cap:  # NaN too
            out[name] = str(cap)
    return out


def _fmt_cost(nano: int) -> str:
    """USD with plain decimals, as in the api14 doc ("cost":0.0000085)."""
    s = f"{nano // 10**9}.{nano % 10**9:09d}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def _nonneg_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        return None
    return n if n >= 0 else None


def _default_answer(dialect: str, model: str, text: str) -> str:
    quoted = "\n".join(f"> {line}" if line else ">" for line in text.splitlines()) or "> (an empty message)"
    return (
        f"Hi! This reply comes from the **demo upstream** ({dialect}, model `{model}`), "
        "a built-in stand-in used when no real provider is configured.\n\n"
        f"You wrote:\n\n{quoted}\n\n"
        "| What | Value |\n"
        "| --- | --- |\n"
        f"| Provider | {dialect} |\n"
        f"| Model | `{model}` |\n"
        f"| Characters | {len(text)} |\n\n"
        "A few things to know:\n\n"
        "- The reply is deterministic: ask again and you get the same text.\n"
        "- Tables, lists and code are rendered as markdown.\n"
        "- Configure a real upstream to talk to an actual model.\n\n"
        "```python\n"
        "def greet(name: str) -> str:\n"
        '    return f"Hello, {name}!"\n'
        "```\n\n"
        "Thanks for trying the relay!"
    )


def _tool_items() -> list[list[dict[str, Any]]]:
    """delta.tool_calls fragments for two get_weather calls, arguments interleaved by index."""
    items: list[list[dict[str, Any]]] = []
    frags = []
    for index, args in enumerate(_TOOL_ARGS):
        items.append(
            [
                {
                    "index": index,
                    "id": "call_" + _rand(24),
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        )
        frags.append(_split(args, start=index))
    for i in range(max(len(f) for f in frags)):
        for index, pieces in enumerate(frags):
            if i < len(pieces):
                items.append([{"index": index, "function": {"arguments": pieces[i]}}])
    return items


def _assemble_tools(items: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    calls: dict[int, dict[str, Any]] = {}
    for frag_list in items:
        for frag in frag_list:
            call = calls.get(frag["index"])
            if call is None:
                call = calls[frag["index"]] = {
                    "id": frag.get("id", ""),
                    "type": "function",
                    "function": {"name": frag["function"].get("name", ""), "arguments": ""},
                }
            call["function"]["arguments"] += frag["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)]


# --------------------------------------------------------------------------- plan


@dataclass(slots=True)
class _Plan:
    dialect: str
    model: str
    info: ModelInfo
    cid: str
    created: int
    reasoning: list[str]
    content: list[Any]  # str pieces, or tool_calls fragment lists when tools
    tools: bool
    finish_reason: str
    fault: str | None
    half: int
    prompt_tokens: int
    delay: float
    comment: bool
    include_usage: bool
    stamp: bool = False  # prefix each content piece with "@<unix time> " (benchmarks)
    malformed: int = 0  # unreadable data: lines, one after each of the first N content pieces

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning) + len(self.content)


# --------------------------------------------------------------------------- encoders


class _Encoder:
    """Builds the exact bytes of one dialect's chunks, with precomputed prefixes/suffixes."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.dialect = plan.dialect
        if self.dialect == "i14":
            self.dumps = lambda o: json.dumps(o, ensure_ascii=False)
        else:
            self.dumps = lambda o: json.dumps(o, ensure_ascii=False, separators=(",", ":"))
        head: dict[str, Any] = {"id": plan.cid, "object": "chat.completion.chunk"}
        if self.dialect != "api14":
            head["created"] = plan.created
        head["model"] = plan.model
        self.head = head
        # i14 documents delta.reasoning_content, api14 delta.reasoning; infyrence documents no
        # reasoning field, so it gets the gateway convention, delta.reasoning.
        self.reasoning_key = "reasoning_content" if self.dialect == "i14" else "reasoning"
        self._templates: dict[tuple[str, bool], tuple[bytes, bytes]] = {}

    def _choice(self, delta: dict[str, Any], finish: Any = _NO_FINISH) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        if finish is not _NO_FINISH:
            choice["finish_reason"] = finish
        elif self.dialect != "api14":  # api14 omits finish_reason on non-final chunks
            choice["finish_reason"] = None
        return choice

    def chunk(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        return {**self.head, "choices": choices, **extra}

    def event(self, obj: Any) -> bytes:
        return b"data: " + self.dumps(obj).encode() + b"\n\n"

    def piece(self, kind: str, text: str, first: bool) -> bytes:
        tpl = self._templates.get((kind, first))
        if tpl is None:
            key = self.reasoning_key if kind == "r" else "content"
            delta = {"role": "assistant", key: _PH} if first else {key: _PH}
            prefix, suffix = self.event(self.chunk([self._choice(delta)])).decode().split(_PH_JSON, 1)
            tpl = self._templates[(kind, first)] = (prefix.encode(), suffix.encode())
        return tpl[0] + encode_basestring(text).encode() + tpl[1]

    def tool(self, frags: list[dict[str, Any]], first: bool) -> bytes:
        delta: dict[str, Any] = {"role": "assistant", "tool_calls": frags} if first else {"tool_calls": frags}
        return self.event(self.chunk([self._choice(delta)]))

    def opening(self) -> bytes | None:
        if self.dialect == "infyrence":
            return self.event(self.chunk([self._choice({"role": "assistant", "content": ""})]))
        return None

    def usage(self) -> dict[str, Any]:
        p = self.plan
        usage: dict[str, Any] = {
            "prompt_tokens": p.prompt_tokens,
            "completion_tokens": p.completion_tokens,
            "total_tokens": p.prompt_tokens + p.completion_tokens,
        }
        if self.dialect == "i14":
            usage["completion_tokens_details"] = {"reasoning_tokens": len(p.reasoning)}
        elif self.dialect == "api14":
            usage["cost"] = _COST_PH
            if p.reasoning:
                usage["completion_tokens_details"] = {"reasoning_tokens": len(p.reasoning)}
        return usage

    def fix_cost(self, data: bytes) -> bytes:
        if self.dialect != "api14":
            return data
        p = self.plan
        nano = p.prompt_tokens * p.info.price_in + p.completion_tokens * p.info.price_out
        return data.replace(_COST_PH_JSON.encode(), _fmt_cost(nano).encode(), 1)

    def perf(self, started: float, first_at: float | None, ended: float) -> dict[str, float]:
        gen = max(ended - started, 1e-4)
        ttft = (first_at if first_at is not None else ended) - started
        return {
            "tokens_per_second": round(self.plan.completion_tokens / gen, 3),
            "generation_time_s": round(gen, 4),
            "time_to_first_token_s": round(ttft, 4),
        }

    def finish(self, started: float, first_at: float | None) -> list[bytes]:
        p = self.plan
        fin = self._choice({}, p.finish_reason)
        if self.dialect == "i14":
            perf = self.perf(started, first_at, time.monotonic())
            return [
                self.event(self.chunk([fin], usage=None)),
                self.event(self.chunk([], usage=self.usage(), x_i14_perf=perf)),
            ]
        if self.dialect == "api14":
            return [self.fix_cost(self.event(self.chunk([fin], usage=self.usage())))]
        out = [self.event(self.chunk([fin]))]
        if p.include_usage:
            out.append(self.event(self.chunk([], usage=self.usage())))
        return out

    def midstream(self) -> list[bytes]:
        if self.dialect == "api14":
            return [API14_MIDSTREAM]
        return [INFYRENCE_MIDSTREAM, DONE]

    def completion(self, started: float, ended: float) -> bytes:
        """The non-stream chat.completion body."""
        p = self.plan
        message: dict[str, Any] = {"role": "assistant"}
        if p.tools:
            message["content"] = None
        else:
            message["content"] = "".join(p.content)
        reasoning = "".join(p.reasoning)
        if self.dialect == "i14":
            message["reasoning_content"] = reasoning
        elif p.reasoning:
            message[self.reasoning_key] = reasoning
        if p.tools:
            message["tool_calls"] = _assemble_tools(p.content)
        head = {**self.head, "object": "chat.completion"}
        body: dict[str, Any] = {
            **head,
            "choices": [{"index": 0, "message": message, "finish_reason": p.finish_reason}],
            "usage": self.usage(),
        }
        if self.dialect == "i14":
            body["x_i14_perf"] = self.perf(started, started + (ended - started) / max(p.completion_tokens, 1), ended)
        return self.fix_cost(self.dumps(body).encode())


# --------------------------------------------------------------------------- the app


class _State:
    __slots__ = ("disconnected", "ended")

    def __init__(self) -> None:
        self.disconnected = False
        self.ended = False


def _cookie(record: StreamRecord) -> list[tuple[bytes, bytes]]:
    """The bot-management cookie a CDN in front of a provider sets on API answers ([[cookie]])."""
    if "cookie" not in record.directives:
        return []
    return [(b"set-cookie", b"__cf_bm=%s; path=/; HttpOnly; SameSite=None" % secrets.token_hex(16).encode())]


class FakeUpstream:
    """ASGI app reproducing the i14, api14 and infyrence wire formats, with faults on demand.

    Directives, written in the last user message (and removed from its text):

    ``[[echo]]`` answer = the user's text; ``[[chunks:N]]`` N filler content chunks;
    ``[[reasoning:N]]`` N reasoning chunks first; ``[[delay:MS]]`` pause between chunks;
    ``[[fault:cut|eof|midstream|malformed|stall]]`` break the stream after half the content
    (``stall``: send nothing more, the connection left open, until the client goes);
    ``[[status:CODE]]`` fail before the first byte; ``[[tools]]`` two streamed tool calls;
    ``[[length]]`` stop after a third with finish_reason "length"; ``[[comment]]``
    ``: keep-alive`` comment lines between chunks; ``[[stamp]]`` each content piece
    starts with ``@<unix time of sending> `` (for latency benchmarks).
    ``[[size:N]]`` each filler chunk (``chunks:N``) is N characters long (one N-byte line of
    ~1000-character paragraphs);
    ``[[malformed:N]]`` an unreadable ``data:`` line after each of the first N content
    chunks, the stream going on; ``[[wait:MS]]`` nothing at all (not even headers) for MS
    before the answer; with ``[[status:CODE]]``: ``[[html]]`` an HTML error page instead of
    JSON, ``[[echoauth]]`` the request's Authorization header echoed in the error message.
    ``[[cookie]]`` a ``Set-Cookie`` on the answer, as providers behind a CDN send (``__cf_bm``).
    ``[[finish:TEXT]]`` the finish_reason of a finished stream; ``[[longid]]`` a 300-character
    completion id (also infyrence's X-Request-Id). ``[[shape:paragraph|code]]`` with ``chunks:N``:
    the N chunks make one paragraph with inline markup, or one python code block (fences included).
    """

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

    def last(self) -> StreamRecord:
        return self.streams[-1]

    def reset(self) -> None:
        self.streams.clear()

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
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        match = ROUTE_RE.search(path)
        if match is None:
            await self._read_body(receive)
            guess = DIALECT_RE.search(path)
            dialect = guess.group(1) if guess else None
            rid = "req_" + secrets.token_hex(12)
            await self._error(send, dialect, 404, f"Unknown route: {method} {path}", rid=rid)
            return
        dialect, endpoint = match.groups()

        if endpoint == "models":
            await self._read_body(receive)
            rid = "req_" + secrets.token_hex(12)
            if method not in ("GET", "HEAD"):
                await self._error(send, dialect, 405, f"Method {method} not allowed.", rid=rid, allow="GET")
            elif not self._authorized(headers):
                await self._error(send, dialect, 401, rid=rid)
            else:
                await self._models(send, dialect, rid)
            return

        record = StreamRecord(dialect=dialect, path=path, headers=headers)
        record.id = _new_id(dialect)
        self.streams.append(record)
        state = _State()
        watcher: asyncio.Task[None] | None = None
        try:
            raw, disconnected = await self._read_body(receive)
            if disconnected:
                self._mark_disconnected(record, state)
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
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks), True
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks), False

    @staticmethod
    def _mark_disconnected(record: StreamRecord, state: _State) -> None:
        if not state.disconnected:
            state.disconnected = True
            record.disconnected_at = time.monotonic()
            record.disconnected.set()

    async def _watch(self, receive: Any, record: StreamRecord, state: _State) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not state.ended:
                    self._mark_disconnected(record, state)
                return

    def _authorized(self, headers: dict[str, str]) -> bool:
        return headers.get("authorization") == f"Bearer {self.api_key}"

    @staticmethod
    async def _respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        if not any(name == b"content-type" for name, _ in headers):
            headers = [(b"content-type", b"application/json"), *headers]
        headers = [(b"content-length", str(len(body)).encode()), *headers]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    @staticmethod
    def error_body(
        dialect: str | None,
        status: int,
        message: str | None = None,
        *,
        type_: str | None = None,
        code: str | None = None,
        rid: str | None = None,
    ) -> bytes:
        """The dialect's JSON error body for an error before the first byte."""
        d_type, d_code, d_message = _ERRORS.get(
            status,
            (
                "server_error" if status >= 500 else "invalid_request_error",
                f"http_{status}",
                http.HTTPStatus(status).phrase + ".",
            ),
        )
        if dialect == "infyrence" and status == 502:
            d_type, d_code = "upstream_error", "upstream_unavailable"
        message = message or d_message
        if dialect == "api14":
            return json.dumps(
                {"error": {"code": status, "message": message}}, ensure_ascii=False, separators=(",", ":")
            ).encode()
        error = {"message": message, "type": type_ or d_type, "code": code or d_code}
        if dialect == "infyrence":
            error["request_id"] = rid or ""
            return json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":")).encode()
        return json.dumps({"error": error}, ensure_ascii=False).encode()

    async def _error(
        self,
        send: Any,
        dialect: str | None,
        status: int,
        message: str | None = None,
        *,
        type_: str | None = None,
        code: str | None = None,
        rid: str | None = None,
        allow: str | None = None,
        record: StreamRecord | None = None,
    ) -> None:
        body = self.error_body(dialect, status, message, type_=type_, code=code, rid=rid)
        headers: list[tuple[bytes, bytes]] = []
        if dialect == "infyrence" and rid:
            headers.append((b"x-request-id", rid.encode()))
        if status == 429:
            headers.append((b"retry-after", RETRY_AFTER.encode()))
        if allow:
            headers.append((b"allow", allow.encode()))
        if record is not None:
            record.status = status
        await self._respond(send, status, body, headers)

    async def _models(self, send: Any, dialect: str, rid: str) -> None:
        data = [
            {"id": model_id, "object": "model", "created": info.created, "owned_by": info.owned_by}
            for model_id, info in MODELS[dialect].items()
        ]
        obj = {"object": "list", "data": data}
        if dialect == "i14":
            body = json.dumps(obj).encode()
        else:
            body = json.dumps(obj, separators=(",", ":")).encode()
        headers = [(b"x-request-id", rid.encode())] if dialect == "infyrence" else []
        await self._respond(send, 200, body, headers)

    # ------------------------------------------------------------------ chat/completions

    async def _completions(
        self,
        send: Any,
        record: StreamRecord,
        state: _State,
        watcher: asyncio.Task[None],
        method: str,
        raw: bytes,
    ) -> None:
        dialect = record.dialect
        rid = record.id

        async def fail(status: int, message: str | None = None, **kw: Any) -> None:
            state.ended = True  # a disconnect seen after this is the normal end, not a client leaving
            await self._error(send, dialect, status, message, rid=rid, record=record, **kw)

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
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            return await fail(400, "'max_tokens' must be a positive integer.")

        # Directives come from the last user message.
        text = ""
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                text = _message_text(message.get("content"))
                break
        directives = {name: value or "" for name, value in DIRECTIVE_RE.findall(text)}
        if self.caps:
            directives = _capped(directives, self.caps)
        record.directives = directives
        clean = DIRECTIVE_RE.sub("", text).strip()
        if "longid" in directives:
            record.id = rid = (record.id + "x" * 300)[:300]

        wait = _nonneg_int(directives.get("wait"))
        if wait:
            await asyncio.wait({watcher}, timeout=wait / 1000)  # silence, unless the client leaves
            if state.disconnected:
                return

        status = _nonneg_int(directives.get("status"))
        if status is not None and 400 <= status <= 599:
            try:
                http.HTTPStatus(status)
            except ValueError:
                status = None
            if status is not None and "html" in directives:
                state.ended = True
                record.status = status
                phrase = http.HTTPStatus(status).phrase
                page = f"<html>\r\n<head><title>{status} {phrase}</title></head>\r\n<body>\r\n"
                page += f"<center><h1>{status} {phrase}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n"
                page += "</html>\r\n" + "<!-- padding -->\r\n" * 6
                headers = [(b"content-type", b"text/html")]
                return await self._respond(send, status, page.encode(), headers)
            if status is not None and "echoauth" in directives:
                authorization = record.headers.get("authorization", "")
                return await fail(status, f"Request refused (you sent Authorization: {authorization}).")
            if status is not None:
                return await fail(status)

        plan = self._plan(dialect, model, info, record.id, body, messages, directives, clean, max_tokens)
        if record.stream:
            await self._stream(send, record, state, plan, watcher)
        else:
            await self._non_stream(send, record, state, watcher, plan)

    def _plan(
        self,
        dialect: str,
        model: str,
        info: ModelInfo,
        cid: str,
        body: dict[str, Any],
        messages: list[Any],
        directives: dict[str, str],
        clean: str,
        max_tokens: int | None,
    ) -> _Plan:
        prompt_tokens = 0
        for message in messages:
            if isinstance(message, dict):
                prompt_tokens += 4 + len(_message_text(message.get("content")).split())

        n_reasoning = _nonneg_int(directives.get("reasoning"))
        if n_reasoning is None:
            n_reasoning = info.reasoning
        reasoning = _cycle_pieces(_REASONING_TEXT, n_reasoning)

        tools = "tools" in directives
        n_chunks = _nonneg_int(directives.get("chunks"))
        content: list[Any]
        if tools:
            content = _tool_items()
        elif n_chunks is not None and _nonneg_int(directives.get("size")):
            size = _nonneg_int(directives.get("size")) or 0
            # Paragraphs of about 1000 characters, as a long real answer has.
            paragraph = (" ".join(_FILLER_WORDS) + " ") * 7
            paragraph = paragraph[:998].rstrip() + ".\n\n"
            piece = (paragraph * (size // len(paragraph) + 1))[:size]
            content = [piece] * n_chunks
        elif n_chunks is not None and _shaped(directives.get("shape", ""), 0) is not None:
            content = _shaped(directives["shape"], n_chunks) or []
        elif n_chunks is not None:
            content = [_FILLER_WORDS[i % len(_FILLER_WORDS)] + " " for i in range(n_chunks)]
        elif "echo" in directives:
            content = [clean[i : i + 4] for i in range(0, len(clean), 4)]
        else:
            answer = _default_answer(dialect, model, clean)
            if dialect == "i14":
                answer = "\n\n" + answer  # i14 answers start with a blank line (doc samples)
            content = _split(answer)
        finish = directives.get("finish") or ("tool_calls" if tools else "stop")

        if "length" in directives:
            content = content[: max(1, len(content) // 3)] if content else content
            finish = "length"
        if max_tokens is None and dialect == "i14":
            max_tokens = I14_DEFAULT_MAX_TOKENS
        if max_tokens is not None and len(reasoning) + len(content) > max_tokens:
            reasoning = reasoning[:max_tokens]
            content = content[: max_tokens - len(reasoning)]
            finish = "length"

        fault = directives.get("fault") or None
        if fault not in ("cut", "eof", "midstream", "malformed", "stall"):
            fault = None
        if fault == "midstream" and dialect == "i14":
            fault = "cut"  # i14 documents no mid-stream error form

        delay = self.delay
        if "delay" in directives:
            try:
                delay = max(0.0, float(directives["delay"]) / 1000.0)
            except ValueError:
                pass

        stream_options = body.get("stream_options")
        include_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        created = int(time.time())
        return _Plan(
            dialect=dialect,
            model=model,
            info=info,
            cid=cid,
            created=created,
            reasoning=reasoning,
            content=content,
            tools=tools,
            finish_reason=finish,
            fault=fault,
            half=len(content) // 2,
            prompt_tokens=prompt_tokens,
            delay=delay,
            comment="comment" in directives,
            include_usage=include_usage,
            stamp="stamp" in directives,
            malformed=_nonneg_int(directives.get("malformed")) or 0,
        )

    def _events(self, plan: _Plan, enc: _Encoder, record: StreamRecord) -> Iterator[bytes]:
        """Yield the data: events of the stream, in order (lazily: usage reads the clock)."""
        opening = enc.opening()
        first = opening is None
        if opening is not None:
            yield opening
        for piece in plan.reasoning:
            yield enc.piece("r", piece, first)
            first = False
        content = plan.content[: plan.half] if plan.fault else plan.content
        if plan.tools:
            for frags in content:
                yield enc.tool(frags, first)
                first = False
        else:
            for index, piece in enumerate(content):
                yield enc.piece("c", STAMP.decode() + piece if plan.stamp else piece, first)
                first = False
                if index < plan.malformed:
                    yield MALFORMED_LINE
        if plan.fault == "midstream":
            yield from enc.midstream()
            return
        if plan.fault == "malformed":
            # The next chunk, broken off in the middle of its JSON: an unreadable frame.
            whole = enc.piece("c", "unreadable", first)
            yield whole[: len(whole) // 2].rstrip(b"\n") + b"\n\n"
            return
        if plan.fault:
            return
        yield from enc.finish(record.started_at, record.sent_at[0] if record.sent_at else None)
        yield DONE

    async def _stream(self, send: Any, record: StreamRecord, state: _State, plan: _Plan, watcher: asyncio.Task) -> None:
        enc = _Encoder(plan)
        headers = [(b"content-type", b"text/event-stream")]
        if plan.dialect == "infyrence":
            headers += [
                (b"cache-control", b"no-cache"),
                (b"connection", b"keep-alive"),
                (b"x-request-id", record.id.encode()),
            ]
        headers += _cookie(record)
        record.status = 200
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        api14 = plan.dialect == "api14"
        if api14:
            await send({"type": "http.response.body", "body": API14_PROCESSING, "more_body": True})
            record.comments.append(API14_PROCESSING)
        midway = (len(plan.reasoning) + len(plan.content)) // 2 if api14 and (plan.delay > 0 or plan.comment) else -1
        if plan.fault:
            midway = min(midway, (len(plan.reasoning) + plan.half) // 2)

        delay = plan.delay
        sleep = asyncio.sleep
        monotonic = time.monotonic
        sent = record.sent
        sent_at = record.sent_at
        i = 0
        for event in self._events(plan, enc, record):
            if i:
                if delay:
                    await sleep(delay)
                elif not i & 15:
                    await sleep(0)  # let other streams and the disconnect watcher run
                if state.disconnected:
                    break
                if plan.comment:
                    await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                    record.comments.append(KEEPALIVE)
                if i == midway:
                    await send({"type": "http.response.body", "body": API14_PROCESSING, "more_body": True})
                    record.comments.append(API14_PROCESSING)
            if plan.stamp:
                event = event.replace(STAMP, f"@{time.time():.6f} ".encode(), 1)
            await send({"type": "http.response.body", "body": event, "more_body": True})
            sent_at.append(monotonic())
            if self.keep_bytes:
                sent.append(event)
            i += 1
        if state.disconnected:
            return
        if plan.fault == "stall":
            await watcher  # ends when the client disconnects
            return
        state.ended = True
        if plan.fault == "cut":
            raise UpstreamCut(f"fault:cut after {len(sent)} events")
        if plan.fault is None:
            record.finish_reason = plan.finish_reason
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _non_stream(
        self, send: Any, record: StreamRecord, state: _State, watcher: asyncio.Task[None], plan: _Plan
    ) -> None:
        enc = _Encoder(plan)
        total_delay = plan.delay * plan.completion_tokens
        if total_delay > 0:
            await asyncio.wait({watcher}, timeout=total_delay)  # "generate", unless the client leaves
            if state.disconnected:
                return
        fault = plan.fault
        if fault == "malformed":
            fault = "eof"  # a truncated JSON body
        if fault == "midstream":
            state.ended = True
            if plan.dialect == "api14":
                return await self._error(send, "api14", 502, "Provider disconnected", rid=record.id, record=record)
            return await self._error(
                send, plan.dialect, 502, "Upstream provider unavailable", rid=record.id, record=record
            )
        body = enc.completion(record.started_at, time.monotonic())
        headers = [(b"x-request-id", record.id.encode())] if plan.dialect == "infyrence" else []
        headers += _cookie(record)
        record.status = 200
        if fault == "eof":
            state.ended = True
            return await self._respond(send, 200, body[: len(body) // 2], headers)
        if fault in ("cut", "stall"):
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            if fault == "stall":
                await watcher  # silent until the client disconnects
                return
            state.ended = True
            raise UpstreamCut("fault:cut in a non-stream response")
        record.finish_reason = plan.finish_reason
        state.ended = True
        await self._respond(send, 200, body, headers)


app = FakeUpstream(
    api_key=os.environ.get("FAKE_UPSTREAM_KEY", "fake-key"),
    delay=float(os.environ.get("FAKE_UPSTREAM_DELAY", "0")),
    max_records=int(os.environ.get("FAKE_UPSTREAM_MAX_RECORDS", "100")),
)
