"""Responses of /v1/responses kept for a follow-up: `previous_response_id` brings back their input and output."""

from __future__ import annotations

import orjson
from django.conf import settings
from django.db import models


class BrokenChain(Exception):
    """A response's conversation cannot be brought back: an earlier response of it is gone, or it is too large."""


class StoredResponseQuerySet(models.QuerySet):
    def owned_by(self, user):
        """A person's responses only: another person's id is as unknown as a made-up one."""
        return self.filter(owner=user)

    def conversation(self, response_id: str, max_bytes: int) -> list[dict] | None:
        """Every item of a response's conversation, oldest first: each response's own input, then its output, back
        along `previous` (None: no such response of these). Raises BrokenChain past `max_bytes` of items, or when an
        earlier response is gone (deleted, or past retention)."""
        links, size, wanted = [], 0, response_id
        while wanted:
            row = self.filter(pk=wanted).values("input", "output", "previous").first()
            if row is None:
                if not links:
                    return None
                raise BrokenChain(f"An earlier response of this conversation, {wanted}, has been deleted.")
            size += len(orjson.dumps(row["input"])) + len(orjson.dumps(row["output"]))
            if size > max_bytes:
                raise BrokenChain(f"This conversation is over {max_bytes} bytes: start a new one with what matters.")
            links.append(row["input"] + row["output"])
            wanted = row["previous"]
        return [item for link in reversed(links) for item in link]


class StoredResponse(models.Model):
    """One response (`resp_<hex>`): its own input items, its output items and the response it followed.

    Items are kept in the Responses API's shape. A follow-up's input is its conversation (conversation():
    each earlier response's input and output, back along `previous`), then its own items: each turn is
    stored once, not again in every later one. (A row from before `previous` holds its whole history as input.)
    """

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_responses")
    model = models.CharField(max_length=300)
    status = models.CharField(max_length=20)
    input = models.JSONField(default=list)
    output = models.JSONField(default=list)
    previous = models.CharField(max_length=40, blank=True, help_text="The response this one followed, if any.")
    created = models.DateTimeField(auto_now_add=True)

    objects = StoredResponseQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.id
