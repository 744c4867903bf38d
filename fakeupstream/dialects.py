"""What tells the three dialects apart outside a stream: their models, ids and error bodies.

The documented samples fix each one: ``i14`` writes JSON with Python's default
separators and ids like ``req_<hex>``, ``api14`` compact JSON, ``{"error": {"code",
"message"}}`` errors and ``gen-<time>-<random>`` ids, ``infyrence`` compact JSON with
the request id inside its errors and ``chatcmpl_<random>`` ids.
"""

from __future__ import annotations

import http
import json
import random
import secrets
import string
import time
from dataclasses import dataclass

I14_MODEL = "i14-sugarglider-nemotron3-super-120B-v1"
I14_DEFAULT_MAX_TOKENS = 100
RETRY_AFTER = "7"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model a dialect lists."""

    owned_by: str
    created: int
    reasoning: int = 0  # default number of reasoning chunks
    price_in: int = 0  # api14 prices in nano-dollars per token
    price_out: int = 0
    embedding: bool = False  # makes embeddings (POST /v1/embeddings), listed with "type": "embedding"


MODELS: dict[str, dict[str, ModelInfo]] = {
    "i14": {I14_MODEL: ModelInfo("i14", 1788000000, reasoning=8)},
    "api14": {
        # 0.25 $/M in, 2 $/M out: the doc sample (10 + 3 tokens -> 0.0000085) matches exactly.
        "openai/gpt-5-mini": ModelInfo("openai", 1754000000, price_in=250, price_out=2000),
        "deepseek/deepseek-r1": ModelInfo("deepseek", 1737000000, reasoning=8, price_in=550, price_out=2190),
        "openai/text-embedding-3-small": ModelInfo("openai", 1705948997, price_in=20, embedding=True),
    },
    "infyrence": {
        "claude-sonnet-5": ModelInfo("anthropic", 1770000000),
        "gpt-4.1-mini": ModelInfo("openai", 1744000000),
        "text-embedding-3-small": ModelInfo("openai", 1705948997, embedding=True),
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

_ALNUM = string.ascii_letters + string.digits


def _random_alnum(n: int) -> str:
    """N random letters and digits."""
    return "".join(random.choices(_ALNUM, k=n))


def new_completion_id(dialect: str) -> str:
    """A completion id in the dialect's format (infyrence sends it as X-Request-Id too)."""
    if dialect == "i14":
        return "req_" + secrets.token_hex(16)
    if dialect == "api14":
        return f"gen-{int(time.time())}-{_random_alnum(20)}"
    return "chatcmpl_" + _random_alnum(24)


def new_request_id() -> str:
    """The id of a request that is not a completion (the model list, an unknown route)."""
    return "req_" + secrets.token_hex(12)


def new_tool_call_id() -> str:
    """A tool call's id, as the OpenAI format writes it."""
    return "call_" + _random_alnum(24)


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


def models_body(dialect: str) -> bytes:
    """The dialect's GET /v1/models body."""
    data = [
        {"id": model_id, "object": "model", "created": info.created, "owned_by": info.owned_by}
        | ({"type": "embedding"} if info.embedding else {})
        for model_id, info in MODELS[dialect].items()
    ]
    obj = {"object": "list", "data": data}
    if dialect == "i14":
        return json.dumps(obj).encode()
    return json.dumps(obj, separators=(",", ":")).encode()
