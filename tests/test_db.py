"""chat/db.py: the database threads keep their connections, drop broken ones, and queue starts in order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import pytest
from django.db import OperationalError, connection, connections

from chat import busy, db

pytestmark = pytest.mark.django_db(transaction=True)


def connection_id() -> int:
    connection.ensure_connection()
    return id(connection.connection)


async def test_calls_reuse_the_threads_connection():
    first = await db.run(connection_id)()
    assert await db.run(connection_id)() == first  # not a new connection per call, as Channels' wrapper does
    db.close_all()
    assert await db.run(connection_id)() != first  # close_all() closed it


async def test_a_connection_that_broke_is_replaced_by_the_next_call(monkeypatch):
    first = await db.run(connection_id)()

    def failing() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    with pytest.raises(OperationalError):
        await db.run(failing)()
    assert await db.run(connection_id)() == first  # an error on a usable connection keeps it
    monkeypatch.setattr(type(connections["default"]), "is_usable", lambda self: False)
    with pytest.raises(OperationalError):
        await db.run(failing)()
    monkeypatch.undo()
    assert await db.run(connection_id)() != first  # a broken one is closed, the next call reconnects


async def test_a_process_uses_at_most_database_threads_threads(settings):
    assert settings.DATABASE_THREADS == 1  # SQLite's default
    running, most, threads = 0, 0, set()
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            threads.add(threading.get_ident())
        connection_id()
        with lock:
            running -= 1

    await asyncio.gather(*(db.run(work)() for _ in range(20)))
    assert most == 1 and len(threads) == 1


async def test_starts_queued_beside_one_that_found_the_database_locked_give_up_with_it(settings):
    settings.API_DB_WAIT_SECONDS = 0.5
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program holds the write lock
    timings: list[float] = []

    def write() -> None:
        started = time.monotonic()
        try:
            with connection.cursor() as cursor:
                cursor.execute("BEGIN IMMEDIATE")
        finally:
            timings.append(time.monotonic() - started)

    try:
        # Both queued before either runs: the second does not wait its own 0.5 s after the first's.
        calls = [db.run(busy.waiting_briefly(write))() for _ in range(2)]
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert all(isinstance(result, OperationalError) for result in results), results
    assert timings[0] >= 0.4 and len(timings) == 1  # the second gave up before trying
    assert "in vain" in str(results[1])
    # A start queued after the lock is free goes through.
    await db.run(busy.waiting_briefly(connection_id))()
