"""The rough token count for text nobody metered: about four characters a token (no Django)."""

from __future__ import annotations

CHARS_PER_TOKEN = 4


def estimate_tokens(chars: int) -> int:
    """Tokens in `chars` characters of text, rounded up: for a prompt, an answer or a document never metered."""
    return -(-chars // CHARS_PER_TOKEN)
