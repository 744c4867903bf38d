"""Chat completions chunks in, Responses API events and the response object out: a small state machine (no I/O).

Each chunk's delta (the upstream's reasoning under either dialect's name, text, tool call
fragments) becomes the events OpenAI's Responses stream sends for it, in the order clients
wait for them: an output item is added, its part added, its deltas, then its part and item
done when another kind of output begins or the answer ends. A whole (non-stream) answer's
message is fed the same way, its events unused, so both paths build one response object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

REASONING, MESSAGE = "reasoning", "message"


def encode(event: dict[str, Any]) -> bytes:
    """One event as SSE, with its `event:` line as OpenAI sends it."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def usage_of(metering: dict[str, Any]) -> dict[str, Any]:
    """A stream's metered usage (StreamState.metering) in the Responses API's names."""
    return {
        "input_tokens": metering["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": metering["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": metering["reasoning_tokens"]},
        "total_tokens": metering["total_tokens"],
    }


@dataclass(slots=True)
class ResponsesTranslator:
    """One response being built: feed() each chunk, finish() once; `output` holds its items."""

    response_id: str  # resp_<24 hex>: the output items' ids carry its hex (chat/lib/responses_request.ITEM_ID)
    created_at: int
    echo: dict[str, Any]  # the request's fields the response object repeats (model, instructions, tools, …)
    output: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    status: str | None = None  # once finished: completed, incomplete or failed
    sequence: int = 0
    _open: int | None = None  # the output index of the reasoning or message item being written
    _calls: dict[int, int] = field(default_factory=dict)  # upstream tool call index -> output index
    _closed: set[int] = field(default_factory=set)
    _cut_short: bool = False  # finished otherwise than complete: the items still open end "incomplete"

    # --- events ---------------------------------------------------------------------

    def start(self) -> list[dict[str, Any]]:
        """response.created and response.in_progress."""
        response = self.response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat completions chunk (or of a whole answer's `message`)."""
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return []
        choice = choices[0]
        delta = choice.get("delta") or choice.get("message") or {}
        events: list[dict[str, Any]] = []
        if isinstance(delta, dict):
            reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
            if reasoning:
                events += self._reasoning(reasoning)
            content = _text(delta.get("content"))
            if content:
                events += self._text(content)
            calls = delta.get("tool_calls")
            for position, fragment in enumerate(calls if isinstance(calls, list) else ()):
                if isinstance(fragment, dict):
                    events += self._call(fragment, position)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        return events

    def finish(self, outcome: str, error: str, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The open items closed, then response.completed, response.incomplete or response.failed.

        `outcome` is the stream's (StreamState.outcome: complete, failed, interrupted, or stopped).
        """
        self._cut_short = outcome != "complete"
        events = self._close_open()
        for index in sorted(self._calls.values()):
            events += self._close(index)
        failure = None
        if outcome == "complete":
            self.status = "incomplete" if self.finish_reason == "length" else "completed"
        else:
            self.status = "failed"
            failure = {"code": "server_error", "message": error or "the upstream stream failed"}
        response = self.response(self.status, usage, failure)
        return [*events, self._event(f"response.{self.status}", response=response)]

    # --- the response object ------------------------------------------------------

    def response(
        self, status: str, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The response object in its state `status`."""
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            **self.echo,
            "output": [dict(item) for item in self.output] if status != "in_progress" else [],
            "usage": usage,
        }

    @property
    def output_text(self) -> str:
        return "".join(part["text"] for item in self.output if item["type"] == MESSAGE for part in item["content"])

    # --- items ----------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _item_id(self, prefix: str, index: int) -> str:
        return f"{prefix}_{self.response_id[5:]}_{index}"

    def _current(self, kind: str) -> int | None:
        if self._open is not None and self.output[self._open]["type"] == kind:
            return self._open
        return None

    def _add(self, item: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        index = len(self.output)
        self.output.append(item)
        return index, self._event("response.output_item.added", output_index=index, item=_snapshot(item))

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        index = self._current(REASONING)
        if index is None:
            events += self._close_open()
            index, added = self._add({"id": self._item_id("rs", len(self.output)), "type": REASONING, "summary": []})
            self.output[index]["summary"].append({"type": "summary_text", "text": ""})
            self._open = index
            part = {"type": "summary_text", "text": ""}
            events += [
                added,
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=self.output[index]["id"],
                    output_index=index,
                    summary_index=0,
                    part=part,
                ),
            ]
        item = self.output[index]
        item["summary"][0]["text"] += text
        events.append(
            self._event(
                "response.reasoning_summary_text.delta",
                item_id=item["id"],
                output_index=index,
                summary_index=0,
                delta=text,
            )
        )
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        index = self._current(MESSAGE)
        if index is None:
            events += self._close_open()
            item = {
                "id": self._item_id("msg", len(self.output)),
                "type": MESSAGE,
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            index, added = self._add(item)
            item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            self._open = index
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events += [
                added,
                self._event(
                    "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
                ),
            ]
        item = self.output[index]
        item["content"][0]["text"] += text
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call(self, fragment: dict[str, Any], position: int) -> list[dict[str, Any]]:
        upstream_index = fragment.get("index", position)
        upstream_index = upstream_index if isinstance(upstream_index, int) else position
        function = fragment.get("function") if isinstance(fragment.get("function"), dict) else {}
        events: list[dict[str, Any]] = []
        index = self._calls.get(upstream_index)
        if index is None:
            events += self._close_open()
            call_id = fragment.get("id") if isinstance(fragment.get("id"), str) and fragment["id"] else None
            item = {
                "id": self._item_id("fc", len(self.output)),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call_id or f"call_{self.response_id[5:]}_{len(self.output)}",
                "name": _text(function.get("name")),
                "arguments": "",
            }
            index, added = self._add(item)
            self._calls[upstream_index] = index
            events.append(added)
        elif _text(function.get("name")):
            self.output[index]["name"] += function["name"]
        item = self.output[index]
        arguments = _text(function.get("arguments"))
        if arguments:
            item["arguments"] += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=arguments
                )
            )
        return events

    def _close_open(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        return self._close(index)

    def _close(self, index: int) -> list[dict[str, Any]]:
        if index in self._closed:
            return []
        self._closed.add(index)
        item = self.output[index]
        where = {"item_id": item["id"], "output_index": index}
        events = []
        if item["type"] == REASONING:
            part = item["summary"][0]
            events += [
                self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=part["text"]),
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=dict(part)),
            ]
        elif item["type"] == MESSAGE:
            item["status"] = "incomplete" if self.finish_reason == "length" or self._cut_short else "completed"
            part = item["content"][0]
            events += [
                self._event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", **where, content_index=0, part=dict(part)),
            ]
        else:
            item["status"] = "incomplete" if self._cut_short else "completed"
            events.append(
                self._event(
                    "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
                )
            )
        events.append(self._event("response.output_item.done", output_index=index, item=_snapshot(item)))
        return events


def _snapshot(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of an item as it is now (its lists copied), for an event encoded later than the item changes."""
    return {key: [dict(v) for v in value] if isinstance(value, list) else value for key, value in item.items()}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
