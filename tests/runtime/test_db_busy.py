"""A busy PostgreSQL is waited for, one that does not answer is not (chat/runtime/db_busy.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import OperationalError

from chat.runtime import db_busy
from tests.services import PG_ADMIN, postgres_database, unique_name

ROOT = Path(__file__).resolve().parent.parent.parent


def samples(outcome: str) -> float:
    from chat.runtime import metrics

    return metrics.REGISTRY.get_sample_value("chat_db_busy_wait_seconds_count", {"outcome": outcome}) or 0


def check_a_start_waits_while_every_connection_is_taken() -> None:
    """Run with DATABASE_URL naming a role allowed one connection, which this holds at first."""
    from django.db import connection

    held = psycopg.connect(os.environ["DATABASE_URL"])
    attempts = []

    def start() -> int:
        attempts.append(1)
        if len(attempts) == 2:
            held.close()  # the burst's other start ends: its connection is free
        with connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            return cursor.fetchone()[0]

    assert db_busy.waiting_briefly(start)() == 42  # no 503: it waited for the connection
    # At least once more after the first: PostgreSQL may count the closed connection a moment longer.
    assert len(attempts) >= 2
    assert samples("went_on") == 1 and samples("gave_up") == 0

    # A database that does not answer: refused at once, not waited for.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    connection.close()
    connection.settings_dict["PORT"] = port
    attempts.clear()
    try:
        db_busy.waiting_briefly(start)()
    except OperationalError as exc:
        assert not db_busy.is_busy(exc)
    else:
        raise AssertionError("a database that does not answer was reached")
    assert len(attempts) == 1 and samples("went_on") == 1 and samples("gave_up") == 0


@pytest.mark.cluster
def test_a_start_waits_for_a_busy_postgresql_and_not_for_one_that_is_down():
    role = unique_name("chat_busy")
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")  # superusers are not held to a limit
    try:
        with postgres_database("chat_busy") as database_url:
            url = database_url.replace("postgres@", f"{role}@", 1)
            env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
            module = "tests.runtime.test_db_busy"
            check = "check_a_start_waits_while_every_connection_is_taken"
            code = f"import django; django.setup(); from {module} import {check}; {check}()"
            checked = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
            assert checked.returncode == 0, checked.stderr
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")
