"""Telling a person's tabs that their conversations changed outside a chat turn.

A rename, a move, an archive or a delete over the page's JSON API, an import, a copy from a
share link or a folder's change reaches every tab of that person, on every process, once
committed: each sidebar refreshes, and a tab showing the changed conversation follows it (a new
title, the archived banner, or a new chat when it was deleted). `tab` is the requesting page's
X-Chat-Tab header, so that page knows the change was its own.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from chat.lib.channel_groups import user_group
from chat.streaming.frames import frame

log = logging.getLogger(__name__)

EVENT = "chat.conversations"  # ChatConsumer.chat_conversations


def tab_of(request) -> str:
    """The requesting page's id (X-Chat-Tab), or "" (a form, a script)."""
    return request.headers.get("X-Chat-Tab", "")[:40]


def changed(conversation, tab: str = "") -> None:
    """One conversation's title, archive state, pin or folder changed."""
    shown = {"id": conversation.pk, "title": conversation.title, "archived": conversation.archived}
    _tell(conversation.owner_id, tab=tab, changed=shown)


def deleted(owner_id: int, ids: list[int], tab: str = "") -> None:
    """These conversations of one person are gone."""
    if ids:
        _tell(owner_id, tab=tab, deleted=ids)


def listed(owner_id: int, tab: str = "") -> None:
    """Conversations or folders came or changed (an import, a copy, a folder): the sidebars read the list again."""
    _tell(owner_id, tab=tab)


def _tell(owner_id: int, **fields: Any) -> None:
    text = frame(type="conversations", **fields)

    def send() -> None:
        try:
            async_to_sync(get_channel_layer().group_send)(user_group(owner_id), {"type": EVENT, "text": text})
        except Exception as exc:  # the change is stored: the other tabs see it at their next refresh anyway
            log.warning("could not tell user %s's tabs that their conversations changed: %r", owner_id, exc)

    transaction.on_commit(send)
