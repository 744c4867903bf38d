"""Workers: one lease per serving process; a stream whose worker's lease expired belongs to a dead process."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from django.db import models
from django.utils import timezone

log = logging.getLogger(__name__)


# --- workers: one lease per serving process ----------------------------------

INTERRUPTED_ERROR = "The server stopped while this answer was streaming."

# The id of this process's Worker row once it is registered (process.ensure_started).
_current_worker: int | None = None


class WorkerQuerySet(models.QuerySet):
    def dead(self, lease: timedelta):
        """Workers whose lease has not been renewed for `lease`: their process is gone."""
        return self.filter(heartbeat__lt=timezone.now() - lease)

    def alive(self, lease: timedelta):
        """Workers whose lease is current: their process serves."""
        return self.filter(heartbeat__gte=timezone.now() - lease)


class Worker(models.Model):
    """A serving process. It renews its heartbeat every few seconds; an expired one is dead.

    Streams record their worker, so any process can address the owner's control
    channel, and the sweep ends only the streams whose owner is dead.
    """

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    channel = models.CharField(max_length=255, help_text="Its control channel on the channel layer.")
    started = models.DateTimeField(default=timezone.now)
    heartbeat = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WorkerQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    @classmethod
    def register(cls, channel: str) -> Worker:
        """This process's lease row; also remembered as current_id()."""
        global _current_worker
        worker = cls.objects.create(host=socket.gethostname()[:255], pid=os.getpid(), channel=channel)
        _current_worker = worker.pk
        return worker

    @staticmethod
    def current_id() -> int | None:
        """This process's worker id (None before it is registered): stamp it on every streaming row."""
        return _current_worker

    @classmethod
    def renew(cls, pk: int, channel: str) -> bool:
        """Extend the lease; if its row has vanished, write it again (False then)."""
        if cls.objects.filter(pk=pk).update(heartbeat=timezone.now()):
            return True
        cls.objects.create(pk=pk, host=socket.gethostname()[:255], pid=os.getpid(), channel=channel)
        return False

    def is_alive(self, lease: timedelta) -> bool:
        return self.heartbeat >= timezone.now() - lease


def streaming_worker() -> models.ForeignKey:
    """The field a streaming row (message, usage) records its process in.

    No database constraint: a lease row that vanished (a flushed table, a hand cleanup) must
    not stop a stream from being stored; such a stream simply has no live owner.
    """
    return models.ForeignKey(
        Worker,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_constraint=False,
        help_text="The process streaming it.",
    )
