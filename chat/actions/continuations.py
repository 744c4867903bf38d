"""A shared conversation continued by a reader: a copy of the branch shared in their own chats.

The copy is what the share page shows (the snapshot, or the branch shown now for a live link; usage
only when the owner chose to show it, kept as informational `imported_usage`, never metered), with
the attachments of its messages copied to the reader, within the reader's storage quota.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction
from django.utils.translation import gettext as _

from chat.actions.shares import shared_content
from chat.metering import metered_streams
from chat.models import Attachment, ChatError, Conversation, Message, Share
from chat.models.attachments import attachment_storage, human_size


def _attachments(share: Share, message_ids: list[int]) -> dict[int, list[Attachment]]:
    """The attachments of the shared messages that still exist, by message, in their order."""
    found: dict[int, list[Attachment]] = {}
    rows = Attachment.objects.filter(message_id__in=message_ids, message__conversation_id=share.conversation_id)
    for attachment in rows.order_by("message_id", "position", "pk"):
        found.setdefault(attachment.message_id, []).append(attachment)
    return found


def _check_quota(reader, attachments: dict[int, list[Attachment]]) -> None:
    needed = sum(a.stored_bytes for group in attachments.values() for a in group)
    if not needed:
        return
    used = Attachment.objects.owned_by(reader).stored_bytes()
    if used + needed > settings.ATTACHMENT_QUOTA_BYTES:
        raise ChatError(
            "quota_exceeded",
            _(
                "Its attachments would take your storage to %(size)s, over your quota of %(quota)s; "
                "delete conversations with attachments to make room."
            )
            % {"size": human_size(used + needed), "quota": human_size(settings.ATTACHMENT_QUOTA_BYTES)},
        )


def _copy_attachment(attachment: Attachment, reader, message: Message) -> None:
    copy = Attachment(
        owner=reader, message=message, name=attachment.name, kind=attachment.kind,
        content_type=attachment.content_type, size=attachment.size, stored_bytes=attachment.stored_bytes,
        text=attachment.text, tokens=attachment.tokens, width=attachment.width, height=attachment.height,
        position=attachment.position,
    )  # fmt: skip
    if attachment.path:  # a file of its own: deleting either conversation never removes the other's
        with attachment_storage().open(attachment.path, "rb") as stored:
            copy.path = attachment_storage().save(f"{reader.pk}/{uuid.uuid4().hex}", ContentFile(stored.read()))
    else:
        copy.data = attachment.data
    copy.save()


def continue_shared(share: Share, reader) -> Conversation:
    """A new conversation of `reader` with the shared messages (and attachments), its end the branch shown."""
    content = shared_content(share)
    messages = content["messages"]
    attachments = _attachments(share, [m["id"] for m in messages])
    first = next((m["content"] for m in messages if m["role"] == Message.Role.USER and m["content"]), "")
    with transaction.atomic():
        # Counted and copied under the reader's row lock: ten copies asked at once each found room for one.
        metered_streams.lock_person(reader.pk)
        _check_quota(reader, attachments)
        conversation = Conversation.objects.create(
            owner=reader, title=content["title"] or Conversation.title_for(first), model=content["model"] or ""
        )
        parent = None
        for shared in messages:
            # An answer still being written when shared is, here, the text it had: ended early.
            status = Message.Status.INTERRUPTED if shared["status"] == Message.Status.STREAMING else shared["status"]
            parent = Message.objects.create(
                conversation=conversation, parent=parent, role=shared["role"], content=shared["content"],
                reasoning=shared["reasoning"], thinking_ms=shared["thinking_ms"], tool_calls=shared["tool_calls"],
                tool_rounds=shared.get("tool_rounds"),  # a snapshot made before tools has none
                status=status, finish_reason=shared["finish_reason"] or "", error=shared["error"] or "",
                model=shared["model"], imported_usage=shared["usage"],
            )  # fmt: skip
            for attachment in attachments.get(shared["id"], []):
                _copy_attachment(attachment, reader, parent)
        conversation.current = parent
        conversation.save(update_fields=["current"])
    return conversation
