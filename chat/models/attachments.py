"""Attachments: files a person uploads, then sends with a message; documents as text, images as data URLs.

An upload is checked and read at once (chat/lib/attachment_content.py) and stored without a message
(chat/actions/attachments.py); the
`send` frame that names it ties it to the user's message (chat/models/conversations.py). The
bytes live in the database (ATTACHMENT_STORAGE=database, SQLite's default) or in the
`attachments` storage (a MEDIA_ROOT directory, or S3-compatible with django-storages); either
way they are deleted with their message, and so with their conversation.
"""

from __future__ import annotations

import base64
import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import models
from django.db.models import Sum
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils.translation import gettext as _

from chat.models.base import ChatError

log = logging.getLogger(__name__)

# Uploads never sent with a message are removed after this (at the owner's next upload).
UNSENT_KEPT = timedelta(days=1)
MAX_PER_MESSAGE = 20


def attachment_storage():
    """Looked up at each use, so the STORAGES setting (and a test's override of it) decides."""
    return storages["attachments"]


class AttachmentQuerySet(models.QuerySet):
    def owned_by(self, user):
        return self.filter(owner=user)

    def unsent(self):
        return self.filter(message__isnull=True)

    def stored_bytes(self) -> int:
        return self.aggregate(total=Sum("stored_bytes"))["total"] or 0

    def attach_to(self, message, attachments: list[Attachment]) -> None:
        """Tie uploads to the message they were sent with, in the order the user attached them."""
        for position, attachment in enumerate(attachments):
            attachment.message, attachment.position = message, position
        self.bulk_update(attachments, ["message", "position"])

    def copy_to(self, message, attachments) -> None:
        """Copies of a message's attachments for an edited sibling of it; a stored file is copied too,
        so deleting one branch never removes the other's file."""
        for attachment in attachments:
            path = attachment.path
            attachment.pk, attachment._state.adding = None, True
            attachment.message = message
            if path:
                with attachment_storage().open(path, "rb") as stored:
                    name = f"{attachment.owner_id}/{uuid.uuid4().hex}"
                    attachment.path = attachment_storage().save(name, ContentFile(stored.read()))
            attachment.save()

    def for_message(self, user, ids: list[int]) -> list[Attachment]:
        """The user's unsent uploads with these ids, in that order; not_found for any other id."""
        found = {a.pk: a for a in self.owned_by(user).unsent().filter(pk__in=ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise ChatError(
                "not_found",
                _("No such attachment: %(id)s (each is sent once, with one message).") % {"id": missing[0]},
            )
        return [found[i] for i in ids]


class Attachment(models.Model):
    class Kind(models.TextChoices):
        DOCUMENT = "document"
        IMAGE = "image"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="attachments")
    message = models.ForeignKey(
        "chat.Message", on_delete=models.CASCADE, related_name="attachments", null=True, blank=True
    )
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    content_type = models.CharField(max_length=100, help_text="Of the stored bytes (images: as re-encoded).")
    size = models.PositiveBigIntegerField(help_text="Bytes uploaded.")
    stored_bytes = models.PositiveBigIntegerField(help_text="Bytes kept (file and text), counted in the quota.")
    text = models.TextField(blank=True, help_text="A document's extracted text, as sent to the model.")
    tokens = models.PositiveIntegerField(default=0, help_text="Estimated tokens it adds to a message.")
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    data = models.BinaryField(null=True, blank=True, editable=False)
    path = models.CharField(max_length=300, blank=True, help_text="Its name in the attachments storage, if not here.")
    position = models.PositiveSmallIntegerField(default=0, help_text="Its place among the message's attachments.")
    created = models.DateTimeField(auto_now_add=True)

    objects = AttachmentQuerySet.as_manager()

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self) -> str:
        return self.name

    def read(self) -> bytes:
        if self.data is not None:
            return bytes(self.data)
        with attachment_storage().open(self.path, "rb") as stored:
            return stored.read()

    def data_url(self) -> str:
        return f"data:{self.content_type};base64,{base64.b64encode(self.read()).decode()}"

    def as_json(self) -> dict:
        return {
            "id": self.pk,
            "name": self.name,
            "kind": self.kind,
            "size": self.size,
            "tokens": self.tokens,
            "content_type": self.content_type,
            "width": self.width,
            "height": self.height,
            "url": f"/api/attachments/{self.pk}",
        }


@receiver(post_delete, sender=Attachment)
def delete_stored_file(sender, instance: Attachment, **kwargs) -> None:
    """A deleted attachment's file goes too (a conversation's delete cascades here)."""
    if instance.path:
        try:
            attachment_storage().delete(instance.path)
        except Exception as exc:  # the row is gone either way; an orphaned file is only logged
            log.warning("could not delete the file of attachment %s: %r", instance.pk, exc)


def human_size(size: float) -> str:
    """Sizes as the page writes them (static/chat/attachments.js): 615 bytes, 4.2 MB, 20 MB."""
    if size < 1000:
        return f"{size:.0f} bytes"
    for unit in ("KB", "MB", "GB"):
        size /= 1000
        if size < 1000 or unit == "GB":
            break
    return f"{size:.1f} {unit}" if size < 10 else f"{size:,.0f} {unit}"
