"""A Responses API request (`POST /v1/responses`) checked; its input as chat completions messages (no Django).

Only the fields in SUPPORTED_FIELDS are accepted (docs/api.md lists them); any other is a 400
naming it, so a client never believes a setting took effect when it did not. Input items are
kept in the Responses shape (they are what a stored response remembers, and what a follow-up's
`previous_response_id` brings back); `chat_messages()` turns them into the messages the
upstream's chat completions endpoint takes. Reasoning items are never sent upstream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from chat.lib.model_params import (
    MAX_TOOLS,
    MAX_USER_LENGTH,
    REASONING_EFFORTS,
    VERBOSITIES,
    ParamError,
    check_param,
    is_int,
)

# Output item ids name their response (resp_<hex>): an item_reference finds its stored response by its id alone.
ITEM_ID = re.compile(r"^(?:rs|msg|fc)_([0-9a-f]{24})_\d+$")
RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{24}$")
INCLUDABLE = frozenset({"reasoning.encrypted_content"})  # accepted; nothing is encrypted, so nothing is added
MESSAGE_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
MAX_METADATA = 16


@dataclass(slots=True)
class ResponsesRequest:
    """The checked request: the input items in Responses shape and what the chat completions request carries."""

    model: str
    items: list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # Responses shape, echoed in the response
    tool_choice: Any = "auto"
    params: dict[str, Any] = field(default_factory=dict)  # chat completions fields: temperature, top_p, …
    reasoning: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})

    def references(self) -> list[str]:
        """The ids of the item_reference items of the input, to be looked up in stored responses."""
        return [item["id"] for item in self.items if item.get("type") == "item_reference"]

    def chat_body(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat completions request of `items`: a previous response's items and this input, references resolved."""
        body: dict[str, Any] = {"model": self.model, "messages": chat_messages(self.instructions, items)}
        if self.tools:
            body["tools"] = [
                {"type": "function", "function": {k: v for k, v in tool.items() if k != "type" and v is not None}}
                for tool in self.tools
            ]
            if self.tool_choice != "auto":
                choice = self.tool_choice
                body["tool_choice"] = (
                    choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice["name"]}}
                )
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.stream:
            body["stream"] = True
        return {**body, **self.params}


def parse_responses_request(body: Any, *, max_tokens: int) -> ResponsesRequest:
    """The request's supported fields, each checked; ParamError names the first one that is not."""
    if not isinstance(body, dict):
        raise ParamError("", "The request body must be a JSON object.", "invalid_request")
    request = ResponsesRequest(model="", items=[])
    for name, value in body.items():
        check = _FIELDS.get(name)
        if check is None:
            raise ParamError(
                name,
                f"`{name}` is not supported by this server's Responses API (see /docs/api/).",
                "unsupported_parameter",
            )
        if value is not None:
            check(request, value, max_tokens)
    if not request.model:
        raise ParamError("model", "you must provide a model parameter", "missing_model")
    if not request.items:
        raise ParamError("input", "`input` must be a non-empty string or array of input items.")
    return request


def _model(request: ResponsesRequest, value: Any, _: int) -> None:
    if not isinstance(value, str) or not value or len(value) > 300:
        raise ParamError("model", "you must provide a model parameter", "missing_model")
    request.model = value


def _input(request: ResponsesRequest, value: Any, _: int) -> None:
    if isinstance(value, str) and value:
        request.items = [{"type": "message", "role": "user", "content": value}]
        return
    if not isinstance(value, list) or not value:
        raise ParamError("input", "`input` must be a non-empty string or array of input items.")
    request.items = [_item(item, f"input[{k}]") for k, item in enumerate(value)]


def _item(item: Any, param: str) -> dict[str, Any]:
    """One input item, kept in the Responses shape with only the fields that matter."""
    if not isinstance(item, dict):
        raise ParamError(param, "Each input item must be an object.")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise ParamError(f"{param}.role", "`role` must be one of user, system, developer, assistant.")
        return {"type": "message", "role": role, "content": _content(item.get("content"), f"{param}.content", role)}
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str) or (key != "arguments" and not item[key]):
                raise ParamError(f"{param}.{key}", f"A function_call item needs `{key}` (a string).")
        return {
            "type": "function_call",
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": item["arguments"],
        }
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not item["call_id"]:
            raise ParamError(f"{param}.call_id", "A function_call_output item needs `call_id` (a string).")
        output = item.get("output")
        if isinstance(output, list):
            output = _text_of(_content(output, f"{param}.output", "user"))
        if not isinstance(output, str):
            raise ParamError(f"{param}.output", "`output` must be a string or an array of input_text parts.")
        return {"type": "function_call_output", "call_id": item["call_id"], "output": output}
    if kind == "reasoning":
        summary = item.get("summary") if isinstance(item.get("summary"), list) else []
        return {"type": "reasoning", "summary": [p for p in summary if isinstance(p, dict)]}  # never sent upstream
    if kind == "item_reference":
        if not isinstance(item.get("id"), str) or not ITEM_ID.match(item["id"]):
            raise ParamError(f"{param}.id", "An item_reference must name an output item of a response of this server.")
        return {"type": "item_reference", "id": item["id"]}
    raise ParamError(
        f"{param}.type",
        "Input items may be messages, function_call, function_call_output, reasoning and item_reference.",
    )


