"""What the model modules share: the error a request fails with, cutting upstream strings to their
columns, and the status of a stream."""

from __future__ import annotations

import logging

from django.db import models

log = logging.getLogger(__name__)


# The model columns (conversation, message, usage, price): a model id, or provider/model-id.
MODEL_MAX_LENGTH = 300


class ChatError(Exception):
    """A request that cannot start; `code` goes to the client as is."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def fit(model: type[models.Model], field: str, value: str | None) -> str:
    """An upstream-derived string cut to its column (PostgreSQL refuses longer ones)."""
    limit = model._meta.get_field(field).max_length
    value = value or ""
    return value[:limit] if limit is not None else value


class Status(models.TextChoices):
    """How a stream ended (or that it still streams), on messages and usage rows alike."""

    STREAMING = "streaming"
    COMPLETE = "complete"
    STOPPED = "stopped", "stopped by the user"
    INTERRUPTED = "interrupted", "interrupted (connection ended early)"
    FAILED = "failed", "failed (upstream error)"
    # Only on usage rows: a stream refused before anything went upstream (over budget).
    REFUSED = "refused", "refused (over budget)"
