"""Deleting conversations: the rows go, and an answer still streaming in one is stopped wherever it runs."""

from __future__ import annotations

import time
from collections import defaultdict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from chat.actions import sidebar_events
from chat.models import Message
from chat.runtime import db_busy
from chat.runtime.control import control_request


def delete_conversations(conversations, tab: str = "") -> int:
    """Delete these conversations (a queryset); how many. A stream's usage row is kept, unlinked.

    Their owners' tabs are told (sidebar_events); `tab`: the requesting page's.
    """
    streaming = list(
        Message.objects.streaming()
        .filter(conversation__in=conversations, worker__isnull=False)
        .values_list("pk", "worker__channel")
    )
    gone: dict[int, list[int]] = defaultdict(list)
    for conversation in conversations.iterator(chunk_size=500):
        gone[conversation.owner_id].append(conversation.pk)  # before the delete, which sets pk to None
        delete_one(conversation)  # one by one, as `manage.py purge` does: attachments' files go with each
    for message_id, channel in streaming:  # its generation stops and finds nothing left to save
        async_to_sync(get_channel_layer().send)(channel, control_request("stop", message_id))
    for owner_id, ids in gone.items():
        sidebar_events.deleted(owner_id, ids, tab)
    return sum(len(ids) for ids in gone.values())


def delete_one(conversation) -> None:
    """A conversation's messages CHAT_BATCH_ROWS to a transaction, newest first (answers before what they answer),
    each batch after a pause as long as the last one took (others get the write lock between them); then the row.

    One transaction for a conversation of 20,000 messages held SQLite's write lock for seconds.
    """
    took = None
    while True:
        if took is not None:
            time.sleep(db_busy.pause_after(took))
        began = time.monotonic()
        if not delete_batch(conversation.pk):
            break
        took = time.monotonic() - began
    conversation.delete()


def delete_batch(conversation_id: int) -> bool:
    """Delete the newest CHAT_BATCH_ROWS messages of a conversation, in one transaction; whether more are left."""
    size = max(1, settings.CHAT_BATCH_ROWS)
    messages = Message.objects.filter(conversation_id=conversation_id).order_by("-pk").values_list("pk", flat=True)
    ids = list(messages[:size])
    if ids:
        Message.objects.filter(pk__in=ids).delete()
    return len(ids) == size
