"""Cheap websocket connects: refuse early when overloaded, and a short-lived cache of session -> user.

A reconnect storm (every tab of a team reconnecting at once after a restart or a
network blip) would queue one session read and one user read per connect on
the single thread Channels runs database calls on, behind any slow write, and
stall the whole process. So a connect beyond the configured rate, or beyond
the handshakes already in flight, is accepted and closed at once with code 4013
("try again later") before any database work, and the page backs off with
jitter; the session -> user read that remains is cached for a few seconds,
made once for all the connects of a session that miss the cache together, and
runs off that shared thread so a held SQLite write lock cannot delay it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from channels.auth import AuthMiddleware
from channels.db import database_sync_to_async
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.signals import user_logged_out

from chat.compat.channels import get_user_sync, set_scope_user
from chat.lib import single_flight
from chat.runtime import db_busy, metrics
from chat.runtime.failures import FailureStreak

log = logging.getLogger(__name__)

# RFC 6455's "Try Again Later" is 1013, but daphne (autobahn) lets an application close only
# with 1000 or 3000-4999, so the same meaning in the private range; the page backs off harder.
TRY_AGAIN_LATER = 4013
# The socket's session could not be read: the database is unavailable. The page says so and backs off
# (docs/websocket.md); the server logs one line when such refusals begin and one when they end.
DATABASE_UNAVAILABLE = 4503
DATABASE_DOWN = "chat.database_down"


class ConnectGuard:
    """ASGI middleware for websockets: at most `rate` connects a second and `in_flight` unfinished handshakes."""

    def __init__(self, app, rate: float | None = None, in_flight: int | None = None) -> None:
        self.app = app
        self.rate = float(rate if rate is not None else settings.WS_CONNECTS_PER_SECOND)
        self.max_in_flight = int(in_flight if in_flight is not None else settings.WS_MAX_CONNECTING)
        # A token bucket: `rate` tokens a second, bursts up to one second's worth.
        self.tokens = self.rate
        self.refilled = time.monotonic()
        self.in_flight = 0
        self.refused = 0
        self.reported = 0.0

    def admit(self) -> bool:
        """Whether one more connect may go on now (takes a token if so)."""
        if self.rate <= 0:
            return True
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.refilled) * self.rate)
        self.refilled = now
        if self.tokens < 1 or (self.max_in_flight > 0 and self.in_flight >= self.max_in_flight):
            return False
        self.tokens -= 1
        return True

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        if not self.admit():
            return await self.refuse(receive, send)
        self.in_flight += 1
        handshaking = True

        async def guarded_send(message):
            nonlocal handshaking
            if handshaking and message["type"] in ("websocket.accept", "websocket.close"):
                handshaking = False
                self.in_flight -= 1
            await send(message)

        try:
            return await self.app(scope, receive, guarded_send)
        finally:
            if handshaking:
                self.in_flight -= 1

    async def refuse(self, receive, send) -> None:
        # Accepted then closed, because a close before the accept reaches the browser as a
        # bare HTTP 403 (code 1006), which it cannot tell from a refused Origin.
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER})
        metrics.websocket_refusals.labels("overload").inc()
        self.refused += 1
        now = time.monotonic()
        # One line a few seconds at most: a storm must not turn into a storm of log lines.
        if now - self.reported >= 5:
            log.warning(
                "overloaded: refused %d websocket connects with 4013 (limits: %g a second, %d handshaking)",
                self.refused, self.rate, self.max_in_flight,
            )  # fmt: skip
            self.refused = 0
            self.reported = now


class UserCache:
    """session key -> user, kept `ttl` seconds, at most `size` entries (oldest dropped first)."""

    def __init__(self, ttl: float, size: int = 10_000) -> None:
        self.ttl = ttl
        self.size = size
        self.entries: OrderedDict[str, tuple[float, object]] = OrderedDict()

    def get(self, key: str):
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            del self.entries[key]
            return None
        return entry[1]

    def put(self, key: str, user) -> None:
        if self.ttl <= 0:
            return
        self.entries[key] = (time.monotonic() + self.ttl, user)
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()


users = UserCache(ttl=settings.WS_SESSION_CACHE_SECONDS)


def forget_session(sender, request, user, **kwargs) -> None:
    """A session signed out here is not let in again from the cache."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        users.entries.pop(key, None)


user_logged_out.connect(forget_session, dispatch_uid="chat.ws.overload.forget_session")

# Off the thread Channels shares between every database call of the process, where a
# write waiting for SQLite's lock (up to its busy timeout) would hold every connect up.
_load_user = database_sync_to_async(get_user_sync, thread_sensitive=False)


class CachedAuthMiddleware(AuthMiddleware):
    """Channels' AuthMiddleware, with the session -> user read cached for WS_SESSION_CACHE_SECONDS."""

    async def resolve_scope(self, scope) -> None:
        key = scope["session"].session_key
        user = users.get(key) if key else None
        if user is None:
            try:
                user = await _user_of(scope, key) if key else await _load_user(scope)
            except db_busy.UNAVAILABLE as exc:
                # An expected outage: no traceback, no HTTP 500; the consumer refuses with 4503.
                refusals.failed(exc)
                metrics.websocket_refusals.labels("database").inc()
                scope[DATABASE_DOWN] = True
                user = AnonymousUser()
            else:
                refusals.over()
        set_scope_user(scope, user)


refusals = FailureStreak(
    "websocket connects refused with 4503: the database is unavailable", "websocket connects read the database again"
)


async def _user_of(scope, key: str):
    # When the cached entry of a session with many sockets expires (a person's tabs, a script's
    # connections), they all miss it at once: one read serves them, instead of one each.
    async def read():
        user = await _load_user(scope)
        users.put(key, user)
        return user

    return await single_flight.shared(("session user", key), read)


def CachedAuthMiddlewareStack(inner):
    """Cookies, the session and the (cached) user, like Channels' AuthMiddlewareStack."""
    return CookieMiddleware(SessionMiddleware(CachedAuthMiddleware(inner)))
