"""chat/process.py: the loops a serving process runs beside its streams (here: SQLite's WAL checkpoints)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.contrib.auth.models import User
from django.db import OperationalError, connection

from chat import process

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_checkpoint_copies_the_whole_log_into_the_database_file():
    User.objects.create_user("wal")  # a commit: frames in the log, short of the commits' own threshold
    busy, frames, copied = process.checkpoint_wal()
    assert busy == 0 and frames > 0 and copied == frames
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone() == (10000,)  # so a stream's commit does not do it first


async def test_the_checkpoint_loop_logs_a_failure_and_goes_on(monkeypatch, caplog):
    loop = asyncio.get_running_loop()
    third = loop.create_future()
    calls = []

    def checkpoint():
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("disk I/O error")
        if len(calls) == 3:  # the second one's success is logged before this one is made
            loop.call_soon_threadsafe(third.set_result, None)
        return (0, 0, 0)

    monkeypatch.setattr(process, "checkpoint_wal", checkpoint)
    caplog.set_level(logging.WARNING, "chat.process")
    task = asyncio.create_task(process._checkpoint_wal_forever(interval=0.01))
    try:
        await asyncio.wait_for(third, 10)
    finally:
        task.cancel()
    assert "cannot checkpoint SQLite's write-ahead log (disk I/O error); retrying" in caplog.text
    assert "checkpointed again after 1 failure(s)" in caplog.text


async def test_a_serving_process_on_sqlite_runs_the_loop():
    started = await process.ensure_started()
    assert "wal-checkpoints" in {task.get_name() for task in started.tasks if not task.done()}
