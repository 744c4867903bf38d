"""Conversations out and in: JSON (the whole tree, usage per answer), Markdown (the branch shown), and import."""

from __future__ import annotations

import re
from datetime import datetime
from html import escape

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from chat.lib.conversation_json import message_json
from chat.lib.json_depth import MAX_STORED_DEPTH, TooDeep, loads_stored
from chat.lib.model_params import MAX_SYSTEM_PROMPT
from chat.lib.request_fields import parse_params
from chat.models import ChatError, Conversation, Message
from chat.models.conversations import branch_ids
from chat.streaming import tool_loop

FORMAT = "team-chat/conversations"
VERSION = 1
MAX_TITLE = 200
MAX_FIELD = 100  # the short text fields of a message: model, finish_reason
STATUSES = {choice.value for choice in Message.Status if choice != Message.Status.STREAMING}
USAGE_FIELDS = {
    "prompt_tokens", "completion_tokens", "reasoning_tokens", "total_tokens", "cost", "ttft_ms", "duration_ms",
    "tokens_per_second", "estimated",
}  # fmt: skip


# --- out -----------------------------------------------------------------------


def _messages(conversations) -> dict[int, list[Message]]:
    """Every message of these conversations by conversation, in order, read in a few queries for them all."""
    rows = Message.objects.filter(conversation__in=conversations).prefetch_related("usages")
    grouped: dict[int, list[Message]] = {c.pk: [] for c in conversations}
    for message in rows.prefetch_related("attachments").order_by("conversation", "created", "pk").iterator(2000):
        grouped[message.conversation_id].append(message)
    return grouped


def _path(messages: list[Message], current_id: int | None) -> list[Message]:
    """The branch shown, root first, from messages in hand."""
    by_id = {m.pk: m for m in messages}
    return [by_id[pk] for pk in branch_ids({m.pk: m.parent_id for m in messages}, current_id)]


def _head(conversation: Conversation) -> dict:
    return {
        "title": conversation.title,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "params": conversation.params,
        "created": conversation.created.isoformat(),
        "updated": conversation.updated.isoformat(),
        "current": conversation.current_id,
    }


def tree_json(conversation: Conversation, messages: list[Message] | None = None) -> dict:
    """The whole conversation: every message of every branch, and `current`, the end of the branch shown."""
    messages = _messages([conversation])[conversation.pk] if messages is None else messages
    return {**_head(conversation), "messages": [message_json(m, export=True) for m in messages]}


def path_json(conversation: Conversation, messages: list[Message] | None = None) -> dict:
    """Only the branch shown, root first (a share, the Markdown export)."""
    messages = _messages([conversation])[conversation.pk] if messages is None else messages
    return {
        **_head(conversation),
        "messages": [message_json(m, export=True) for m in _path(messages, conversation.current_id)],
    }


def export_json(conversations) -> dict:
    conversations = list(conversations)
    grouped = _messages(conversations)
    return {"format": FORMAT, "version": VERSION, "exported": timezone.now().isoformat(),
            "conversations": [tree_json(c, grouped[c.pk]) for c in conversations]}  # fmt: skip


def markdown(conversation: Conversation, messages: list[Message] | None = None) -> str:
    """The branch shown as Markdown: the title, then each message under its speaker; reasoning folded."""
    shown = path_json(conversation, messages)
    text = markdown_head(conversation) + "".join(markdown_message(message) for message in shown["messages"])
    return text.rstrip() + "\n"


def markdown_head(conversation: Conversation) -> str:
    """A conversation's Markdown before its messages: the title, the system prompt."""
    lines = [f"# {conversation.title or _('Conversation')}", ""]
    if conversation.system_prompt:
        lines += [f"> **{_('System prompt')}:** " + conversation.system_prompt.replace("\n", "\n> "), ""]
    return "".join(line + "\n" for line in lines)


