"""Exports written to their download as they are read: CHAT_PAGE_MESSAGES messages to a read, however long.

The same JSON and Markdown as chat/actions/exports.py, whose pieces they use, but never a whole
conversation (or a whole account) in memory or in one database call: each read is one short call on
the database threads (chat/runtime/db_threads.py), with others' work between them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from django.conf import settings
from django.utils import timezone

from chat.actions import exports
from chat.lib.conversation_json import message_json
from chat.models import Conversation, Message
from chat.runtime import db_threads


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _conversation_ids(user_id: int, conversation_id: int | None) -> list[int]:
    found = Conversation.objects.filter(owner_id=user_id).order_by("created", "pk")
    if conversation_id is not None:
        found = found.filter(pk=conversation_id)
    return list(found.values_list("pk", flat=True))


def _conversation(pk: int, path_only: bool) -> tuple[Conversation, list[int]] | None:
    """The conversation, and the ids of its messages to export: every one (JSON), or the branch shown (Markdown)."""
    conversation = Conversation.objects.filter(pk=pk).first()
    if conversation is None:  # deleted while the export ran
        return None
    ids = conversation.path_ids() if path_only else list(conversation.messages.values_list("pk", flat=True))
    return conversation, ids


def _messages(ids: list[int]) -> list[dict]:
    """These messages (at most a page of them) as an export keeps them, in the order of `ids`."""
    rows = Message.objects.filter(pk__in=ids).prefetch_related("usages", "attachments").in_bulk()
    return [message_json(rows[pk], export=True) for pk in ids if pk in rows]


async def _pages(ids: list[int]) -> AsyncIterator[list[dict]]:
    size = max(1, settings.CHAT_PAGE_MESSAGES)
    for start in range(0, len(ids), size):
        yield await db_threads.run(_messages)(ids[start : start + size])


async def json_export(user_id: int, conversation_id: int | None = None) -> AsyncIterator[bytes]:
    """The JSON export (the whole tree of each conversation), in pieces."""
    head = {"format": exports.FORMAT, "version": exports.VERSION, "exported": timezone.now().isoformat()}
    yield (_dumps(head)[:-1] + ', "conversations": [').encode()
    first = True
    for pk in await db_threads.run(_conversation_ids)(user_id, conversation_id):
        found = await db_threads.run(_conversation)(pk, False)
        if found is None:
            continue
        conversation, ids = found
        yield (("" if first else ",\n") + _dumps(exports._head(conversation))[:-1] + ', "messages": [\n').encode()
        first, separator = False, ""
        async for page in _pages(ids):
            yield (separator + ",\n".join(_dumps(message) for message in page)).encode()
            separator = ",\n"
        yield b"]}"
    yield b"]}\n"


async def markdown_export(user_id: int, conversation_id: int | None = None) -> AsyncIterator[bytes]:
    """The Markdown export (the branch shown of each conversation), in pieces."""
    first = True
    for pk in await db_threads.run(_conversation_ids)(user_id, conversation_id):
        found = await db_threads.run(_conversation)(pk, True)
        if found is None:
            continue
        conversation, ids = found
        if not first:
            yield b"\n---\n\n"
        first = False
        pending = exports.markdown_head(conversation)  # held back: the very end loses its trailing blank lines
        async for page in _pages(ids):
            yield pending.encode()
            pending = "".join(exports.markdown_message(message) for message in page)
        yield (pending.rstrip() + "\n").encode()
