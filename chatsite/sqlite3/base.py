"""Django's SQLite backend, with each statement's placeholders rewritten once per process.

Django writes SQL with `%s` placeholders and its SQLite cursor rewrites them to `?` with a
regular expression on every execute, and a stream's start and final save run some twenty
of the same few statements: the rewriting is kept per statement instead.
Settings use this backend for every SQLite database; all else is Django's.
"""

from __future__ import annotations

import functools

from django.db.backends.sqlite3 import base


@functools.lru_cache(maxsize=1024)
def qmark(query: str) -> str:
    """`query` with its `%s` placeholders as SQLite's `?` (and `%%` as `%`), as Django's cursor writes it."""
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class SQLiteCursorWrapper(base.SQLiteCursorWrapper):
    def convert_query(self, query, *, param_names=None):
        if param_names is None:
            return qmark(query)
        return super().convert_query(query, param_names=param_names)


class DatabaseWrapper(base.DatabaseWrapper):
    def create_cursor(self, name=None):
        return self.connection.cursor(factory=SQLiteCursorWrapper)
