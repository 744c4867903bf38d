"""Read-only links to a conversation: a random, revocable token; a snapshot copied at share time, or live."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models

from .base import ChatError


class ShareQuerySet(models.QuerySet):
    def owned_by(self, user):
        return self.filter(owner=user)

    def visible_to(self, user):
        """The share a visitor may open: any signed-in teammate; anyone when public and public links are on."""
        if user.is_authenticated and user.is_active:
            return self
        if settings.CHAT_PUBLIC_SHARES:
            return self.filter(public=True)
        return self.none()


class Share(models.Model):
    """One link to a conversation; revoking deletes it (and its copy), so the link is a 404 from then on."""

    conversation = models.ForeignKey("chat.Conversation", on_delete=models.CASCADE, related_name="shares")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shares")
    token = models.CharField(max_length=64, unique=True, editable=False)
    live = models.BooleanField(default=False, help_text="Shows the conversation as it is now, not as it was shared.")
    public = models.BooleanField(default=False, help_text="Anyone with the link (when CHAT_PUBLIC_SHARES is on).")
    show_usage = models.BooleanField(default=False, help_text="Shows tokens and cost per answer.")
    # The branch shown when shared (chat/exports.py `path_json`), for a snapshot; None for a live share.
    snapshot = models.JSONField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    objects = ShareQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"share of {self.conversation} ({'live' if self.live else 'snapshot'})"

    @classmethod
    def create_for(cls, conversation, *, live: bool, public: bool, show_usage: bool) -> Share:
        """A new link; a snapshot copies the branch shown now. Public only where the setting allows it."""
        from ..exports import path_json

        if public and not settings.CHAT_PUBLIC_SHARES:
            raise ChatError("public_shares_off", "Public links are turned off on this server (CHAT_PUBLIC_SHARES).")
        return cls.objects.create(
            conversation=conversation, owner_id=conversation.owner_id, token=secrets.token_urlsafe(24), live=live,
            public=public, show_usage=show_usage, snapshot=None if live else path_json(conversation),
        )  # fmt: skip

    def content(self) -> dict:
        """What the shared page shows: the snapshot, or the branch shown now; usage left out unless chosen."""
        from ..exports import path_json

        shown = self.snapshot if not self.live and self.snapshot is not None else path_json(self.conversation)
        # The messages, not the owner's instructions to the model: no system prompt, no params.
        shown = {key: value for key, value in shown.items() if key not in ("system_prompt", "params")}
        if not self.show_usage:
            shown = {**shown, "messages": [{**m, "usage": None} for m in shown["messages"]]}
        return shown

    def as_json(self) -> dict:
        return {
            "id": self.pk,
            "conversation": self.conversation_id,
            "url": f"/s/{self.token}/",
            "live": self.live,
            "public": self.public,
            "show_usage": self.show_usage,
            "created": self.created.isoformat(),
        }
