"""chat/runtime/process_loops.py: the loops a serving process runs beside its streams: WAL checkpoints, memory trims."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from django.db import OperationalError

from chat.runtime import process_loops
from chat.runtime.failures import every

pytestmark = pytest.mark.django_db(transaction=True)


# In a process of its own, on a database file of its own: in this worker, the loops a server or an
# earlier test started checkpoint the shared test database too, and one checkpoint in progress makes
# another report itself busy.
CHECKPOINT_SCRIPT = textwrap.dedent(
    """
    import django, os
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    django.setup()
    from django.db import connection
    from chat.runtime import process_loops

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE rows (text)")  # a commit: frames in the log, short of the commits' own threshold
        cursor.execute("INSERT INTO rows VALUES ('wal')")
        cursor.execute("PRAGMA wal_autocheckpoint")
        print(*cursor.fetchone(), *process_loops.checkpoint_wal())
    """
)


def test_a_checkpoint_copies_the_whole_log_into_the_database_file(tmp_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'wal.sqlite3'}"}
    out = subprocess.run([sys.executable, "-c", CHECKPOINT_SCRIPT], capture_output=True, text=True, env=env, check=True)
    autocheckpoint, busy, frames, copied = map(int, out.stdout.split())
    assert autocheckpoint == 10000  # so a stream's commit does not do it first
    assert busy == 0 and frames > 0 and copied == frames


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

    monkeypatch.setattr(process_loops, "checkpoint_wal", checkpoint)
    caplog.set_level(logging.WARNING, "chat.runtime.process_loops")
    task = asyncio.create_task(process_loops._checkpoint_wal_forever(interval=0.01))
    try:
        await asyncio.wait_for(third, 10)
    finally:
        task.cancel()
    assert "cannot checkpoint SQLite's write-ahead log (disk I/O error); retrying" in caplog.text
    assert "checkpointed again after 1 failure(s)" in caplog.text


async def step_that_loses_a_cancellation(started: asyncio.Event) -> None:
    """A step whose library returns normally when cancelled, as asyncio.wait_for can on Python 3.11."""
    started.set()
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        return


async def test_a_loop_whose_step_loses_the_cancellation_still_ends():
    started = asyncio.Event()
    task = asyncio.create_task(every(lambda _: 0, lambda: step_that_loses_a_cancellation(started), "x", "y"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


async def test_a_serving_process_on_sqlite_runs_the_loops():
    started = await process_loops.ensure_started()
    assert {"wal-checkpoints", "memory-trim"} <= {task.get_name() for task in started.tasks if not task.done()}


# Run in a process of its own, whose RSS nothing else moves: 40 MB of 2 KB blocks (glibc's heap,
# not Python's small-object arenas), every fiftieth kept so that the rest are free pieces between
# blocks in use, which free() does not give back.
TRIM_SCRIPT = textwrap.dedent(
    """
    import django, os
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    django.setup()
    from chat.runtime import process_loops

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = [bytes(2000) for _ in range(20000)]
    kept = blocks[::50]
    del blocks
    before = rss()
    process_loops.malloc_trim()(0)
    print(before - rss())
    """
)


@pytest.mark.skipif(process_loops.malloc_trim() is None, reason="a C library without malloc_trim (not glibc)")
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
    caplog.set_level(logging.WARNING, "chat.runtime.process_loops")
    task = asyncio.create_task(process_loops._trim_memory_forever(trim))
    try:
        await asyncio.wait_for(third, 10)
    finally:
        task.cancel()
    assert calls == [0, 0, 0]
    assert "cannot give free memory back to the system (no memory); retrying" in caplog.text
    assert "free memory given back again after 1 failure(s)" in caplog.text
