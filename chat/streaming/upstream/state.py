"""What a stream says: its text, reasoning, tool calls, finish and usage, read chunk by chunk."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from chat.lib.json_depth import without_nul
from chat.lib.token_estimate import estimate_tokens
from chat.streaming.upstream.errors import UpstreamError, describe_error, html_summary, is_html, scrub, shorten

log = logging.getLogger(__name__)

DONE = b"[DONE]"


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
    # The latest event with text or a tool call: a speed needs tokens that came over time, not in one body.
    last_token_at: float | None = None
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
    # The most completion tokens the request asked for (None: no cap): an estimate never passes it.
    completion_cap: int | None = None
    # A whole (non-streamed) answer: its first token came with its last, so it has no time to first token.
    whole: bool = False
    # Refused with an error status, or never reached (note_failure): the upstream did no work and bills
    # none, so no tokens are estimated for it. A timeout or a cut may follow work a provider bills.
    unanswered: bool = False

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

        The rule for the chat, /v1 and titles: an unreadable event (parse_chunk()'s test, inline
        as this runs for every event) is skipped and counted, and only the max_malformed-th one fails the stream.
        """
        try:
            chunk = orjson.loads(without_nul(data))  # the answer is stored, and stored text never holds NUL
        except orjson.JSONDecodeError:
            chunk = None
        if isinstance(chunk, dict):
            return chunk
        self.malformed += 1
        log.warning("stream %s: an unreadable event (%d so far)", self.upstream_id or "?", self.malformed)
        if self.malformed >= self.max_malformed:
            raise UpstreamError("protocol", f"the upstream sent {self.malformed} events that are not valid JSON")
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
                        self.last_token_at = now
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
        if content or reasoning:
            self.last_token_at = now
            if self.first_token_at is None:
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
        return UpstreamError("too_large", f"the reply reached the limit of {self.max_reply} bytes")

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

    def outcome(self, failure: UpstreamError | None = None) -> str:
        """complete, failed (an upstream error, or `failure`) or interrupted (ended without a finish, or cut off)."""
        if failure is not None:
            return "interrupted" if failure.kind == "cut" else "failed"
        if self.error is not None or self.finish_reason == "error":
            return "failed"
        return "complete" if self.finished else "interrupted"

    def note_failure(self, failure: UpstreamError) -> None:
        """Remember a request that failed before the upstream worked on it: an error status, no connection, no slot."""
        if failure.kind in ("http", "connect", "busy"):
            self.unanswered = True

    def metering(self, prompt_chars: int, now: float) -> dict[str, Any]:
        """Usage in OpenAI's names plus timings; estimated from the text when the upstream sent none."""
        ended = self.ended_at or now
        usage = self.usage or {}
        details = usage.get("completion_tokens_details") or {}
        estimated = not usage and not self.unanswered
        prompt = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens"))
        reasoning = _int(details.get("reasoning_tokens") if isinstance(details, dict) else None)
        if estimated:
            prompt = estimate_tokens(prompt_chars)
            reasoning = estimate_tokens(sum(map(len, self.reasoning)))
            arguments = sum(len(c["function"]["arguments"]) for c in self.tool_calls.values())
            completion = estimate_tokens(sum(map(len, self.content)) + arguments) + reasoning
            if self.completion_cap is not None:  # characters over tokens is a guess; the request's cap is not
                completion = min(completion, self.completion_cap)
                reasoning = min(reasoning, completion)
        total = _int(usage.get("total_tokens")) or prompt + completion
        ttft = None if self.first_token_at is None or self.whole else self.first_token_at - self.started_at
        # Tokens that all came in one event (a whole, non-streamed answer) were not timed as they were made.
        # (last_token_at is set only with first_token_at.)
        timed = self.last_token_at is not None and self.last_token_at > self.first_token_at
        generating = ended - self.first_token_at if timed else 0
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
