"""Read-only links to a conversation: a random, revocable token; a snapshot copied at share time, or live."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ShareQuerySet(models.QuerySet):
    def owned_by(self, user):
        return self.filter(owner=user)

    def open_links(self):
        """The links that open at all: a deactivated person's are taken down with their account."""
        return self.filter(owner__is_active=True)

    def visible_to(self, user):
        """The share a visitor may open: any signed-in teammate; anyone when public and public links are on."""
        if user.is_authenticated and user.is_active:
            return self.open_links()
        if settings.CHAT_PUBLIC_SHARES:
            return self.open_links().filter(public=True)
        return self.none()


class Share(models.Model):
    """One link to a conversation; revoking deletes it (and its copy), so the link is a 404 from then on."""

    conversation = models.ForeignKey("chat.Conversation", on_delete=models.CASCADE, related_name="shares")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="shares")
    token = models.CharField(max_length=64, unique=True, editable=False)
    live = models.BooleanField(default=False, help_text="Shows the conversation as it is now, not as it was shared.")
    public = models.BooleanField(default=False, help_text="Anyone with the link (when CHAT_PUBLIC_SHARES is on).")
    show_usage = models.BooleanField(default=False, help_text="Shows tokens and cost per answer.")
    show_name = models.BooleanField(default=False, help_text="Shows the owner's name (else no one is named).")
    # The branch shown when shared (chat/actions/shares.py), for a snapshot; None for a live share.
    snapshot = models.JSONField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    objects = ShareQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"share of {self.conversation} ({'live' if self.live else 'snapshot'})"

    def shown_name(self) -> str:
        """Who shared it, as the page says: the owner's full name (else username) if they chose, else nothing."""
        if not self.show_name:
            return ""
        return self.owner.get_full_name().strip() or self.owner.get_username()

    def as_json(self) -> dict:
        return {
            "id": self.pk,
            "conversation": self.conversation_id,
            "url": f"/s/{self.token}/",
            "live": self.live,
            "public": self.public,
            "show_usage": self.show_usage,
            "show_name": self.show_name,
            "created": self.created.isoformat(),
        }
