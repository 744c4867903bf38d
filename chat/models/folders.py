"""Folders: one level of a person's own names to sort conversations under (pin and archive are on Conversation)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

MAX_FOLDER_NAME = 100


class FolderQuerySet(models.QuerySet):
    def owned_by(self, user):
        return self.filter(owner=user)

    def with_counts(self):
        """Each folder with `count`: its conversations that are neither pinned nor archived (those listed in it)."""
        listed = models.Q(conversations__pinned=False, conversations__archived=False)
        return self.annotate(count=models.Count("conversations", filter=listed))


class Folder(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="folders")
    name = models.CharField(max_length=MAX_FOLDER_NAME)
    created = models.DateTimeField(auto_now_add=True)

    objects = FolderQuerySet.as_manager()

    class Meta:
        ordering = ["name", "pk"]

    def __str__(self) -> str:
        return self.name

    def as_json(self) -> dict:
        return {"id": self.pk, "name": self.name, "count": getattr(self, "count", None)}
