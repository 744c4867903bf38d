"""Responses of /v1/responses kept for a follow-up: `previous_response_id` brings back their input and output."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class StoredResponseQuerySet(models.QuerySet):
    def owned_by(self, user):
        """A person's responses only: another person's id is as unknown as a made-up one."""
        return self.filter(owner=user)


class StoredResponse(models.Model):
    """One response (`resp_<hex>`): the input items that led to it (its history included) and its output items.

    Items are kept in the Responses API's shape, so a follow-up's input is this row's `input`,
    then its `output`, then the follow-up's own items.
    """

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_responses")
    model = models.CharField(max_length=300)
    status = models.CharField(max_length=20)
    input = models.JSONField(default=list)
    output = models.JSONField(default=list)
    created = models.DateTimeField(auto_now_add=True)

    objects = StoredResponseQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.id
