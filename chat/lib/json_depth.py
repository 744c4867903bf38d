"""How deep a person's JSON nests, without recursion, and its NULs written out (no Django).

A document parsed from a request can nest as deep as its parser allows (orjson: 1,024
levels; the standard library raises RecursionError past about 1,000), but orjson refuses
to write more than 254 levels, and each later reading of a stored value in Python may
recurse: what comes from a person is bounded where it is parsed.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import orjson

# A stored value (an import's tool calls, a request's remembered fields) nests this deep at most.
MAX_STORED_DEPTH = 32
# A /v1 request, forwarded upstream (a tool's JSON schema, a response format's), under orjson's 254.
MAX_REQUEST_DEPTH = 128


def deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in `value` nest more than `limit` levels (a scalar: 0, `[]`: 1)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


# An escaped NUL: "\u0000" whose backslash is not itself escaped (an even run of backslashes before it).
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
_NUL_BYTES = re.compile(_NUL.pattern.encode())
Text = TypeVar("Text", str, bytes)


def without_nul(raw: Text) -> Text:
    """JSON text with each NUL escape (\\u0000) made U+FFFD, as a markdown renderer shows it anyway.

    PostgreSQL's text and jsonb cannot hold U+0000, so what is stored never does; JSON text cannot
    hold it unescaped, so the escape is the only way in.
    """
    if isinstance(raw, bytes):
        return _NUL_BYTES.sub(rb"\1\\ufffd", raw) if b"\\u0000" in raw else raw
    return _NUL.sub(r"\1\\ufffd", raw) if "\\u0000" in raw else raw


class TooDeep(ValueError):
    """A person's document nests deeper than a stored value may (MAX_STORED_DEPTH)."""


def loads_stored(raw: bytes | str) -> Any:
    """A person's JSON document that is to be stored: orjson's parse (no lone surrogates, NaN or infinities,
    which the standard library lets through), MAX_STORED_DEPTH deep at most, NULs made U+FFFD.

    Raises TooDeep, or orjson.JSONDecodeError (a ValueError) for what is not JSON.
    """
    try:
        value = orjson.loads(without_nul(raw))
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # nested past orjson's 1,024 levels
            raise TooDeep() from None
        raise
    if deeper_than(value, MAX_STORED_DEPTH):
        raise TooDeep()
    return value