def markdown_message(message: dict) -> str:
    """One message (as message_json exports it) in Markdown, under its speaker."""
    who = _("You") if message["role"] == Message.Role.USER else (message["model"] or _("Assistant"))
    lines = [f"## {who}", ""]
    if message["attachments"]:
        names = ", ".join(a["name"] for a in message["attachments"])
        lines += [f"*{_('Attached')}: {names}*", ""]
    if message["reasoning"]:
        lines += [f"<details><summary>{_('Reasoning')}</summary>", "", message["reasoning"], "", "</details>", ""]
    lines += markdown_answer(message["content"], message.get("tool_rounds"))
    if message["error"]:
        lines += [f"*{message['status']}: {message['error']}*", ""]
    return "".join(line + "\n" for line in lines)


def markdown_answer(content: str, rounds: list | None) -> list[str]:
    """An answer's text with each round's tool calls folded in where the model made them."""
    lines: list[str] = []
    start = 0
    for entry in rounds or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), int):
            continue
        at = max(start, entry["at"])
        if content[start:at].strip():
            lines += [content[start:at], ""]
        for call in entry.get("calls") or []:
            if isinstance(call, dict):
                lines += markdown_call(call)
        start = at
    return [*lines, content[start:], ""]


def markdown_call(call: dict) -> list[str]:
    """One tool call, folded: its tool, server and status, its arguments and what it answered (as code: untrusted)."""
    title = " · ".join(str(part) for part in (call.get("tool") or call.get("name"), call.get("server"),
                                              call.get("status")) if part)  # fmt: skip
    answered = call.get("result") if call.get("status") == "ok" else call.get("error")
    lines = [f"<details><summary>{escape(_('Tool call'))} · {escape(title)}</summary>", ""]
    lines += [fenced(str(call.get("arguments") or "{}"), "json"), ""]
    if answered:
        lines += [fenced(str(answered)), ""]
    return [*lines, "</details>", ""]


def fenced(text: str, info: str = "") -> str:
    """`text` in a code fence longer than any run of backticks in it, so no text can end it early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def markdown_all(conversations) -> str:
    conversations = list(conversations)
    grouped = _messages(conversations)
    return "\n---\n\n".join(markdown(c, grouped[c.pk]) for c in conversations)


# --- in ------------------------------------------------------------------------


def bad(detail: str) -> ChatError:
    return ChatError("bad_import", detail)


def _text(value, where: str, limit: int | None = None) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad(_("%(where)s must be text.") % {"where": where})
    if limit is not None and len(value) > limit:
        raise bad(_("%(where)s is longer than %(limit)s characters.") % {"where": where, "limit": limit})
    return value


def _usage(value, where: str) -> dict | None:
    """Usage is informational: only its known numeric fields are kept."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad(_("%(where)s: usage must be an object.") % {"where": where})
    kept = {}
    for name in USAGE_FIELDS & value.keys():
        field = value[name]
        wrong = isinstance(field, bool) != (name == "estimated") or not isinstance(field, int | float)
        if field is not None and wrong:
            raise bad(_("%(where)s: usage.%(name)s must be a number.") % {"where": where, "name": name})
        kept[name] = field
    return kept


def _when(value, where: str) -> datetime | None:
    """A time from the file (None when missing: it will be now). One that cannot be read is refused: taken
    as now, it put a conversation's first question after its answers."""
    if value is None:
        return None
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well formed but no such date
        parsed = None
    if parsed is None:
        raise bad(_("%(where)s is not a date and time such as 2026-12-06T10:00:00Z.") % {"where": where})
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


