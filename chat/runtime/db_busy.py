"""When the database cannot be had (SQLite's write lock held, PostgreSQL down): wait briefly, then say so.

PostgreSQL busy in a burst (no connection free, a lock not had in time) is not down: a start waits
for it (waiting_while_busy, bounded by DATABASE_BUSY_WAIT_SECONDS) instead of answering 503.

One place maps those errors to answers: a 503 with `Retry-After` (in OpenAI's shape
under /v1/, the page API's under /api/, a sentence elsewhere), and `server_busy` frames
on the websocket (chat/ws/consumer.py).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from contextlib import contextmanager

import orjson
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.http import HttpResponse
from django.utils.deprecation import MiddlewareMixin
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from chat.lib.openai_errors import error_body
from chat.runtime import metrics

log = logging.getLogger(__name__)

# "database is locked", connection refused or dropped: worth a retry later, unlike a bad query.
UNAVAILABLE = (OperationalError, InterfaceError)
MESSAGE = gettext_noop(
    "The server is busy (its database is not answering); nothing was changed. Try again in a few seconds."
)


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, UNAVAILABLE)


# PostgreSQL answering that it is busy, not down: no connection left (too_many_connections, or the
# pool's wait ran out), a lock not had in time (lock_not_available), a deadlock or serialization failure
# (the transaction rolled back, a new one may pass).
BUSY_STATES = {"53300", "55P03", "40P01", "40001"}
BUSY_WORDS = ("too many clients", "too many connections", "couldn't get a connection")


def is_busy(exc: BaseException) -> bool:
    """Whether a database error is PostgreSQL saying it is busy (worth waiting for), not that it cannot be reached."""
    if not isinstance(exc, UNAVAILABLE) or connection.vendor != "postgresql":
        return False
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) in BUSY_STATES or type(cause).__name__ == "PoolTimeout":
        return True
    text = str(cause).lower()
    return any(words in text for words in BUSY_WORDS)


def waiting_while_busy(function, *args, **kwargs):
    """`function(*args, **kwargs)`, called again while PostgreSQL is busy, for DATABASE_BUSY_WAIT_SECONDS at most.

    A burst of starts may find every connection taken or a lock held past its timeout: that is
    a database at work, and the start waits its turn (the wait measured: chat_db_busy_wait_seconds)
    rather than being refused as if the database were down. A database that does not answer
    (refused, dropped, no such host) fails at once, as before.
    """
    began, pause, tries = time.monotonic(), 0.02, 0
    while True:
        try:
            result = function(*args, **kwargs)
        except UNAVAILABLE as exc:
            busy, waited = is_busy(exc), time.monotonic() - began
            if not busy or waited + pause > settings.DATABASE_BUSY_WAIT_SECONDS:
                if busy:
                    log.warning("database still busy after %.1f s, giving up: %s", waited, exc)
                    metrics.db_busy_wait_seconds.labels("gave_up").observe(waited)
                raise
            log.info("database busy, trying again in %.2f s: %s", pause, exc)
            if connection.connection is not None and not connection.is_usable():
                connection.close()
            time.sleep(pause * (0.5 + random.random()))  # jittered: the starts of a burst do not retry in step
            pause, tries = min(pause * 2, 1.0), tries + 1
            continue
        if tries:
            metrics.db_busy_wait_seconds.labels("went_on").observe(time.monotonic() - began)
        return result


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


# SQLite's busy handler, which a request waiting for the write lock runs, tries again every 100 ms at most.
LOCK_POLL = 0.1


def pause_after(took: float) -> float:
    """How long a bulk write (chat/actions/imports.py, deletes.py) waits after a batch that took `took`: as long
    again, and long enough for a request polling for SQLite's write lock to find it free."""
    return max(took, LOCK_POLL)


# When a brief wait last gave up (time.monotonic()).
_gave_up_at = float("-inf")


def waiting_briefly(function, seconds: float | None = None):
    """`function` run under short_wait (API_DB_WAIT_SECONDS unless given).

    Starts queue for a database thread (chat/runtime/db_threads.py), so a lock held elsewhere would make each
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
                return waiting_while_busy(function, *args, **kwargs)
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
        metrics.db_unavailable.labels("http").inc()
        return busy_response(request.path)
