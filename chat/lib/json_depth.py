"""How deep a person's JSON nests, without recursion (no Django).

A document parsed from a request can nest as deep as its parser allows (orjson: 1,024
levels; the standard library raises RecursionError past about 1,000), but orjson refuses
to write more than 254 levels, and each later reading of a stored value in Python may
recurse: what comes from a person is bounded where it is parsed.
"""

from __future__ import annotations

from typing import Any

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
