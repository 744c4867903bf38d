"""When the database cannot be had (SQLite's write lock held, PostgreSQL down): wait briefly, then say so.

One place maps those errors to answers: a 503 with `Retry-After` (in OpenAI's shape
under /v1/, the page API's under /api/, a sentence elsewhere), and `server_busy` frames
on the websocket (chat/consumers.py).
"""

from __future__ import annotations

import functools
import logging
import time
from contextlib import contextmanager

import orjson
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.http import HttpResponse
from django.utils.deprecation import MiddlewareMixin
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from .relay import error_body

log = logging.getLogger(__name__)

# "database is locked", connection refused or dropped: worth a retry later, unlike a bad query.
UNAVAILABLE = (OperationalError, InterfaceError)
MESSAGE = gettext_noop(
    "The server is busy (its database is not answering); nothing was changed. Try again in a few seconds."
)


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, UNAVAILABLE)


@contextmanager
def short_wait(seconds: float):
    """Wait at most `seconds` for SQLite's write lock in this block (the busy timeout is 20 s otherwise).

    Inside another short wait the shorter of the two holds, and the outer one's comes back after:
    a stream's start notes its token's use (0.1 s) inside its own wait.
    """
    if connection.vendor != "sqlite":
        yield
        return
    connection.ensure_connection()
    outer = getattr(connection, "short_wait", None)
    if outer is not None:
        seconds = min(seconds, outer)
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    connection.short_wait = seconds
    try:
        yield
    finally:
        connection.short_wait = outer
        timeout = settings.DATABASES["default"].get("OPTIONS", {}).get("timeout", 5) if outer is None else outer
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        except DatabaseError:
            connection.short_wait = None
            connection.close()  # a fresh connection gets the configured timeout back


# When a brief wait last gave up (time.monotonic()).
_gave_up_at = float("-inf")


def waiting_briefly(function, seconds: float | None = None):
    """`function` run under short_wait (API_DB_WAIT_SECONDS unless given).

    Starts queue for a database thread (chat/db.py), so a lock held elsewhere would make each
    wait its turn and then its own seconds: one that was already queued when another gave up
    gives up at once, as if they had waited side by side.
    """
    queued = time.monotonic()

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        global _gave_up_at
        if _gave_up_at > queued:
            raise OperationalError("database is locked (a start queued beside this one waited for it in vain)")
        try:
            with short_wait(settings.API_DB_WAIT_SECONDS if seconds is None else seconds):
                return function(*args, **kwargs)
        except UNAVAILABLE:
            _gave_up_at = time.monotonic()
            raise

    return wrapper


def busy_response(path: str) -> HttpResponse:
    """A 503 with Retry-After: OpenAI's error shape under /v1/, the page API's under /api/, else a sentence."""
    if path.startswith("/v1/"):
        response = HttpResponse(
            error_body(_(MESSAGE), "server_error", "database_unavailable"),
            status=503,
            content_type="application/json",
        )
    elif path.startswith("/api/"):
        body = orjson.dumps({"error": {"code": "server_busy", "detail": _(MESSAGE)}})
        response = HttpResponse(body, status=503, content_type="application/json")
    else:
        response = HttpResponse(_(MESSAGE), status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(settings.API_RETRY_AFTER_SECONDS)
    return response


class DatabaseBusyMiddleware(MiddlewareMixin):
    """Turns a database that cannot be had into a 503 with Retry-After instead of an HTML 500."""

    def process_exception(self, request, exc):
        if not is_unavailable(exc):
            return None
        log.warning("database unavailable for %s %s: %s", request.method, request.path, exc)
        return busy_response(request.path)
