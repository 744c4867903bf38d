"""chat/runtime/db_threads.py: the threads keep their connections, drop broken ones, and queue starts in order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import openai
import psycopg
import pytest
from django.db import OperationalError, connection, connections
from django.db.backends.signals import connection_created

from chat.runtime import db_busy, db_threads
from tests.conftest import FAKE_KEY, MODELS
from tests.live import LiveServer, wait_until
from tests.services import PG_ADMIN, postgres_database
from tests.sites import make_site

pytestmark = pytest.mark.django_db(transaction=True)


def connection_id() -> int:
    connection.ensure_connection()
    return id(connection.connection)


@pytest.fixture
def opened():
    """The connections opened from now on (Django's connection_created signal), counted."""
    count = []

    def note(sender, **kwargs) -> None:
        count.append(1)

    connection_created.connect(note)
    yield count
    connection_created.disconnect(note)


async def test_calls_reuse_the_threads_connection(opened):
    await db_threads.run(connection_id)()
    before = len(opened)
    await db_threads.run(connection_id)()
    assert len(opened) == before  # not a new connection per call, as Channels' wrapper does
    db_threads.close_all()
    await db_threads.run(connection_id)()
    assert len(opened) == before + 1  # close_all() closed it


async def test_a_connection_that_broke_is_replaced_by_the_next_call(monkeypatch, opened):
    await db_threads.run(connection_id)()
    before = len(opened)

    def failing() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    with pytest.raises(OperationalError):
        await db_threads.run(failing)()
    await db_threads.run(connection_id)()
    assert len(opened) == before  # an error on a usable connection keeps it
    monkeypatch.setattr(type(connections["default"]), "is_usable", lambda self: False)
    with pytest.raises(OperationalError):
        await db_threads.run(failing)()
    monkeypatch.undo()
    await db_threads.run(connection_id)()
    assert len(opened) == before + 1  # a broken one is closed, the next call reconnects


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

    await asyncio.gather(*(db_threads.run(work)() for _ in range(20)))
    assert most == 1 and len(threads) == 1


async def test_a_call_whose_caller_stopped_waiting_before_it_began_is_not_run():
    """A start cancelled in the queue (its client left) must not write its rows after all."""
    release, ran = threading.Event(), []

    def block() -> None:
        release.wait(10)

    blocked = asyncio.ensure_future(db_threads.run(block)())
    queued = asyncio.ensure_future(db_threads.run(ran.append)("queued"))
    await asyncio.sleep(0)  # both handed to the (one) database thread's queue
    queued.cancel()
    release.set()
    await blocked
    assert await db_threads.run(ran.append)("after") is None  # the thread went on past the cancelled call
    assert ran == ["after"] and queued.cancelled()


async def test_starts_queued_beside_one_that_found_the_database_locked_give_up_with_it(settings):
    settings.API_DB_WAIT_SECONDS = 0.5
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program holds the write lock
    waits: list[int] = []  # SQLite's busy timeout (ms) each write that ran waited with

    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout")
            waits.append(cursor.fetchone()[0])
            cursor.execute("BEGIN IMMEDIATE")

    try:
        # Both queued before either runs: the second does not wait its own 0.5 s after the first's.
        calls = [db_threads.run(db_busy.waiting_briefly(write))() for _ in range(2)]
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert all(isinstance(result, OperationalError) for result in results), results
    assert waits == [500]  # the first waited its short wait for the lock; the second gave up before trying
    assert "in vain" in str(results[1])
    # A start queued after the lock is free goes through.
    await db_threads.run(db_busy.waiting_briefly(connection_id))()


def test_forty_api_streams_on_postgresql_hold_a_few_connections_not_forty(fake_server):
    """Before, each /v1 request's thread held a connection for its whole stream: 400 streams on two
    processes ran PostgreSQL out of them. Now a process holds its DATABASE_THREADS (4) and a few more."""
    with postgres_database("chat_db_threads", migrated=True) as url:
        site = make_site("", fake_server.base_url("infyrence"), FAKE_KEY, database_url=url)
        name = url.rsplit("/", 1)[1]
        unlimited = {"API_MAX_STREAMS": "0", "API_TOKEN_MAX_STREAMS": "0", "RATE_LIMIT_PER_MINUTE": "0",
                     "API_TOKEN_RATE_LIMIT_PER_MINUTE": "0"}  # fmt: skip
        # autocommit: pg_stat_activity is read once per transaction, and each count must be fresh
        admin = psycopg.connect(PG_ADMIN, autocommit=True)
        with LiveServer({"DATABASE_URL": url, **unlimited}) as live, admin:
            api = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key=site.secret, max_retries=0)

            async def one() -> str:
                stream = await api.chat.completions.create(
                    model=MODELS["infyrence"], stream=True,
                    messages=[{"role": "user", "content": "hi [[chunks:25]] [[delay:40]]"}],
                )  # fmt: skip
                return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

            async def run() -> tuple[list[str], int]:
                streams, most = asyncio.gather(*(one() for _ in range(40))), 0
                while not streams.done():
                    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,))
                    most = max(most, row.fetchone()[0])
                    await asyncio.wait([streams], timeout=0.02)
                return await streams, most

            answers, most = asyncio.run(run())
    assert len(answers) == 40 and all(answers)
    # 4 database threads, plus the lease, sweep and account-check calls and the websocket's ORM thread.
    assert 1 <= most <= 8, most


def test_the_first_request_after_postgresql_dropped_every_connection_is_served(fake_server):
    """A restart of PostgreSQL (or a proxy's) closes the database threads' idle connections: the next
    call sees the closed socket and reconnects, where it used to fail once with a 503 per thread."""
    with postgres_database("chat_db_dropped", migrated=True) as url:
        site = make_site("", fake_server.base_url("infyrence"), FAKE_KEY, database_url=url)
        name = url.rsplit("/", 1)[1]
        admin = psycopg.connect(PG_ADMIN, autocommit=True)
        with LiveServer({"DATABASE_URL": url}) as live, admin:
            api = openai.OpenAI(base_url=live.url + "/v1", api_key=site.secret, max_retries=0)

            def ask() -> str:
                messages = [{"role": "user", "content": "hi"}]
                return api.chat.completions.create(model=MODELS["infyrence"], messages=messages).id

            for _ in range(4):  # each of the 4 database threads has opened its connection
                ask()
            dropped = admin.execute(
                "SELECT array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s",
                (name,),
            ).fetchone()[0]
            assert dropped
            # pg_terminate_backend only signals: the connections are dropped once those backends have exited.
            gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = ANY(%s)"
            assert wait_until(lambda: admin.execute(gone, (dropped,)).fetchone()[0])
            assert all(ask() for _ in range(4))  # no 503 from a thread whose connection was dropped
