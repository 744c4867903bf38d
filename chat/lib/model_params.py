"""What a user may ask of a model, checked the same way on every path (no Django).

The websocket's `params`, the conversation PATCH and `/v1/chat/completions` share
these rules, so a value refused on one path is refused on all of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from chat.lib.json_depth import MAX_REQUEST_DEPTH, deeper_than

MAX_SYSTEM_PROMPT = 20_000  # characters, on the websocket and the conversation PATCH
MAX_STOP_COUNT = 4
MAX_STOP_LENGTH = 200  # characters per stop string
MAX_USER_LENGTH = 256
MAX_TOOLS = 128
MAX_SEED = 2**63 - 1
# image_url parts (user messages on /v1): a data URL's decoded bytes, unless the caller says
# otherwise (ATTACHMENT_MAX_FILE_BYTES), and the length of an https link.
DEFAULT_MAX_IMAGE_BYTES = 20_000_000
MAX_IMAGE_LINK = 2048
IMAGE_DATA_URL = re.compile(r"data:image/(png|jpeg|webp|gif);base64,", re.IGNORECASE)  # media types have no case

# name -> (lowest, highest); bool is never a number here.
NUMBER_PARAMS = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
# The per-conversation params of the chat page.
CHAT_PARAMS = frozenset({*NUMBER_PARAMS, "max_tokens", "stop"})
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
# OpenAI's newer name for the system role, which its SDKs' types and reasoning-model clients send; the dialects
# the server speaks document `system`, which it becomes.
DEVELOPER_ROLE = "developer"
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
VERBOSITIES = ("low", "medium", "high")
# Keys the OpenAI SDKs (and litellm: `images`) copy back from a completion's message; accepted, not forwarded.
ECHOED_MESSAGE_KEYS = frozenset({"refusal", "annotations", "audio", "function_call", "images"})
# An assistant message's reasoning as clients append it back: `reasoning_content` (i14, litellm),
# `reasoning` and `reasoning_details` (api14), litellm's `thinking_blocks` and `provider_specific_fields`, and
# `parsed` (openai-py's .stream() and .parse() helpers). Accepted and dropped: no dialect the server speaks
# (the seed documents of i14, api14, infyrence) documents taking reasoning back in a message; an upstream
# that did would get it forwarded here.
REASONING_MESSAGE_KEYS = frozenset(
    {"reasoning_content", "reasoning", "reasoning_details", "thinking_blocks", "provider_specific_fields", "parsed"}
)
# The keys each role's message may carry (null is accepted for each, as "not given").
MESSAGE_KEYS = {
    "system": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls"}) | ECHOED_MESSAGE_KEYS | REASONING_MESSAGE_KEYS,
    "tool": frozenset({"role", "content", "tool_call_id"}),
}


def gettext_noop(text: str) -> str:
    """Marks a message for the catalogue (makemessages finds it by this name); the page translates it."""
    return text


class ParamError(ValueError):
    """A field that is unknown, of the wrong type or out of range; `param` names it.

    `message` is English (/v1 answers in English, as OpenAI does); a message given with `values` keeps
    its %(name)s form apart, so the page's JSON API and socket can say it in the person's language.
    """

    def __init__(self, param: str, message: str, code: str = "invalid_value", values: dict | None = None) -> None:
        filled = message % values if values else message
        super().__init__(filled)
        self.param, self.message, self.code = param, filled, code
        self.template, self.values = message, values

    def translated(self, gettext: Callable[[str], str]) -> str:
        """The message in the active language, when it was marked for the catalogue."""
        return gettext(self.template) % self.values if self.values else gettext(self.message)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def check_param(name: str, value: Any, *, max_tokens: int) -> Any:
    """One chat param (temperature, top_p, penalties, max_tokens, stop), checked by type and range."""
    if name in NUMBER_PARAMS:
        low, high = NUMBER_PARAMS[name]
        if not is_number(value) or not low <= value <= high:
            message = gettext_noop("`%(name)s` must be a number from %(low)s to %(high)s.")
            raise ParamError(name, message, values={"name": name, "low": f"{low:g}", "high": f"{high:g}"})
        return value
    if name in ("max_tokens", "max_completion_tokens"):
        if not is_int(value) or not 1 <= value <= max_tokens:
            message = gettext_noop("`%(name)s` must be an integer from 1 to %(max)s.")
            raise ParamError(name, message, values={"name": name, "max": max_tokens})
        return value
    if name == "stop":
        stops = [value] if isinstance(value, str) else value
        if (
            not isinstance(stops, list)
            or not 1 <= len(stops) <= MAX_STOP_COUNT
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH for s in stops)
        ):
            message = gettext_noop(
                "`stop` must be a string or a list of up to %(count)s strings, each of 1 to %(length)s characters."
            )
            raise ParamError("stop", message, values={"count": MAX_STOP_COUNT, "length": MAX_STOP_LENGTH})
        return value
    raise ParamError(name, f"Unknown parameter `{name}`.", "unknown_parameter")


def check_system_prompt(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_SYSTEM_PROMPT:
        message = gettext_noop("`system_prompt` must be a string of at most %(max)s characters.")
        raise ParamError("system_prompt", message, values={"max": MAX_SYSTEM_PROMPT})
    return value


# --- /v1/chat/completions -----------------------------------------------------------


def check_request(
    body: Any, *, max_tokens: int, max_n: int, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
) -> dict[str, Any]:
    """The supported fields of an OpenAI chat completions request, checked; anything else is refused.

    The result holds only those fields (a `null` optional field is left out), so
    nothing the caller adds (`base_url`, `api_key`, `provider`, …) reaches an upstream.
    """
    if not isinstance(body, dict):
        raise ParamError("", "The request body must be a JSON object.", "invalid_request")
    out: dict[str, Any] = {}
    for name, value in body.items():
        check = _REQUEST_FIELDS.get(name)
        if check is None:
            raise ParamError(name, f"Unrecognized request argument supplied: {name}", "unknown_parameter")
        if value is None and name not in ("model", "messages"):
            continue
        checked = check(value, max_tokens=max_tokens, max_n=max_n, name=name, max_image_bytes=max_image_bytes)
        if checked is not None:
            out[name] = checked
    if not isinstance(out.get("model"), str) or not out["model"]:
        raise ParamError("model", "you must provide a model parameter", "missing_model")
    if "messages" not in out:
        raise ParamError("messages", "`messages` must be a non-empty array of message objects.")
    return one_token_limit(out)


TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")


def one_token_limit(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with one token limit, `max_tokens`: `max_completion_tokens` becomes it (the smaller, if both are set).

    `max_tokens` is the field every upstream the server speaks documents (i14 stops at 100 tokens
    without it), and an upstream given two that disagree may honour either, while the reservation
    covers one number.
    """
    if "max_completion_tokens" not in params:
        return params
    params = dict(params)
    newer = params.pop("max_completion_tokens")
    if newer is not None:
        params["max_tokens"] = newer if params.get("max_tokens") is None else min(params["max_tokens"], newer)
    return params


