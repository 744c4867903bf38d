"""The scenario a test asks for: ``[[name]]`` / ``[[name:value]]`` directives in the last user message.

They are removed from the text the fake answers to. ``[[echo]]`` answer = the user's
text; ``[[chunks:N]]`` N filler content chunks; ``[[reasoning:N]]`` N reasoning chunks
first; ``[[delay:MS]]`` pause between chunks; ``[[fault:cut|eof|midstream|malformed|stall]]``
break the stream after half the content (``stall``: send nothing more, the connection left
open, until the client goes); ``[[status:CODE]]`` fail before the first byte; ``[[tools]]``
two streamed tool calls (once the conversation ends with tool results, a text answer quoting
them); ``[[length]]`` stop after a third with finish_reason "length";
``[[comment]]`` ``: keep-alive`` comment lines between chunks; ``[[stamp]]`` each content
piece starts with ``@<unix time of sending> `` (for latency benchmarks).
``[[size:N]]`` each filler chunk (``chunks:N``) is N characters long (one N-byte line of
~1000-character paragraphs); ``[[malformed:N]]`` an unreadable ``data:`` line after each
of the first N content chunks, the stream going on; ``[[wait:MS]]`` nothing at all (not
even headers) for MS before the answer; with ``[[status:CODE]]``: ``[[html]]`` an HTML
error page instead of JSON, ``[[echoauth]]`` the request's Authorization header echoed in
the error message. ``[[cookie]]`` a ``Set-Cookie`` on the answer, as providers behind a CDN
send (``__cf_bm``). ``[[finish:TEXT]]`` the finish_reason of a finished stream;
``[[longid]]`` a 300-character completion id (also infyrence's X-Request-Id).
``[[hold:N]]`` after N ``data:`` events of a stream, nothing more until the test sets the
record's ``released`` event (or the client leaves): a stream a test catches mid-way for sure.
``[[call:NAME {json}]]`` (one or more, with ``[[rounds:N]]``, default 1) tool calls of NAME (``server.tool``
is sent as ``server__tool``) with those arguments, for N rounds, then a text answer quoting the last results;
``[[shape:paragraph|code]]`` with ``chunks:N``: the N chunks make one paragraph with inline
markup, or one python code block (fences included). ``[[nul]]`` an answer with a NUL character
(U+0000, ``\\u0000`` in the JSON) between two pieces of text.
"""

from __future__ import annotations

import http
import re
from typing import Any

DIRECTIVE_RE = re.compile(r"\[\[(\w+)(?::([^\]]*))?\]\]")
FAULTS = ("cut", "eof", "midstream", "malformed", "stall")
# Upper bounds of the numeric directives when the fake serves as the demo upstream.
DEMO_CAPS = {"chunks": 5000, "size": 2000, "reasoning": 1000, "delay": 2000, "wait": 10000, "malformed": 10}


def message_text(content: Any) -> str:
    """The text of a message's content, a string or a list of parts (non-text parts skipped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def last_user_text(messages: list[Any]) -> str:
    """The text of the last user message, where the directives are read."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def capped(directives: dict[str, str], caps: dict[str, int]) -> dict[str, str]:
    """The directives with each numeric one lowered to its cap."""
    out = dict(directives)
    for name, cap in caps.items():
        try:
            value = float(out[name])
        except (KeyError, ValueError):
            continue
        if not value <= cap:  # NaN too
            out[name] = str(cap)
    return out


def read_directives(text: str, caps: dict[str, int] | None) -> tuple[dict[str, str], str]:
    """The directives in TEXT (capped when CAPS are given), and the text without them."""
    directives = {name: value or "" for name, value in DIRECTIVE_RE.findall(text)}
    if caps:
        directives = capped(directives, caps)
    return directives, DIRECTIVE_RE.sub("", text).strip()


def nonneg_int(value: str | None) -> int | None:
    """A directive's value as an integer >= 0, or None when absent or not one."""
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        return None
    return n if n >= 0 else None


def error_status(directives: dict[str, str]) -> int | None:
    """The error status [[status:CODE]] asks for, when CODE is a known 4xx or 5xx."""
    status = nonneg_int(directives.get("status"))
    if status is None or not 400 <= status <= 599:
        return None
    try:
        http.HTTPStatus(status)
    except ValueError:
        return None
    return status
