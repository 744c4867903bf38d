"""A search result's snippet: the words around a match, on one line, cut at word boundaries."""

from __future__ import annotations

import re

SNIPPET_CHARS = 140
# Characters the database keeps before a match (Conversation.objects.excerpts): a match that far in
# means the excerpt was cut there, maybe mid-word.
BEFORE = 60
_SPACE_RE = re.compile(r"\s+")
_DIRECTIVE_RE = re.compile(r"\[\[[^\]]*\]\]")


def snippet(excerpt: str, query: str, chars: int = SNIPPET_CHARS, before: int = BEFORE) -> str | None:
    """About `chars` characters of `excerpt` around the first match of `query`, "…" where cut; None without a match."""
    if not query or not excerpt:
        return None
    cut_before = excerpt.lower().find(query.lower()) >= before
    text = _SPACE_RE.sub(" ", _DIRECTIVE_RE.sub(" ", excerpt)).strip()
    at = text.lower().find(query.lower())
    if at < 0:
        return None
    start = max(0, at - (chars - len(query)) // 3)
    if (start > 0 or cut_before) and (start == 0 or text[start - 1] != " "):  # not in the middle of a word
        space = text.find(" ", start, at)
        start = space + 1 if space >= 0 else start
    end = min(len(text), start + chars)
    if end < len(text):
        space = text.rfind(" ", at + len(query), end)
        end = space if space >= 0 else end
    cut = start > 0 or cut_before
    return ("…" if cut else "") + text[start:end].strip() + ("…" if end < len(text) else "")
