"""POST /v1/embeddings: deterministic vectors in OpenAI's form (no seed document gives a dialect's own).

Each input's vector is made from the SHA-256 of its text, so the same text always gets the
same vector and different texts different ones; `dimensions` sets its length (16 by
default), `encoding_format: "base64"` sends it as little-endian float32 bytes, as OpenAI
does (openai-py asks for base64 unless told otherwise). Usage counts an input's words, one
token at least; api14 adds its `cost`, as it does on completions. ``[[status:CODE]]`` in the
first input fails the request before anything is computed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from typing import Any

from fakeupstream.chunks import _fmt_cost
from fakeupstream.dialects import I14_MODEL, ModelInfo
from fakeupstream.directives import error_status, read_directives

DEFAULT_DIMENSIONS = 16
MAX_DIMENSIONS = 4096


class EmbeddingRefused(Exception):
    """A request the fake answers with an error: (status, message, code)."""

    def __init__(self, status: int, message: str | None = None, code: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.type_ = status, message, code, type_


def vector(text: str, dimensions: int) -> list[float]:
    """A unit vector of `dimensions` floats, the same for the same text."""
    values: list[float] = []
    counter = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        values.extend((byte - 127.5) / 127.5 for byte in digest)
        counter += 1
    values = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    # Rounded to what float32 holds, so the float and base64 forms carry the same numbers.
    return [struct.unpack("<f", struct.pack("<f", v / norm))[0] for v in values]


def _texts(value: Any) -> list[str]:
    """The inputs as texts: a string, strings, a token array or token arrays (tokens joined by spaces)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, str) for item in value):
            return list(value)
        if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
            return [" ".join(map(str, value))]
        if all(isinstance(item, list) and item and all(isinstance(t, int) for t in item) for item in value):
            return [" ".join(map(str, item)) for item in value]
    raise EmbeddingRefused(400, "'input' must be a string, an array of strings or an array of token arrays.")


def answer(dialect: str, models: dict[str, ModelInfo], body: Any) -> bytes:
    """The response body for a request, or EmbeddingRefused."""
    if not isinstance(body, dict):
        raise EmbeddingRefused(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise EmbeddingRefused(400, "'model' is required.")
    info = models.get(model)
    if info is None:
        if dialect == "i14":
            raise EmbeddingRefused(403, f"Model '{model}' is not allowed. Use {I14_MODEL}.",
                                   "model_not_allowed", "permission_error")  # fmt: skip
        raise EmbeddingRefused(404, f"Model '{model}' not found.", "model_not_found")
    texts = _texts(body.get("input"))
    status = error_status(read_directives(texts[0], None)[0])
    if status is not None:
        raise EmbeddingRefused(status)
    if not info.embedding:
        raise EmbeddingRefused(400, f"Model '{model}' does not make embeddings.", "invalid_model")
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 1 <= dimensions <= MAX_DIMENSIONS:
        raise EmbeddingRefused(400, f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}.")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise EmbeddingRefused(400, "'encoding_format' must be float or base64.")
    data = []
    for index, text in enumerate(texts):
        values = vector(text, dimensions)
        if encoding == "base64":
            embedding: Any = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
        else:
            embedding = values
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(max(1, len(text.split())) for text in texts)
    usage: dict[str, Any] = {"prompt_tokens": tokens, "total_tokens": tokens}
    cost = "\x01cost" if dialect == "api14" else None
    if cost:
        usage["cost"] = cost
    out = json.dumps(
        {"object": "list", "data": data, "model": model, "usage": usage},
        separators=None if dialect == "i14" else (",", ":"),
    )
    if cost:  # plain decimals, as api14 writes its costs
        out = out.replace(json.dumps(cost), _fmt_cost(tokens * info.price_in))
    return out.encode()