def parse(raw: bytes) -> list[dict]:
    """The conversations in an export (one conversation or all), checked; ChatError `bad_import` says what is wrong."""
    if len(raw) > settings.CHAT_IMPORT_MAX_BYTES:
        raise ChatError("too_large", too_large_text())
    try:
        data = loads_stored(raw)
    except TooDeep:  # [[[[… as deep as the file allows
        raise bad(
            _("The file nests lists or objects more than %(depth)s levels deep: it is not an export of this chat.")
            % {"depth": MAX_STORED_DEPTH}
        ) from None
    except ValueError:  # not JSON, or text that cannot be stored: a lone surrogate, NaN
        raise bad(_("The file is not JSON: choose a .json file exported from this chat.")) from None
    if not isinstance(data, dict):
        raise bad(_("The file is not an export of this chat."))
    if "conversations" in data:
        if data.get("format") != FORMAT:
            raise bad(_("The file is not an export of this chat."))
        if not isinstance(data.get("version"), int) or data["version"] > VERSION:
            raise bad(_("The file comes from a newer version of this chat."))
        conversations = data["conversations"]
        if not isinstance(conversations, list):
            raise bad(_("`conversations` must be a list."))
    elif isinstance(data.get("messages"), list):
        conversations = [data]  # one conversation's export
    else:
        raise bad(_("The file is not an export of this chat."))
    if not conversations:
        raise bad(_("The file holds no conversation."))
    _refuse_too_many(conversations)
    return [_conversation(c, n) for n, c in enumerate(conversations, 1)]


def _conversation(data, number: int) -> dict:
    where = _("Conversation %(number)s") % {"number": number}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise bad(_("%(where)s has no list of messages.") % {"where": where})
    try:  # remembered params go upstream with the next message: the chat's own checks
        params = {k: v for k, v in parse_params(data.get("params")).items() if v is not None}
    except ChatError as exc:
        raise bad(f"{where}: {exc.detail}") from None
    messages, seen = [], set()
    for index, message in enumerate(data["messages"], 1):
        at = _("%(where)s, message %(index)s") % {"where": where, "index": index}
        messages.append(_message(message, at, seen))
        seen.add(messages[-1]["id"])
    parent_of = {m["id"]: m["parent"] for m in messages}
    for message in messages:
        if message["parent"] is not None and message["parent"] not in parent_of:
            raise bad(_("%(where)s: a message answers one that is not in the file.") % {"where": where})
    _refuse_cycles(parent_of, where)
    current = data.get("current")
    if current is not None and current not in parent_of:
        raise bad(_("%(where)s: `current` is not one of its messages.") % {"where": where})
    return {
        "title": _text(data.get("title"), f"{where}: title", MAX_TITLE),
        "model": _text(data.get("model"), f"{where}: model", MAX_FIELD * 3),
        "system_prompt": _text(data.get("system_prompt"), f"{where}: system_prompt", MAX_SYSTEM_PROMPT),
        "params": params,
        "created": _when(data.get("created"), f"{where}: created"),
        "updated": _when(data.get("updated"), f"{where}: updated"),
        "current": current,
        "messages": messages,
    }


def _message(data, where: str, seen: set) -> dict:
    if not isinstance(data, dict):
        raise bad(_("%(where)s is not an object.") % {"where": where})
    pk, parent = data.get("id"), data.get("parent")
    if not isinstance(pk, int) or isinstance(pk, bool) or pk in seen:
        raise bad(_("%(where)s needs an id of its own (a whole number).") % {"where": where})
    if parent is not None and (not isinstance(parent, int) or isinstance(parent, bool)):
        raise bad(_("%(where)s: parent must be the id of another message.") % {"where": where})
    role = data.get("role")
    if role not in (Message.Role.USER, Message.Role.ASSISTANT):
        raise bad(_("%(where)s: role must be user or assistant.") % {"where": where})
    status = data.get("status") or Message.Status.COMPLETE
    if status == Message.Status.STREAMING:  # exported mid-stream: here it will never go on
        status = Message.Status.INTERRUPTED
    if status not in STATUSES:
        raise bad(_("%(where)s: unknown status.") % {"where": where})
    thinking_ms = data.get("thinking_ms")
    if thinking_ms is not None and not _whole(thinking_ms):
        raise bad(_("%(where)s: thinking_ms must be a whole number.") % {"where": where})
    tool_calls = data.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise bad(_("%(where)s: tool_calls must be a list.") % {"where": where})
    tool_rounds = data.get("tool_rounds")
    if tool_rounds is not None and not _rounds(tool_rounds):
        raise bad(_("%(where)s: tool_rounds must be a list of rounds, each with `at` and `calls`.") % {"where": where})
    limit = settings.CHAT_MAX_REPLY_BYTES
    return {
        "id": pk,
        "parent": parent,
        "role": role,
        "content": _text(data.get("content"), f"{where}: content", limit),
        "reasoning": _text(data.get("reasoning"), f"{where}: reasoning", limit),
        "thinking_ms": thinking_ms,
        "tool_calls": tool_calls,
        # Shown and sent upstream as the answer's history; an import runs no tool and grants none.
        "tool_rounds": _settled(tool_rounds) or None,
        "status": status,
        "finish_reason": _text(data.get("finish_reason"), f"{where}: finish_reason", MAX_FIELD)[:30],
        "error": _text(data.get("error"), f"{where}: error", limit),
        "model": _text(data.get("model"), f"{where}: model", MAX_FIELD * 3),
        "created": _when(data.get("created"), f"{where}: created"),
        "usage": _usage(data.get("usage"), where),
    }


