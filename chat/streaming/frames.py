"""The websocket frames of a reply: encoded once, snapshots cut to a size a socket takes, `done`, merged deltas."""

from __future__ import annotations

from typing import Any

import orjson
from channels.layers import get_channel_layer


def conversation_group(conversation_id: int) -> str:
    """The sockets watching a conversation."""
    return f"chat.conversation.{conversation_id}"


def frame(**fields: Any) -> str:
    """A websocket frame, encoded once however many sockets receive it."""
    return orjson.dumps(fields).decode()


def snapshot_frame(conversation: int, message: int, content: str, reasoning: str, status: str, model: str,
                   seq: int | None, tool_rounds: list | None = None, **more: bool) -> str:  # fmt: skip
    """The text of a reply so far; seq is the last delta it includes (None: read from the database).

    `more=True`: the first of several frames (snapshot_frames)."""
    rounds = {"tool_rounds": tool_rounds} if tool_rounds else {}  # only on an answer that called tools
    return frame(
        type="snapshot", conversation=conversation, message=message, content=content, reasoning=reasoning,
        status=status, model=model, seq=seq, **more, **rounds,
    )  # fmt: skip


# Characters of text in one frame. Daphne drops a socket that is sent a frame over 1 MiB,
# and JSON escaping can make a character six bytes ("\u001f"): 128 Ki characters stay under it.
MAX_FRAME_CHARS = 128 * 1024


def split_text(reasoning: str, content: str, size: int = MAX_FRAME_CHARS) -> list[tuple[str, str]]:
    """(reasoning, content) pieces of at most `size` characters together, reasoning first; at least one."""
    parts: list[tuple[str, str]] = []
    r = c = 0
    while r < len(reasoning) or c < len(content) or not parts:
        reasoning_part = reasoning[r : r + size]
        r += len(reasoning_part)
        room = size - len(reasoning_part)
        content_part = content[c : c + room] if room else ""
        c += len(content_part)
        parts.append((reasoning_part, content_part))
    return parts


def snapshot_frames(conversation: int, message: int, content: str, reasoning: str, status: str, model: str,
                    seq: int | None, tool_rounds: list | None = None) -> list[str]:  # fmt: skip
    """snapshot_frame() cut into frames a socket can take: a `snapshot` with `more: true`
    followed by `snapshot_part` frames whose text is appended, the last with `more: false`."""
    parts = split_text(reasoning, content)
    if len(parts) == 1:
        return [snapshot_frame(conversation, message, content, reasoning, status, model, seq, tool_rounds)]
    texts = []
    for index, (reasoning_part, content_part) in enumerate(parts):
        more = index < len(parts) - 1
        if index == 0:
            texts.append(snapshot_frame(
                conversation, message, content_part, reasoning_part, status, model, seq, tool_rounds, more=more
            ))  # fmt: skip
        else:
            fields: dict[str, Any] = {"type": "snapshot_part", "message": message, "more": more}
            if content_part:
                fields["content"] = content_part
            if reasoning_part:
                fields["reasoning"] = reasoning_part
            texts.append(frame(**fields))
    return texts


def done_frame(conversation: int, message: int, status: str, finish_reason: str | None, usage: dict | None,
               error: str, *, thinking_ms: int | None = None, tool_calls: list | None = None,
               recovered: bool = False) -> str:  # fmt: skip
    """The `done` frame's text.

    `recovered`: the stream's process died and a sweep ended it (or a socket missed its end); the stored text may
    be shorter than what a tab was shown (the text after the process's last save is lost), so the tabs read it again.
    """
    more = {"recovered": True} if recovered else {}
    return frame(
        type="done", message=message, conversation=conversation, status=status, finish_reason=finish_reason,
        usage=usage, error=error or None, thinking_ms=thinking_ms, tool_calls=tool_calls or None, **more,
    )  # fmt: skip


async def send_done(conversation: int, message: int, status: str, finish_reason: str | None,
                    usage: dict | None, error: str, *, thinking_ms: int | None = None,
                    tool_calls: list | None = None, recovered: bool = False) -> None:  # fmt: skip
    """The `done` frame (done_frame) to every socket watching the conversation."""
    text = done_frame(conversation, message, status, finish_reason, usage, error, thinking_ms=thinking_ms,
                      tool_calls=tool_calls, recovered=recovered)  # fmt: skip
    # Never waits on Redis: after the deltas, in order, whenever it answers (chat/runtime/channel_layers.py).
    get_channel_layer().post_to_group(
        conversation_group(conversation), {"type": "chat.done", "message": message, "text": text}
    )


def merge_deltas(first: dict, then: dict) -> dict | None:
    """Two `chat.delta` messages of one reply as one; None when they do not fit.

    It has the later seq, the text of both, and in `first` the seq its text starts at, so a
    socket can tell a merged delta from one that follows a lost one (ChatConsumer.chat_delta).
    """
    if first.get("type") != "chat.delta" or then.get("type") != "chat.delta" or first["message"] != then["message"]:
        return None
    a, b = orjson.loads(first["text"]), orjson.loads(then["text"])
    content, reasoning = a.get("content", "") + b.get("content", ""), a.get("reasoning", "") + b.get("reasoning", "")
    if len(content) + len(reasoning) > MAX_FRAME_CHARS:
        return None
    fields: dict[str, Any] = {"type": "delta", "message": b["message"], "seq": b["seq"]}
    if content:
        fields["content"] = content
    if reasoning:
        fields["reasoning"] = reasoning
    return {**then, "text": frame(**fields), "first": first.get("first", first["seq"])}
