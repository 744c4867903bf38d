"""Attachments as a person adds them: an upload stored within their quota, and a message's limits."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from chat.lib import attachment_content
from chat.lib.token_estimate import estimate_tokens
from chat.metering import metered_streams
from chat.models.attachments import MAX_PER_MESSAGE, UNSENT_KEPT, Attachment, attachment_storage, human_size
from chat.models.base import ChatError


def store_upload(owner, name: str, size: int, inspected: attachment_content.Inspected) -> Attachment:
    """Store a checked upload, within the owner's quota; unsent uploads a day old go first."""
    old = Attachment.objects.owned_by(owner).unsent().filter(created__lt=timezone.now() - UNSENT_KEPT)
    for stale in old:
        stale.delete()
    stored = len(inspected.data) + len(inspected.text.encode())
    attachment = Attachment(
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
        # Never the user's file name: no path tricks, no collisions, nothing guessable. Written before the
        # transaction below, which holds the person's row lock (on SQLite, every writer) for a row's insert only.
        name = f"{owner.pk}/{uuid.uuid4().hex}"
        attachment.path = attachment_storage().save(name, ContentFile(inspected.data))
    try:
        with transaction.atomic():
            # Under the person's row lock, as a copy into their conversations is: uploads to two server
            # processes at once cannot each find the same room.
            metered_streams.lock_person(owner.pk)
            check_quota(owner, stored)
            attachment.save()
    except BaseException:
        if attachment.path:
            attachment_storage().delete(attachment.path)
        raise
    return attachment


def check_quota(owner, adding: int) -> None:
    """quota_exceeded if `adding` more bytes would take the owner's attachments over ATTACHMENT_QUOTA_BYTES."""
    used = Attachment.objects.owned_by(owner).stored_bytes()
    if adding and used + adding > settings.ATTACHMENT_QUOTA_BYTES:
        raise ChatError(
            "quota_exceeded",
            _(
                "Your attachments would take %(size)s, over your storage quota of %(quota)s; "
                "delete conversations with attachments to make room."
            )
            % {"size": human_size(used + adding), "quota": human_size(settings.ATTACHMENT_QUOTA_BYTES)},
        )


def copy_within_quota(owner, message, attachments: list[Attachment]) -> None:
    """An edited message's copies of its sibling's attachments, counted in the owner's quota like uploads."""
    if attachments:
        check_quota(owner, sum(a.stored_bytes for a in attachments))
        Attachment.objects.copy_to(message, attachments)


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
    tokens = estimate_tokens(len(text)) + sum(a.tokens for a in attachments)
    if tokens > settings.ATTACHMENT_MAX_MESSAGE_TOKENS:
        raise ChatError(
            "too_many_tokens",
            _(
                "The message with its attachments comes to about %(tokens)s tokens, over the limit of "
                "%(limit)s per message; attach less, or a shorter document."
            )
            % {"tokens": f"{tokens:,}", "limit": f"{settings.ATTACHMENT_MAX_MESSAGE_TOKENS:,}"},
        )