def _content(value: Any, param: str, role: str) -> str | list[dict[str, Any]]:
    """A message's content: a string, or parts (text, and images in a user message) in the Responses shape."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ParamError(param, "`content` must be a string or a non-empty array of content parts.")
    parts = []
    for k, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text", part.get("refusal")), str):
            parts.append({"type": "input_text", "text": part.get("text", part.get("refusal"))})
        elif kind == "input_image" and role == "user" and isinstance(part.get("image_url"), str):
            image = {"type": "input_image", "image_url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append(image)
        else:
            raise ParamError(
                f"{param}[{k}]",
                "Content parts may be input_text, output_text and, from the user, input_image with an image_url.",
            )
    return parts


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _instructions(request: ResponsesRequest, value: Any, _: int) -> None:
    if not isinstance(value, str):
        raise ParamError("instructions", "`instructions` must be a string.")
    request.instructions = value


def _stream(request: ResponsesRequest, value: Any, _: int) -> None:
    request.stream = _bool("stream", value)


def _store(request: ResponsesRequest, value: Any, _: int) -> None:
    request.store = _bool("store", value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamError(name, f"`{name}` must be a boolean.")
    return value


def _previous(request: ResponsesRequest, value: Any, _: int) -> None:
    if not isinstance(value, str) or not RESPONSE_ID.match(value):
        raise ParamError("previous_response_id", "`previous_response_id` must be the id of a response of this server.")
    request.previous_response_id = value


def _max_output_tokens(request: ResponsesRequest, value: Any, max_tokens: int) -> None:
    if not is_int(value) or not 1 <= value <= max_tokens:
        raise ParamError("max_output_tokens", f"`max_output_tokens` must be an integer from 1 to {max_tokens}.")
    request.max_output_tokens = value


def _sampling(name: str):
    def check(request: ResponsesRequest, value: Any, max_tokens: int) -> None:
        request.params[name] = check_param(name, value, max_tokens=max_tokens)

    return check


def _user(request: ResponsesRequest, value: Any, _: int) -> None:
    if not isinstance(value, str) or len(value) > MAX_USER_LENGTH:
        raise ParamError("user", f"`user` must be a string of at most {MAX_USER_LENGTH} characters.")
    request.params["user"] = value


def _parallel_tool_calls(request: ResponsesRequest, value: Any, _: int) -> None:
    request.params["parallel_tool_calls"] = _bool("parallel_tool_calls", value)


def _tools(request: ResponsesRequest, value: Any, _: int) -> None:
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ParamError("tools", f"`tools` must be an array of at most {MAX_TOOLS} tools.")
    tools = []
    for k, tool in enumerate(value):
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or set(tool) - {"type", "name", "description", "parameters", "strict"}
            or not isinstance(tool.get("name"), str)
            or not isinstance(tool.get("description") or "", str)
            or not isinstance(tool.get("parameters") or {}, dict)
            or not isinstance(tool.get("strict") or False, bool)
        ):
            raise ParamError(
                f"tools[{k}]",
                "Only function tools are supported: {type: function, name, description?, parameters?, strict?}.",
            )
        tools.append(dict(tool))
    request.tools = tools


def _tool_choice(request: ResponsesRequest, value: Any, _: int) -> None:
    if value in ("none", "auto", "required") or (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("name"), str)
        and set(value) == {"type", "name"}
    ):
        request.tool_choice = value
        return
    raise ParamError("tool_choice", '`tool_choice` must be "none", "auto", "required" or {type: function, name}.')


def _reasoning(request: ResponsesRequest, value: Any, _: int) -> None:
    if (
        not isinstance(value, dict)
        or set(value) - {"effort", "summary", "generate_summary"}
        or not all(item is None or isinstance(item, str) for item in value.values())
    ):
        raise ParamError("reasoning", "`reasoning` may only be {effort?, summary?}.")
    request.reasoning = {
        "effort": value.get("effort"),
        "summary": value.get("summary") or value.get("generate_summary"),
    }
    if value.get("effort") is not None:  # forwarded as chat completions' reasoning_effort
        if value["effort"] not in REASONING_EFFORTS:
            raise ParamError("reasoning.effort", f"`reasoning.effort` must be one of {', '.join(REASONING_EFFORTS)}.")
        request.params["reasoning_effort"] = value["effort"]


def _metadata(request: ResponsesRequest, value: Any, _: int) -> None:
    if (
        not isinstance(value, dict)
        or len(value) > MAX_METADATA
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()
        )
    ):
        raise ParamError("metadata", f"`metadata` must hold at most {MAX_METADATA} string values.")
    request.metadata = dict(value)


def _text(request: ResponsesRequest, value: Any, _: int) -> None:
    fmt = value.get("format") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or set(value) - {"format", "verbosity"}
        or (fmt is not None and not isinstance(fmt, dict))
    ):
        raise ParamError("text", "`text` may only be {format?, verbosity?}.")
    if value.get("verbosity") is not None:  # forwarded as chat completions' verbosity
        if value["verbosity"] not in VERBOSITIES:
            raise ParamError("text.verbosity", f"`text.verbosity` must be one of {', '.join(VERBOSITIES)}.")
        request.params["verbosity"] = value["verbosity"]
    if fmt is None:
        return
    kind = fmt.get("type")
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        request.text_format = fmt
        if kind == "json_object":
            request.params["response_format"] = {"type": "json_object"}
        return
    if (
        kind == "json_schema"
        and isinstance(fmt.get("name"), str)
        and not set(fmt) - {"type", "name", "schema", "strict", "description"}
    ):
        request.text_format = fmt
        schema = {k: v for k, v in fmt.items() if k != "type" and v is not None}
        request.params["response_format"] = {"type": "json_schema", "json_schema": schema}
        return
    raise ParamError(
        "text.format",
        "`text.format` must be {type: text}, {type: json_object} or {type: json_schema, name, schema, strict?}.",
    )


def _include(request: ResponsesRequest, value: Any, _: int) -> None:
    if not isinstance(value, list) or not all(item in INCLUDABLE for item in value):
        raise ParamError("include", f"`include` may only list {', '.join(sorted(INCLUDABLE))}.")


def _truncation(request: ResponsesRequest, value: Any, _: int) -> None:
    # "auto" lets a server drop input that does not fit; this one never does, which "auto" allows too.
    if value not in ("disabled", "auto"):
        raise ParamError("truncation", '`truncation` must be "disabled" or "auto": this server never drops input.')


def _dropped(name: str):
    """A hint OpenAI's clients send that no upstream here acts on (caching, safety tracing, service tiers)."""

    def check(request: ResponsesRequest, value: Any, _: int) -> None:
        if not isinstance(value, str):
            raise ParamError(name, f"`{name}` must be a string.")

    return check


