"""OpenAI's error shape, which the SDKs turn into their exception classes."""

from __future__ import annotations

import orjson


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> bytes:
    """An error as OpenAI's API writes it: {"error": {"message", "type", "param", "code"}}."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})