def _rounds(value) -> bool:
    """An answer's tool rounds as exported: [{"at": offset, "calls": [{...}, …]}, …]."""
    return isinstance(value, list) and all(
        isinstance(entry, dict) and _whole(entry.get("at")) and isinstance(entry.get("calls"), list)
        and all(isinstance(call, dict) for call in entry["calls"])
        for entry in value
    )  # fmt: skip


def _settled(rounds: list | None) -> list | None:
    """The rounds with a call left waiting or running (exported mid-turn, or written so) ended as cancelled: an
    imported answer runs nothing, and its page must not offer Approve or count a call's seconds for ever."""
    for entry in rounds or []:
        for call in entry["calls"]:
            if call.get("status") in (*tool_loop.UNFINISHED, "streaming"):
                call["status"], call["error"] = tool_loop.CANCELLED, "not finished when it was exported"
    return rounds


def _whole(value) -> bool:
    """A whole number that fits a positive integer column."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def _refuse_cycles(parent_of: dict, where: str) -> None:
    done: set = set()
    for start in parent_of:
        trail: set = set()
        pk = start
        while pk is not None and pk not in done:
            if pk in trail:
                raise bad(_("%(where)s: its messages answer each other in a loop.") % {"where": where})
            trail.add(pk)
            pk = parent_of[pk]
        done |= trail


def _refuse_too_many(conversations: list) -> None:
    """More conversations or messages than one import stores (CHAT_IMPORT_MAX_*): ChatError `too_large` (a 413)."""
    if len(conversations) > settings.CHAT_IMPORT_MAX_CONVERSATIONS:
        raise ChatError("too_large", _(
            "The file holds %(count)s conversations; this server imports at most %(limit)s at once."
        ) % {"count": len(conversations), "limit": settings.CHAT_IMPORT_MAX_CONVERSATIONS})  # fmt: skip
    lists = (c.get("messages") for c in conversations if isinstance(c, dict))
    count = sum(len(messages) for messages in lists if isinstance(messages, list))
    if count > settings.CHAT_IMPORT_MAX_MESSAGES:
        raise ChatError("too_large", _(
            "The file holds %(count)s messages; this server imports at most %(limit)s at once."
        ) % {"count": count, "limit": settings.CHAT_IMPORT_MAX_MESSAGES})  # fmt: skip


def too_large_text() -> str:
    megabytes = settings.CHAT_IMPORT_MAX_BYTES / 1_000_000
    return _("The file is larger than %(size)s MB, the most this server imports.") % {"size": f"{megabytes:g}"}


def _first_text(data: dict) -> str:
    return next((m["content"] for m in data["messages"] if m["role"] == Message.Role.USER and m["content"]), "")
