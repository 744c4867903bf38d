"""chat/process.py: the loops a serving process runs beside its streams: WAL checkpoints, memory trims."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap

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


async def test_a_serving_process_on_sqlite_runs_the_loops():
    started = await process.ensure_started()
    assert {"wal-checkpoints", "memory-trim"} <= {task.get_name() for task in started.tasks if not task.done()}


# Run in a process of its own, whose RSS nothing else moves: 40 MB of 2 KB blocks (glibc's heap,
# not Python's small-object arenas), every fiftieth kept so that the rest are free pieces between
# blocks in use, which free() does not give back.
TRIM_SCRIPT = textwrap.dedent(
    """
    import django, os
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    django.setup()
    from chat import process

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = [bytes(2000) for _ in range(20000)]
    kept = blocks[::50]
    del blocks
    before = rss()
    process.malloc_trim()(0)
    print(before - rss())
    """
)


@pytest.mark.skipif(process.malloc_trim() is None, reason="a C library without malloc_trim (not glibc)")
def test_a_trim_gives_free_memory_inside_the_heap_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 20 * 2**20, out.stdout  # most of the 40 MB freed, and only given back by the trim


async def test_the_trim_loop_logs_a_failure_and_goes_on(settings, caplog):
    loop = asyncio.get_running_loop()
    third = loop.create_future()
    calls = []

    def trim(pad):
        calls.append(pad)
        if len(calls) == 1:
            raise OSError("no memory")
        if len(calls) == 3:
            loop.call_soon_threadsafe(third.set_result, None)
        return 1

    settings.MEMORY_TRIM_SECONDS = 0.01
    caplog.set_level(logging.WARNING, "chat.process")
    task = asyncio.create_task(process._trim_memory_forever(trim))
    try:
        await asyncio.wait_for(third, 10)
    finally:
        task.cancel()
    assert calls == [0, 0, 0]
    assert "cannot give free memory back to the system (no memory); retrying" in caplog.text
    assert "free memory given back again after 1 failure(s)" in caplog.text
