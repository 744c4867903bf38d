"""An OpenAI embeddings request's fields, checked; anything else is refused (no Django)."""

from __future__ import annotations

from typing import Any

from chat.lib.model_params import MAX_USER_LENGTH, ParamError, is_int
from chat.lib.token_estimate import CHARS_PER_TOKEN

# OpenAI's own bounds: inputs a request, and a token array's length.
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 8192
MAX_DIMENSIONS = 65536


def check_embeddings_request(body: Any) -> dict[str, Any]:
    """The supported fields of an embeddings request, checked; a `null` optional field is left out."""
    if not isinstance(body, dict):
        raise ParamError("", "The request body must be a JSON object.", "invalid_request")
    out: dict[str, Any] = {}
    for name, value in body.items():
        check = _FIELDS.get(name)
        if check is None:
            raise ParamError(name, f"Unrecognized request argument supplied: {name}", "unknown_parameter")
        if value is None and name not in ("model", "input"):
            continue
        out[name] = check(value)
    if "model" not in out:
        raise ParamError("model", "you must provide a model parameter", "missing_model")
    if "input" not in out:
        raise ParamError("input", "`input` is required.")
    return out


def input_chars(value: Any) -> int:
    """A checked `input`'s length in characters (a token counting as CHARS_PER_TOKEN), for estimating its tokens."""
    if isinstance(value, str):
        return len(value)
    if all(isinstance(item, str) for item in value):
        return sum(map(len, value))
    if all(is_int(item) for item in value):
        return len(value) * CHARS_PER_TOKEN
    return sum(len(item) for item in value) * CHARS_PER_TOKEN


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 300:
        raise ParamError("model", "you must provide a model parameter", "missing_model")
    return value


def _tokens(value: Any) -> bool:
    return isinstance(value, list) and 0 < len(value) <= MAX_INPUT_TOKENS and all(is_int(t) and t >= 0 for t in value)


def _input(value: Any) -> str | list:
    message = (
        f"`input` must be a non-empty string, an array of up to {MAX_INPUTS} non-empty strings, "
        "an array of tokens or an array of token arrays."
    )
    if isinstance(value, str):
        if not value:
            raise ParamError("input", message)
        return value
    if not isinstance(value, list) or not 0 < len(value) <= MAX_INPUTS:
        raise ParamError("input", message)
    if all(isinstance(item, str) and item for item in value):
        return value
    if _tokens(value) or all(_tokens(item) for item in value):
        return value
    raise ParamError("input", message)


def _encoding_format(value: Any) -> str:
    if value not in ("float", "base64"):
        raise ParamError("encoding_format", '`encoding_format` must be "float" or "base64".')
    return value


def _dimensions(value: Any) -> int:
    if not is_int(value) or not 1 <= value <= MAX_DIMENSIONS:
        raise ParamError("dimensions", f"`dimensions` must be an integer from 1 to {MAX_DIMENSIONS}.")
    return value


def _user(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_USER_LENGTH:
        raise ParamError("user", f"`user` must be a string of at most {MAX_USER_LENGTH} characters.")
    return value


_FIELDS = {
    "model": _model,
    "input": _input,
    "encoding_format": _encoding_format,
    "dimensions": _dimensions,
    "user": _user,
}