def token_limit(params: dict[str, Any], default: int) -> int:
    """The most completion tokens (per choice) `params` let an upstream produce: the largest limit it may honour."""
    given = [params[name] for name in TOKEN_LIMIT_FIELDS if params.get(name) is not None]
    return max(given) if given else default


def _model(value: Any, **_: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 300:
        raise ParamError("model", "you must provide a model parameter", "missing_model")
    return value


def _chat_param(value: Any, *, max_tokens: int, name: str, **_: Any) -> Any:
    return check_param(name, value, max_tokens=max_tokens)


def _bool(value: Any, *, name: str, **_: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamError(name, f"`{name}` must be a boolean.")
    return value


def _n(value: Any, *, max_n: int, **_: Any) -> int:
    if not is_int(value) or not 1 <= value <= max_n:
        allowed = "1" if max_n == 1 else f"from 1 to {max_n}"
        raise ParamError("n", f"`n` must be {allowed} on this server.")
    return value


def _seed(value: Any, **_: Any) -> int:
    if not is_int(value) or not -MAX_SEED - 1 <= value <= MAX_SEED:
        raise ParamError("seed", "`seed` must be a 64-bit integer.")
    return value


def _user(value: Any, **_: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_USER_LENGTH:
        raise ParamError("user", f"`user` must be a string of at most {MAX_USER_LENGTH} characters.")
    return value


def _stream_options(value: Any, **_: Any) -> dict[str, bool]:
    if not isinstance(value, dict):
        raise ParamError("stream_options", "`stream_options` must be an object.")
    for key, item in value.items():
        if key not in ("include_usage", "include_obfuscation"):
            raise ParamError(f"stream_options.{key}", f"Unrecognized stream option: {key}", "unknown_parameter")
        if not isinstance(item, bool):
            raise ParamError(f"stream_options.{key}", f"`stream_options.{key}` must be a boolean.")
    # OpenAI's padding against length side channels: not asked of an upstream that does not document it.
    return {key: item for key, item in value.items() if key == "include_usage"}


def _choice_of(*values: str):
    def check(value: Any, *, name: str, **_: Any) -> str:
        if value not in values:
            raise ParamError(name, f"`{name}` must be one of {', '.join(values)}.")
        return value

    return check


def _dropped(kind: type):
    """A field OpenAI's SDKs and agents send that no upstream here acts on: checked for its type, never forwarded."""

    def check(value: Any, *, name: str, **_: Any) -> None:
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ParamError(name, f"`{name}` must be {'an object' if kind is dict else f'a {kind.__name__}'}.")

    return check


def _logprobs(value: Any, **_: Any) -> None:
    if value is not False:  # asked for, it would be a promise no upstream here keeps
        raise ParamError("logprobs", "`logprobs` is not supported on this server.", "unsupported_parameter")


def _text_content(value: Any, param: str, *, nullable: bool = False, max_image_bytes: int = 0) -> str | list | None:
    """A message's content: a string or text parts; image_url parts too where max_image_bytes (user messages)."""
    if value is None and nullable:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        for k, part in enumerate(value):
            if isinstance(part, dict) and part.get("type") == "image_url" and max_image_bytes:
                _image_part(part, f"{param}[{k}]", max_image_bytes)
            elif (
                not isinstance(part, dict)
                or set(part) != {"type", "text"}
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                allowed = "{type: text, text: …} and, in a user message, {type: image_url, image_url: {url}}"
                raise ParamError(f"{param}[{k}]", f"Only these content parts are supported: {allowed}.")
        return value
    raise ParamError(param, "`content` must be a string or a non-empty array of text parts.")


def _image_part(part: dict, param: str, max_bytes: int) -> None:
    """{type: image_url, image_url: {url, detail?}}: a base64 data URL of a PNG, JPEG, WebP or GIF, or an https URL."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else None
    if (
        set(part) != {"type", "image_url"}
        or not isinstance(image, dict)
        or set(image) - {"url", "detail"}
        or image.get("detail", "auto") not in ("auto", "low", "high")
        or not isinstance(url, str)
    ):
        raise ParamError(param, "An image part must be {type: image_url, image_url: {url, detail?: auto|low|high}}.")
    if url.startswith("https://") and len(url) <= MAX_IMAGE_LINK:
        return
    if not IMAGE_DATA_URL.match(url[:40]):
        raise ParamError(param, "An image's url must be a data:image/(png|jpeg|webp|gif);base64,… URL or an https URL.")
    if (len(url) - url.index(",") - 1) * 3 // 4 > max_bytes:
        raise ParamError(param, f"The image is larger than {max_bytes} bytes.", "image_too_large")


def has_images(messages: list[dict[str, Any]]) -> bool:
    """Whether a checked request's messages carry image_url parts."""
    return any(
        isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"]) for m in messages
    )


# A tool call's keys that clients copy back and the upstream is not sent: a streamed call's `index`,
# litellm's `provider_specific_fields` (and, in `function`, openai-py's .stream() helper's `parsed_arguments`).
ECHOED_TOOL_CALL_KEYS = frozenset({"index", "provider_specific_fields"})


def _tool_call(value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, dict):  # a null optional key is a key not given
        value = {key: item for key, item in value.items() if item is not None or key in ("id", "function")}
    function = value.get("function") if isinstance(value, dict) else None
    if isinstance(function, dict):
        function = {key: item for key, item in function.items() if key != "parsed_arguments"}
    if (
        not isinstance(value, dict)
        or set(value) - {"id", "type", "function"} - ECHOED_TOOL_CALL_KEYS
        or not isinstance(value.get("id"), str)
        or value.get("type", "function") != "function"
        or not isinstance(function, dict)
        or set(function) - {"name", "arguments"}
        or not isinstance(function.get("name"), str)
        or not isinstance(function.get("arguments"), str)
    ):
        raise ParamError(param, "A tool call must be {id, type: function, function: {name, arguments}}.")
    return {"id": value["id"], "type": "function", "function": dict(function)}


def _messages(value: Any, *, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES, **_: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ParamError("messages", "`messages` must be a non-empty array of message objects.")
    out = []
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ParamError(param, "Each message must be an object.")
        role = message.get("role")
        if role == DEVELOPER_ROLE:
            role = "system"
        if role not in MESSAGE_ROLES:
            roles = ", ".join((*MESSAGE_ROLES, DEVELOPER_ROLE))
            raise ParamError(f"{param}.role", f"`role` must be one of {roles}.")
        clean: dict[str, Any] = {"role": role}
        known = MESSAGE_KEYS[role]
        for key, item in message.items():
            if key in known and (
                (item is None and key != "content") or key in ECHOED_MESSAGE_KEYS | REASONING_MESSAGE_KEYS
            ):
                continue  # as received from a completion: never forwarded (see REASONING_MESSAGE_KEYS)
            if key == "role":
                continue
            if key == "content":
                clean["content"] = _text_content(
                    item, f"{param}.content", nullable=role == "assistant",
                    max_image_bytes=max_image_bytes if role == "user" else 0,
                )  # fmt: skip
            elif key == "name" and role != "tool":
                if not isinstance(item, str) or not item or len(item) > 64:
                    raise ParamError(f"{param}.name", "`name` must be a string of 1 to 64 characters.")
                clean["name"] = item
            elif key == "tool_calls" and role == "assistant":
                if item is None:
                    continue
                if not isinstance(item, list):
                    raise ParamError(f"{param}.tool_calls", "`tool_calls` must be an array.")
                clean["tool_calls"] = [_tool_call(call, f"{param}.tool_calls[{k}]") for k, call in enumerate(item)]
            elif key == "tool_call_id" and role == "tool":
                if not isinstance(item, str) or not item:
                    raise ParamError(f"{param}.tool_call_id", "`tool_call_id` must be a non-empty string.")
                clean["tool_call_id"] = item
            else:
                article = "an" if role == "assistant" else "a"  # "a user", "a system", "a tool"
                raise ParamError(
                    f"{param}.{key}", f"Unrecognized field `{key}` in {article} {role} message.", "unknown_parameter"
                )
        if clean.get("content") is None and not clean.get("tool_calls"):
            raise ParamError(f"{param}.content", "A message needs `content` (or, from the assistant, `tool_calls`).")
        if role == "tool" and "tool_call_id" not in clean:
            raise ParamError(f"{param}.tool_call_id", "A tool message needs `tool_call_id`.")
        out.append(clean)
    return out


def _not_too_deep(name: str, value: Any) -> None:
    """A schema forwarded upstream nests at most MAX_REQUEST_DEPTH levels (orjson writes no more than 254)."""
    if deeper_than(value, MAX_REQUEST_DEPTH):
        raise ParamError(name, f"`{name}` nests more than {MAX_REQUEST_DEPTH} levels deep.")


def _tools(value: Any, **_: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ParamError("tools", f"`tools` must be an array of at most {MAX_TOOLS} tools.")
    _not_too_deep("tools", value)
    for k, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or set(tool) != {"type", "function"}
            or tool["type"] != "function"
            or not isinstance(function, dict)
            or set(function) - {"name", "description", "parameters", "strict"}
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("description", ""), str)
            or not isinstance(function.get("parameters", {}), dict)
            or not isinstance(function.get("strict", False), bool)
        ):
            raise ParamError(
                f"tools[{k}]", "A tool must be {type: function, function: {name, description?, parameters?, strict?}}."
            )
    return value


def _tool_choice(value: Any, **_: Any) -> str | dict[str, Any]:
    if value in ("none", "auto", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) else None
    if (
        isinstance(value, dict)
        and set(value) == {"type", "function"}
        and value["type"] == "function"
        and isinstance(function, dict)
        and set(function) == {"name"}
        and isinstance(function["name"], str)
    ):
        return value
    raise ParamError(
        "tool_choice", '`tool_choice` must be "none", "auto", "required" or {type: function, function: {name}}.'
    )


def _response_format(value: Any, **_: Any) -> dict[str, Any]:
    _not_too_deep("response_format", value)
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object") and set(value) == {"type"}:
        return value
    schema = value.get("json_schema") if isinstance(value, dict) else None
    if (
        kind == "json_schema"
        and set(value) == {"type", "json_schema"}
        and isinstance(schema, dict)
        and isinstance(schema.get("name"), str)
        and not set(schema) - {"name", "description", "schema", "strict"}
    ):
        return value
    raise ParamError(
        "response_format",
        "`response_format` must be {type: text}, {type: json_object} "
        "or {type: json_schema, json_schema: {name, schema, …}}.",
    )


_REQUEST_FIELDS = {
    "model": _model,
    "messages": _messages,
    "stream": _bool,
    "stream_options": _stream_options,
    "max_tokens": _chat_param,
    "max_completion_tokens": _chat_param,
    "temperature": _chat_param,
    "top_p": _chat_param,
    "presence_penalty": _chat_param,
    "frequency_penalty": _chat_param,
    "stop": _chat_param,
    "seed": _seed,
    "n": _n,
    "user": _user,
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _bool,
    "response_format": _response_format,
    "reasoning_effort": _choice_of(*REASONING_EFFORTS),
    "verbosity": _choice_of(*VERBOSITIES),
    # Accepted and not forwarded (None): storage, tracing and caching hints, OpenAI's own service tiers.
    "store": _dropped(bool),
    "metadata": _dropped(dict),
    "prompt_cache_key": _dropped(str),
    "safety_identifier": _dropped(str),
    "service_tier": _dropped(str),
    "logprobs": _logprobs,
}
SUPPORTED_FIELDS = tuple(_REQUEST_FIELDS)
DROPPED_FIELDS = ("store", "metadata", "prompt_cache_key", "safety_identifier", "service_tier", "logprobs")
FORWARDED_FIELDS = tuple(name for name in SUPPORTED_FIELDS if name not in DROPPED_FIELDS)