_FIELDS = {
    "model": _model,
    "input": _input,
    "instructions": _instructions,
    "stream": _stream,
    "store": _store,
    "previous_response_id": _previous,
    "max_output_tokens": _max_output_tokens,
    "temperature": _sampling("temperature"),
    "top_p": _sampling("top_p"),
    "user": _user,
    "parallel_tool_calls": _parallel_tool_calls,
    "tools": _tools,
    "tool_choice": _tool_choice,
    "reasoning": _reasoning,
    "metadata": _metadata,
    "text": _text,
    "include": _include,
    "truncation": _truncation,
    "prompt_cache_key": _dropped("prompt_cache_key"),
    "safety_identifier": _dropped("safety_identifier"),
    "service_tier": _dropped("service_tier"),
}
SUPPORTED_FIELDS = tuple(_FIELDS)


# --- input items -> chat completions messages ---------------------------------------


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat completions messages of the instructions and the (resolved) input items.

    A function_call joins the assistant message before it (its text, or the calls before
    it), as chat completions puts a turn's calls on one message; reasoning is dropped.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type")
        if kind == "message":
            role = MESSAGE_ROLES[item["role"]]
            content = item["content"]
            if role != "user" or isinstance(content, str):
                content = _text_of(content)
            else:
                content = [_chat_part(part) for part in content]
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def _chat_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "input_image":
        image = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return {"type": "text", "text": part["text"]}
