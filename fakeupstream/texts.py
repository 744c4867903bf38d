"""The canned texts the fake answers with, cut into deterministic "tokens".

A reply is the same every time for the same request, so tests can assert on it
and the demo reads well: the default answer quotes the user's message back in
markdown, filler and reasoning text cycle through fixed sentences, and the tool
calls are two get_weather calls with interleaved argument fragments.
"""

from __future__ import annotations

from typing import Any

from fakeupstream.dialects import new_tool_call_id

# Deterministic "token" lengths; the first two give "Ok", "ay, t" as in the i14 doc sample.
_PIECE_LENGTHS = (2, 5, 3, 4, 1, 6, 8, 3, 7, 2, 4, 5)
REASONING_TEXT = (
    "Okay, the user sent a message to the demo upstream. I should quote it back, "
    "add a small table, a short list and a code sample, and keep the tone friendly. "
)
FILLER_WORDS = (
    "Streaming tokens from the demo upstream keeps the relay busy while the benchmark "
    "measures latency, throughput and fairness across many concurrent streams."
).split()
# [[shape:paragraph]] and [[shape:code]]: one long paragraph with inline markup, one long code block.
_PARAGRAPH_TEXT = "Some **bold** words, a [link](https://example.com/) and `code` in one long paragraph. "
_CODE_TEXT = (
    "def total(items):\n    result = 0\n    for item in items:\n"
    "        result += item.price * item.count\n    return result\n\n"
)
_TOOL_ARGS = ('{"city": "Paris", "unit": "celsius"}', '{"city": "Tokyo", "unit": "celsius"}')


def split_pieces(text: str, start: int = 0) -> list[str]:
    """The text cut into "tokens" of the fixed lengths, starting at length number START."""
    out: list[str] = []
    i = 0
    k = start
    n = len(text)
    while i < n:
        step = _PIECE_LENGTHS[k % len(_PIECE_LENGTHS)]
        out.append(text[i : i + step])
        i += step
        k += 1
    return out


def cycle_pieces(text: str, n: int) -> list[str]:
    """N "tokens" of the text, starting over when it runs out."""
    base = split_pieces(text)
    return [base[i % len(base)] for i in range(n)]


def reasoning_pieces(n: int) -> list[str]:
    """N reasoning "tokens"."""
    return cycle_pieces(REASONING_TEXT, n)


def filler_pieces(n: int) -> list[str]:
    """N filler words, each with its trailing space ([[chunks:N]])."""
    return [FILLER_WORDS[i % len(FILLER_WORDS)] + " " for i in range(n)]


def sized_filler(size: int) -> str:
    """One filler chunk of SIZE characters ([[size:N]])."""
    # Paragraphs of about 1000 characters, as a long real answer has.
    paragraph = (" ".join(FILLER_WORDS) + " ") * 7
    paragraph = paragraph[:998].rstrip() + ".\n\n"
    return (paragraph * (size // len(paragraph) + 1))[:size]


def shaped_pieces(shape: str, n: int) -> list[str] | None:
    """N content pieces forming one block: a paragraph, or a python code block (fences included)."""
    if shape == "paragraph":
        return cycle_pieces(_PARAGRAPH_TEXT, n)
    if shape == "code":
        return ["```python\n", *cycle_pieces(_CODE_TEXT, max(0, n - 2)), "\n```\n"][:n]
    return None


def default_answer(dialect: str, model: str, text: str) -> str:
    """The demo's markdown answer to TEXT: it quotes the message back, with a table, a list and code."""
    quoted = "\n".join(f"> {line}" if line else ">" for line in text.splitlines()) or "> (an empty message)"
    return (
        f"Hi! This reply comes from the **demo upstream** ({dialect}, model `{model}`), "
        "a built-in stand-in used when no real provider is configured.\n\n"
        f"You wrote:\n\n{quoted}\n\n"
        "| What | Value |\n"
        "| --- | --- |\n"
        f"| Provider | {dialect} |\n"
        f"| Model | `{model}` |\n"
        f"| Characters | {len(text)} |\n\n"
        "A few things to know:\n\n"
        "- The reply is deterministic: ask again and you get the same text.\n"
        "- Tables, lists and code are rendered as markdown.\n"
        "- Configure a real upstream to talk to an actual model.\n\n"
        "```python\n"
        "def greet(name: str) -> str:\n"
        '    return f"Hello, {name}!"\n'
        "```\n\n"
        "Thanks for trying the relay!"
    )


def tool_call_items() -> list[list[dict[str, Any]]]:
    """delta.tool_calls fragments for two get_weather calls, arguments interleaved by index."""
    items: list[list[dict[str, Any]]] = []
    frags = []
    for index, args in enumerate(_TOOL_ARGS):
        items.append(
            [
                {
                    "index": index,
                    "id": new_tool_call_id(),
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        )
        frags.append(split_pieces(args, start=index))
    for i in range(max(len(f) for f in frags)):
        for index, pieces in enumerate(frags):
            if i < len(pieces):
                items.append([{"index": index, "function": {"arguments": pieces[i]}}])
    return items


def named_call_items(calls: list[tuple[str, str]]) -> list[list[dict[str, Any]]]:
    """delta.tool_calls fragments for the calls ``[[call:NAME {json}]]`` asked for, arguments interleaved by index."""
    items: list[list[dict[str, Any]]] = []
    frags = []
    for index, (name, args) in enumerate(calls):
        items.append([{"index": index, "id": new_tool_call_id(), "type": "function",
                       "function": {"name": name, "arguments": ""}}])  # fmt: skip
        frags.append(split_pieces(args, start=index) if args else [])
    for i in range(max((len(f) for f in frags), default=0)):
        for index, pieces in enumerate(frags):
            if i < len(pieces):
                items.append([{"index": index, "function": {"arguments": pieces[i]}}])
    return items
