"""What one answer will be, decided from the request and its directives before a byte is sent."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from fakeupstream.dialects import I14_DEFAULT_MAX_TOKENS, ModelInfo
from fakeupstream.directives import FAULTS, last_user_text, message_text, nonneg_int
from fakeupstream.texts import (
    default_answer,
    filler_pieces,
    named_call_items,
    reasoning_pieces,
    shaped_pieces,
    sized_filler,
    split_pieces,
    tool_call_items,
)


@dataclass(slots=True)
class Plan:
    """The pieces, finish, fault and pacing of one answer."""

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
    hold: int = 0  # after this many data: events, nothing more until the record is released (0: never held)

    @property
    def completion_tokens(self) -> int:
        """Reasoning and content pieces: one "token" each."""
        return len(self.reasoning) + len(self.content)


def _prompt_tokens(messages: list[Any]) -> int:
    """A rough token count of the messages: their words, and 4 per message."""
    tokens = 0
    for message in messages:
        if isinstance(message, dict):
            tokens += 4 + len(message_text(message.get("content")).split())
    return tokens


def tool_results(messages: list[Any]) -> list[str]:
    """The contents of the tool messages that end the conversation: the answers to the last tool calls."""
    results: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            break
        results.insert(0, message_text(message.get("content")))
    return results


# [[call:NAME {json arguments}]]: a tool call the answer asks for ("." in NAME becomes "__", as the chat names tools).
CALL_RE = re.compile(r"\[\[call:([\w.-]+)\s*(\{[^\]]*\})?\]\]")


def named_calls(messages: list[Any]) -> list[tuple[str, str]]:
    """The calls the last user message asks for with [[call:…]], as (function name, arguments JSON)."""
    return [(name.replace(".", "__"), args or "{}") for name, args in CALL_RE.findall(last_user_text(messages))]


def rounds_done(messages: list[Any]) -> int:
    """Assistant messages with tool calls since the last user message: the rounds of calls made so far."""
    done = 0
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") == "user":
            break
        if message.get("role") == "assistant" and message.get("tool_calls"):
            done += 1
    return done


def _content(dialect: str, model: str, directives: dict[str, str], clean: str, results: list[str],
             calls: list[tuple[str, str]] | None = None) -> list[Any]:  # fmt: skip
    """The answer's content pieces (tool-call fragments with [[tools]] or [[call:…]]), before any cut."""
    n_chunks = nonneg_int(directives.get("chunks"))
    if calls:  # another round of the named calls
        return named_call_items(calls)
    if "call" in directives and results:
        return split_pieces("Tool results: " + "; ".join(results))
    if "tools" in directives and results:  # the tools answered: the loop's next step is text that uses them
        return split_pieces("Tool results: " + "; ".join(results))
    if "tools" in directives:
        return tool_call_items()
    if n_chunks is not None and nonneg_int(directives.get("size")):
        return [sized_filler(nonneg_int(directives.get("size")) or 0)] * n_chunks
    if n_chunks is not None and shaped_pieces(directives.get("shape", ""), 0) is not None:
        return shaped_pieces(directives["shape"], n_chunks) or []
    if n_chunks is not None:
        return filler_pieces(n_chunks)
    if "echo" in directives:
        return [clean[i : i + 4] for i in range(0, len(clean), 4)]
    if "nul" in directives:  # a model that emits U+0000, escaped in the JSON as any encoder writes it
        return ["before", "\x00", " after"]
    answer = default_answer(dialect, model, clean)
    if dialect == "i14":
        answer = "\n\n" + answer  # i14 answers start with a blank line (doc samples)
    return split_pieces(answer)


def _fault(dialect: str, directives: dict[str, str]) -> str | None:
    """The [[fault:...]] asked for, as this dialect can show it."""
    fault = directives.get("fault") or None
    if fault not in FAULTS:
        return None
    if fault == "midstream" and dialect == "i14":
        return "cut"  # i14 documents no mid-stream error form
    return fault


def _delay(directives: dict[str, str], default: float) -> float:
    """The pause between chunks, in seconds: [[delay:MS]], else the app's."""
    try:
        return max(0.0, float(directives["delay"]) / 1000.0)
    except (KeyError, ValueError):
        return default


def plan_answer(
    *,
    dialect: str,
    model: str,
    info: ModelInfo,
    cid: str,
    body: dict[str, Any],
    messages: list[Any],
    directives: dict[str, str],
    clean: str,
    max_tokens: int | None,
    default_delay: float,
) -> Plan:
    """The answer to a valid request: its pieces cut by [[length]] and max_tokens, its fault and pacing."""
    prompt_tokens = _prompt_tokens(messages)
    n_reasoning = nonneg_int(directives.get("reasoning"))
    reasoning = reasoning_pieces(info.reasoning if n_reasoning is None else n_reasoning)
    results = tool_results(messages)
    tools = "tools" in directives and not results
    # [[call:…]] (with [[rounds:N]], default 1): the named calls, N rounds, then text quoting the last results.
    calls = named_calls(messages) if "call" in directives else []
    done = rounds_done(messages)
    if calls and done >= (nonneg_int(directives.get("rounds")) or 1):
        calls = []
    tools = tools or bool(calls)
    content = _content(dialect, model, directives, clean, results, calls)
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

    stream_options = body.get("stream_options")
    return Plan(
        dialect=dialect,
        model=model,
        info=info,
        cid=cid,
        created=int(time.time()),
        reasoning=reasoning,
        content=content,
        tools=tools,
        finish_reason=finish,
        fault=_fault(dialect, directives),
        half=len(content) // 2,
        prompt_tokens=prompt_tokens,
        delay=_delay(directives, default_delay),
        comment="comment" in directives,
        include_usage=isinstance(stream_options, dict) and stream_options.get("include_usage") is True,
        stamp="stamp" in directives,
        malformed=nonneg_int(directives.get("malformed")) or 0,
        hold=nonneg_int(directives.get("hold")) or 0,
    )
