"""chatsite/sqlite3: Django's SQLite backend, its statements' placeholders rewritten once per process."""

from __future__ import annotations

import pytest
from django.db import connection

from chatsite.sqlite3.base import qmark

pytestmark = pytest.mark.django_db


def test_the_default_database_uses_it():
    assert connection.settings_dict["ENGINE"] == "chatsite.sqlite3" and connection.vendor == "sqlite"


def test_temporary_storage_is_in_memory():
    # A stream's final save, with its rollup triggers, needs a statement journal larger than
    # SQLite keeps in memory by default: without this it is a new file on disk every time.
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA temp_store")
        assert cursor.fetchone() == (2,)  # MEMORY


def test_a_statement_gives_the_same_answer_each_time_and_is_rewritten_once():
    qmark.cache_clear()
    sql = "SELECT %s, '100%%', %s || '%%s'"
    for n in range(3):
        with connection.cursor() as cursor:
            cursor.execute(sql, [n, "x"])
            assert cursor.fetchone() == (n, "100%", "x%s")  # `%%` is a literal %, as in Django's own backend
    info = qmark.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_named_parameters_are_left_to_djangos_rewriting():
    with connection.cursor() as cursor:
        cursor.execute("SELECT %(a)s + %(b)s", {"a": 1, "b": 2})
        assert cursor.fetchone() == (3,)
