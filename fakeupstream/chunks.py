"""The exact bytes of each dialect's chunks, and their order in a stream.

The dialects' differences (separators, reasoning fields, finish and usage chunks,
mid-stream errors) are listed in the package's docstring; each is pinned here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from fakeupstream.plan import Plan

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

MALFORMED_LINE = b"data: {unreadable\n\n"
# Replaced by the send time (unix seconds) just before a stamped piece is written.
STAMP = b"@0000000000.000000 "

# A piece's place in its chunk's JSON: each kind of chunk is dumped once, then only the piece is encoded.
_PH = "\x00"
_PH_JSON = encode_basestring(_PH)  # '"\\u0000"'
# The cost's place: json would write a float ("8.5e-06"), the doc writes plain decimals.
_COST_PH = "\x01cost"
_COST_PH_JSON = encode_basestring(_COST_PH)
_NO_FINISH = object()


def _fmt_cost(nano: int) -> str:
    """USD with plain decimals, as in the api14 doc ("cost":0.0000085)."""
    s = f"{nano // 10**9}.{nano % 10**9:09d}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def _assemble_tools(items: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The whole tool calls that the streamed fragments add up to (for a non-stream answer)."""
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


class ChunkEncoder:
    """Builds the exact bytes of one dialect's chunks, with precomputed prefixes/suffixes."""

    def __init__(self, plan: Plan) -> None:
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
        """The one choice of a chunk, finish_reason as the dialect writes it."""
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        if finish is not _NO_FINISH:
            choice["finish_reason"] = finish
        elif self.dialect != "api14":  # api14 omits finish_reason on non-final chunks
            choice["finish_reason"] = None
        return choice

    def chunk(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        """A chunk object: the common head, the choices, any extra fields."""
        return {**self.head, "choices": choices, **extra}

    def event(self, obj: Any) -> bytes:
        """A data: event of the object in the dialect's JSON."""
        return b"data: " + self.dumps(obj).encode() + b"\n\n"

    def piece(self, kind: str, text: str, first: bool) -> bytes:
        """The event of one reasoning ("r") or content ("c") piece; the first one carries the role."""
        tpl = self._templates.get((kind, first))
        if tpl is None:
            key = self.reasoning_key if kind == "r" else "content"
            delta = {"role": "assistant", key: _PH} if first else {key: _PH}
            prefix, suffix = self.event(self.chunk([self._choice(delta)])).decode().split(_PH_JSON, 1)
            tpl = self._templates[(kind, first)] = (prefix.encode(), suffix.encode())
        return tpl[0] + encode_basestring(text).encode() + tpl[1]

    def tool(self, frags: list[dict[str, Any]], first: bool) -> bytes:
        """The event of one set of tool_calls fragments."""
        delta: dict[str, Any] = {"role": "assistant", "tool_calls": frags} if first else {"tool_calls": frags}
        return self.event(self.chunk([self._choice(delta)]))

    def opening(self) -> bytes | None:
        """The empty-content chunk infyrence opens with; None for the others."""
        if self.dialect == "infyrence":
            return self.event(self.chunk([self._choice({"role": "assistant", "content": ""})]))
        return None

    def usage(self) -> dict[str, Any]:
        """The usage object, with the dialect's extras (reasoning tokens, api14's cost placeholder)."""
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
        """The bytes with api14's cost placeholder replaced by the price of the answer."""
        if self.dialect != "api14":
            return data
        p = self.plan
        nano = p.prompt_tokens * p.info.price_in + p.completion_tokens * p.info.price_out
        return data.replace(_COST_PH_JSON.encode(), _fmt_cost(nano).encode(), 1)

    def perf(self, started: float, first_at: float | None, ended: float) -> dict[str, float]:
        """i14's x_i14_perf timings."""
        gen = max(ended - started, 1e-4)
        ttft = (first_at if first_at is not None else ended) - started
        return {
            "tokens_per_second": round(self.plan.completion_tokens / gen, 3),
            "generation_time_s": round(gen, 4),
            "time_to_first_token_s": round(ttft, 4),
        }

    def finish(self, started: float, first_at: float | None) -> list[bytes]:
        """The events that end a finished stream, usage included where the dialect sends it ([DONE] excluded)."""
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
        """The events of a mid-stream error (api14, infyrence)."""
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


def stream_events(enc: ChunkEncoder, started_at: float, sent_at: list[float]) -> Iterator[bytes]:
    """The data: events of the stream, in order (lazily: usage reads the clock, SENT_AT fills as they go)."""
    plan = enc.plan
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
    yield from enc.finish(started_at, sent_at[0] if sent_at else None)
    yield DONE
