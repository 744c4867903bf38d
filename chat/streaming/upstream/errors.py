"""What an upstream did wrong, said in a sentence with no secret and no HTML in it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import httpx
import orjson


class UpstreamError(Exception):
    """The upstream refused, failed or broke off a request.

    kind: "http" (an error status before the first byte), "connect", "timeout",
    "cut" (the connection ended without a finish), "protocol" (unreadable data: too
    many malformed events, an over-long line), "too_large" (a reply or a response
    past its size cap), "stream" (an error the upstream reported mid-stream) or
    "busy" (no free connection to the provider within the wait, chat/metering/limits.py) or "next_round"
    (a tool turn's next request refused before it went upstream: the budget, a limit).
    The message is a sentence already scrubbed of secrets (see scrub()).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        body: bytes | None = None,
        headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.code = code
        self.body = body
        self.headers = headers or httpx.Headers()

    @property
    def retry_after(self) -> str | None:
        return self.headers.get("retry-after")

    @property
    def request_id(self) -> str | None:
        return self.headers.get("x-request-id")

    def __str__(self) -> str:
        prefix = f"upstream {self.status}" if self.status else f"upstream {self.kind}"
        return f"{prefix}: {self.message}"


# --- secrets and HTML out of upstream text ------------------------------------

REDACTED = "[redacted]"
REDACTED_BYTES = REDACTED.encode()
# An Authorization value an upstream echoes back, and keys that look like OpenAI-style secrets.
# A token may hold dots (a JWT's), but not the brackets or the full stop of the sentence around it.
_BEARER_RE = re.compile(r"(?i)\b(bearer)\s+[^\s\"'<>,;()\[\]{}]*[^\s\"'<>,;()\[\]{}.]")
_KEY_RE = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")
_HTML_RE = re.compile(r"(?is)^\s*(<!doctype\s+html|<html|<head|<body)")
_TITLE_RE = re.compile(r"(?is)<title[^>]*>(.*?)</title>")
_H1_RE = re.compile(r"(?is)<h1[^>]*>(.*?)</h1>")
_TAG_RE = re.compile(r"<[^>]+>")


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """Upstream-derived text with the given secrets and anything like `Bearer …` / `sk-…` removed."""
    for secret in secrets:
        # Very short keys (the test fakes' "x") would blank out ordinary words.
        if secret and len(secret) >= 6 and secret in text:
            text = text.replace(secret, REDACTED)
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _KEY_RE.sub(REDACTED, text)


def redact_secrets(data: bytes, secrets: Iterable[str] = ()) -> bytes:
    """An upstream's answer with the given secrets (the provider's key) replaced, the same object if none is in it.

    Only the secrets themselves, not scrub()'s look-alikes: an answer may rightly show `Bearer …` in
    an example. A key is ASCII, so it appears in JSON as it is; a search costs far less than the read.
    """
    for secret in secrets:
        if secret and len(secret) >= 6:
            key = secret.encode()
            if key in data:
                data = data.replace(key, REDACTED_BYTES)
    return data


def is_html(text: str) -> bool:
    return _HTML_RE.match(text) is not None


def html_summary(text: str, fallback: str) -> str:
    """One line for an HTML error page: its title (or first heading), never the page."""
    found = _TITLE_RE.search(text) or _H1_RE.search(text)
    title = " ".join(_TAG_RE.sub(" ", found.group(1)).split()) if found else ""
    return title[:200] or fallback


def shorten(text: str, limit: int = 500) -> str:
    """At most `limit` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_error_body(text: str, fallback: str) -> tuple[str, str | None]:
    """The message and code from OpenAI-style `{"error": {...}}` bodies, whatever their variant."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        if is_html(text):
            return html_summary(text, fallback), None
        return shorten(" ".join(text.split()) or fallback), None
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    message, code = describe_error(error, fallback)
    return shorten(message), (code[:100] if code else code)  # both already scrubbed with the body


def describe_error(error: Any, fallback: str = "upstream error") -> tuple[str, str | None]:
    """Turn an upstream error object (dict or string) into (message, code)."""
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or fallback
        code = error.get("code") or error.get("type")
        if not isinstance(message, str):  # a nested object: JSON, never a Python repr
            message = orjson.dumps(message).decode()
        if code is not None and not isinstance(code, str | int):
            code = None
        return message, (str(code) if code is not None else None)
    if isinstance(error, str) and error:
        return error, None
    return fallback, None
