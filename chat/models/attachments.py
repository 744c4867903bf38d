"""Attachments: files a person uploads, then sends with a message; documents as text, images as data URLs.

An upload is checked and read at once (chat/extract.py) and stored without a message; the
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
from django.utils import timezone
from django.utils.translation import gettext as _

from .. import extract
from .base import ChatError

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

    @classmethod
    def create_for(cls, owner, name: str, size: int, inspected: extract.Inspected) -> Attachment:
        """Store a checked upload, within the owner's quota; unsent uploads a day old go first."""
        old = cls.objects.owned_by(owner).unsent().filter(created__lt=timezone.now() - UNSENT_KEPT)
        for stale in old:
            stale.delete()
        stored = len(inspected.data) + len(inspected.text.encode())
        used = cls.objects.owned_by(owner).stored_bytes()
        if used + stored > settings.ATTACHMENT_QUOTA_BYTES:
            raise ChatError(
                "quota_exceeded",
                _(
                    "Your attachments would take %(size)s, over your storage quota of %(quota)s; "
                    "delete conversations with attachments to make room."
                )
                % {"size": human_size(used + stored), "quota": human_size(settings.ATTACHMENT_QUOTA_BYTES)},
            )
        attachment = cls(
            owner=owner,
            name=name[:255] or "attachment",
            kind=inspected.kind,
            content_type=inspected.content_type,
            size=size,
            stored_bytes=stored,
            text=inspected.text,
            tokens=inspected.tokens,
            width=inspected.width,
            height=inspected.height,
        )
        if settings.ATTACHMENT_STORAGE == "database":
            attachment.data = inspected.data
        else:
            # Never the user's file name: no path tricks, no collisions, nothing guessable.
            name = f"{owner.pk}/{uuid.uuid4().hex}"
            attachment.path = attachment_storage().save(name, ContentFile(inspected.data))
        attachment.save()
        return attachment

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


# --- what the model is sent -------------------------------------------------------------


def document_block(attachment: Attachment) -> str:
    """A document's text, delimited, with its name: the model can tell it apart from the user's words."""
    name = attachment.name.replace('"', "'")
    return f'<attachment name="{name}">\n{attachment.text}\n</attachment>'


def upstream_content(text: str, attachments: list[Attachment], *, images: bool) -> str | list[dict]:
    """A user message's content for the upstream: documents before the words, then the images as parts.

    images=False (a model that does not accept them, earlier in a conversation): each image
    becomes a one-line note instead, so the rest of the conversation can still go on.
    """
    blocks = [document_block(a) for a in attachments if a.kind == Attachment.Kind.DOCUMENT]
    pictures = [a for a in attachments if a.kind == Attachment.Kind.IMAGE]
    if pictures and not images:
        blocks += [f"[An image, {a.name}, was attached here; this model does not accept images.]" for a in pictures]
        pictures = []
    joined = "\n\n".join([*blocks, text] if text else blocks)
    if not pictures:
        return joined
    parts: list[dict] = [{"type": "text", "text": joined}] if joined else []
    parts += [{"type": "image_url", "image_url": {"url": a.data_url()}} for a in pictures]
    return parts


def check_message(attachments: list[Attachment], text: str) -> None:
    """The per-message limits: bytes uploaded and estimated tokens (the words and the documents)."""
    if len(attachments) > MAX_PER_MESSAGE:
        raise ChatError(
            "too_many_attachments",
            _("At most %(count)s attachments can go with one message.") % {"count": MAX_PER_MESSAGE},
        )
    size = sum(a.size for a in attachments)
    if size > settings.ATTACHMENT_MAX_MESSAGE_BYTES:
        raise ChatError(
            "attachments_too_large",
            _("The attachments add up to %(size)s, over the limit of %(limit)s per message.")
            % {"size": human_size(size), "limit": human_size(settings.ATTACHMENT_MAX_MESSAGE_BYTES)},
        )
    tokens = extract.estimate_tokens(text) + sum(a.tokens for a in attachments)
    if tokens > settings.ATTACHMENT_MAX_MESSAGE_TOKENS:
        raise ChatError(
            "too_many_tokens",
            _(
                "The message with its attachments comes to about %(tokens)s tokens, over the limit of "
                "%(limit)s per message; attach less, or a shorter document."
            )
            % {"tokens": f"{tokens:,}", "limit": f"{settings.ATTACHMENT_MAX_MESSAGE_TOKENS:,}"},
        )
