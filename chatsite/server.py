"""daphne, with flow control, request-body limits, a graceful SIGTERM and a non-zero exit on bind failure.

Start it as daphne (same options): `python -m chatsite.server -b 127.0.0.1 -p 8000 chatsite.asgi:application`.

* Flow control. daphne writes every response body and websocket frame into Twisted's
  transport buffer at once, so a client that reads nothing makes the buffer (and the
  process) grow without end. Here an HTTP body `send` waits while the buffer is over
  FLOW_HIGH_WATER: the streaming view stops pulling from its generator, the relay's
  queue fills and the upstream read pauses. A client that takes no byte for
  API_SLOW_CLIENT_SECONDS is disconnected (a slow one that keeps reading is not); the view learns why from the scope's
  `chatsite.flow` extension. A websocket `send` never waits (one slow tab must not slow
  a stream others watch); a socket whose unsent bytes (Twisted's buffer and the kernel's
  send queue) stay over FLOW_HIGH_WATER for CHAT_SLOW_CLIENT_SECONDS, or ever pass
  WEBSOCKET_MAX_BUFFER, is closed with 4008.
* Request bodies. twisted.web buffers a whole request body (in memory, then in a temp
  file) before daphne hands it over. Bodies over Django's DATA_UPLOAD_MAX_MEMORY_SIZE are
  refused with 413 while they arrive: at the Content-Length header, or as soon as a
  chunked body's running size passes the limit. The attachment upload's path may send
  ATTACHMENT_MAX_FILE_BYTES and its multipart framing, and /v1's chat completions and responses
  API_MAX_BODY_BYTES (an image as a data: URL).
* SIGTERM. Stop listening, let streams finish for SHUTDOWN_GRACE_SECONDS, then end the
  rest (text and usage saved as `interrupted`, websocket watchers get `done`, `/v1`
  clients an error event and `[DONE]`), close the sockets, and only then stop the loop.
  No task is left suspended for the garbage collector at exit: under Python 3.11 that
  (a Django request task cancelled by daphne while its disconnect listener still waited
  in `asyncio.Queue.get`) crashed the process with a segmentation fault.
* Bind failure. A listening endpoint that cannot be opened ends the process with exit
  status 1 at once, so a supervisor sees it.
* Garbage collection. What start-up built is frozen out of the collector's full passes
  before the server listens (`freeze_start_up`): they pause every stream while they run.

What this reaches of daphne, Twisted and autobahn is in chat/compat/daphne.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import signal
import sys
import time

from chat.compat.daphne import (
    WEBSOCKET_OPEN,
    BodyLimitedRequest,
    Server,
    accept_waiting,
    awaits_its_request,
    buffered,
    event_loop,
    reactor,
    run_command_line,
    unsent,
)
from chat.lib.client_address import client_address, is_trusted, networks
from chat.runtime import metrics, stopping
from chat.runtime.stopping import RESTART_CLOSE_CODE
from chatsite.logs import request_id

log = logging.getLogger("chatsite.server")
access = logging.getLogger("chatsite.access")

# Bytes waiting in Twisted's send buffer (on top of the kernel's socket buffer) above which
# a client counts as behind (Twisted pauses its own producers at this size too): an HTTP body
# send waits, a websocket's slow-client clock runs.
FLOW_HIGH_WATER = 64 * 1024
# A websocket whose unsent frames pass this is closed at once, whatever its clock says.
WEBSOCKET_MAX_BUFFER = 16 * 1024 * 1024
# The close code of a websocket closed for not reading (docs/websocket.md).
SLOW_CLOSE_CODE = 4008
# How often a waiting send looks at the buffer again; only while a client is behind.
POLL = 0.05
# At shutdown, the longest a connection accepted from the backlog may take to send its request
# (nginx sends it at once; a busy machine may take a while to read it).
ACCEPTED_REQUEST_SECONDS = 5.0
# At shutdown, after the streams were ended: time for their last frames to be written.
SETTLE_SECONDS = 1.0
# ... and the longest an ended /v1 stream may take to unwind before its socket is cut.
UNWIND_SECONDS = 5.0
DESCRIPTION = "The chat server: daphne with flow control and a graceful shutdown"


class Flow:
    """The `chatsite.flow` scope extension of an HTTP request: why the server cut it, if it did."""

    def __init__(self) -> None:
        self.slow_cut = False


# Room for the multipart framing and form fields around an uploaded file.
UPLOAD_FRAMING = 64 * 1024


class LimitedRequest(BodyLimitedRequest):
    """daphne's request, refusing a body over the limit while it arrives instead of buffering it."""

    def refused(self) -> None:
        client = getattr(self.getClientAddress(), "host", "?")
        log.warning("refused a request body over %d bytes from %s", self.max_body, client)


class ChatServer(Server):
    """daphne's Server with flow control, body limits, a graceful shutdown and a bind-failure exit."""

    request_class = LimitedRequest
    flow_high_water = FLOW_HIGH_WATER

    def __init__(self, *args, **kwargs) -> None:
        from django.conf import settings

        from chat.views.probes import PATHS

        super().__init__(*args, listen_backlog=settings.LISTEN_BACKLOG, **kwargs)

        self.unlogged_paths = frozenset(PATHS)  # probes: asked every few seconds, answered without logging
        self.trusted_proxies = networks(settings.TRUSTED_PROXIES)
        self.grace = settings.SHUTDOWN_GRACE_SECONDS
        self.api_slow = settings.API_SLOW_CLIENT_SECONDS
        self.chat_slow = settings.CHAT_SLOW_CLIENT_SECONDS
        LimitedRequest.max_body = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        LimitedRequest.large_bodies = {
            b"/api/attachments": settings.ATTACHMENT_MAX_FILE_BYTES + UPLOAD_FRAMING,
            # Images as data: URLs (chat/lib/model_params.py); read by metered_post(), not Django's request.body.
            b"/v1/chat/completions": settings.API_MAX_BODY_BYTES,
            b"/v1/responses": settings.API_MAX_BODY_BYTES,
        }

    # --- who asked, and the access log -------------------------------------------

    def create_application(self, protocol, scope):
        """The client's real address in the scope (REMOTE_ADDR) and the logs, and the request's id in its context."""
        headers = dict(scope.get("headers") or ())
        peer = (scope.get("client") or ["", 0])[0]
        trusted = is_trusted(peer, self.trusted_proxies)
        if trusted:
            address = client_address(peer, headers.get(b"x-forwarded-for", b"").decode("latin1"), self.trusted_proxies)
            scope = {**scope, "client": [address, 0]}
            protocol.client_addr = [address, 0]
        forwarded_id = headers.get(b"x-request-id", b"").decode("latin1")[:64] if trusted else ""
        token = request_id.set(forwarded_id or secrets.token_hex(6))
        try:
            return super().create_application(protocol, scope)  # its task copies the context now
        finally:
            request_id.reset(token)

    def log_action(self, protocol: str, action: str, details: dict) -> None:
        """daphne's access log (stdout, every probe) replaced: a line per request or socket, through logging."""
        if protocol == "http" and action == "complete":
            if details["path"] in self.unlogged_paths:
                return
            access.info("%s %s %s %s %s", _host(details["client"]), details["method"], details["path"],
                        details["status"], details["size"])  # fmt: skip
        elif protocol == "websocket" and action in ("connected", "rejected", "disconnected"):
            access.info("%s WEBSOCKET %s %s", _host(details["client"]), details["path"], action)

    # --- flow control -----------------------------------------------------------

    def http_scope(self, protocol, scope: dict) -> dict:
        protocol.flow = Flow()
        return {**scope, "extensions": {**scope.get("extensions", {}), "chatsite.flow": protocol.flow}}

    async def wait_for_reader(self, protocol) -> None:
        """Hold the app's send until the client takes its bytes; cut one that takes nothing for API_SLOW_CLIENT_SECONDS.

        Reading is judged, not speed: any bytes the client acknowledged (what is unsent shrank) start
        the clock again. Twisted's own buffer alone moves only when the kernel's send buffer has room
        for much of it, which a client reading slowly but steadily could take longer than the limit to make.
        """
        now = time.monotonic()
        deadline = now + self.api_slow
        left = unsent(protocol.transport)
        while buffered(protocol.transport) > FLOW_HIGH_WATER:
            if protocol.finished or protocol.transport is None:
                return
            now = time.monotonic()
            size = unsent(protocol.transport)
            if size < left:  # the client took something: it reads
                deadline = now + self.api_slow
            left = min(left, size)
            if now > deadline:
                log.warning("closed an HTTP response to %s: the client read nothing for %g s",
                            protocol.client_addr, self.api_slow)  # fmt: skip
                protocol.flow.slow_cut = True
                protocol.transport.abortConnection()
                # The app hears `http.disconnect` and is cancelled here; never send on.
                await asyncio.sleep(UNWIND_SECONDS)
                return
            await asyncio.sleep(POLL)

    def watch_websocket(self, protocol) -> None:
        """Close a websocket whose client has read nothing for CHAT_SLOW_CLIENT_SECONDS."""
        if protocol.state != WEBSOCKET_OPEN:
            return
        size = unsent(protocol.transport)
        if size <= FLOW_HIGH_WATER:
            protocol.behind_since = None
            return
        now = time.monotonic()
        if getattr(protocol, "behind_since", None) is None:
            protocol.behind_since = now
            # Looked at again then even if nothing more is sent (the stream may have ended).
            reactor.callLater(self.chat_slow + POLL, self.watch_websocket, protocol)
        if size > WEBSOCKET_MAX_BUFFER or now - protocol.behind_since >= self.chat_slow:
            log.warning("closed a websocket to %s: %d bytes unread for %.1f s",
                        protocol.client_addr, size, now - protocol.behind_since)  # fmt: skip
            # Sent after what is queued; a client that reads nothing is dropped by autobahn's
            # close-handshake timeout.
            protocol.sendClose(code=SLOW_CLOSE_CODE, reason="The client did not keep up with the stream.")

    # --- shutdown ---------------------------------------------------------------

    async def graceful_shutdown(self) -> None:
        # daphne sends Twisted's log (where a failed trigger would be reported) nowhere.
        try:
            await self.shutdown()
        except BaseException:
            log.exception("the graceful shutdown failed")
            raise

    async def shutdown(self) -> None:
        from chat.apps import close_clients, end_streams, running_streams

        # The connections already waiting are accepted before the port closes (closing would reset
        # them, and nginx does not retry a POST it has sent), then waited for until their requests
        # reach the application: the wait below then counts them.
        accepted = [protocol for port in self.ports for protocol in accept_waiting(port)]
        for port in self.ports:
            port.stopListening()
        if accepted:
            log.info("stopping: accepted %d connection(s) that were waiting", len(accepted))
            # Looked at every POLL: Twisted tells nothing when a request reaches the application.
            for _ in range(round(ACCEPTED_REQUEST_SECONDS / POLL)):
                if not any(awaits_its_request(protocol) for protocol in accepted):
                    break
                await asyncio.sleep(POLL)
        stopping.drain()  # a tab still connected here sends its next turn to another process
        if not self.bind_failed:
            log.info("stopping: no new connections; waiting up to %g s for running streams", self.grace)
            hurry = self._hurry_on_a_second_signal()
            if await self._wait_for(lambda: self.running_http() + running_streams(), self.grace, hurry):
                log.warning("ending the streams still running as interrupted")
        try:
            await end_streams("The server stopped while this answer was streaming.")
        except Exception:
            log.exception("could not end every stream cleanly")
        if self.connected():
            await asyncio.sleep(SETTLE_SECONDS)  # for the `done` frames to reach the sockets
        # 1012, the registered "service restart": clients reconnect.
        closing = self.close_websockets(RESTART_CLOSE_CODE, b"The server is restarting.")
        await self._wait_for(lambda: self.running_http() + [c for c in closing if not c.done()], UNWIND_SECONDS)
        # A client too slow to take its last events: cut it, its usage is written as it unwinds.
        self.abort_http()
        remaining = self.running_applications()
        for instance in remaining:
            instance.cancel()
        await asyncio.gather(*remaining, return_exceptions=True)
        await close_clients()
        log.info("stopped: every stream ended")

    @staticmethod
    async def _wait_for(tasks, seconds: float, hurry: asyncio.Future | None = None) -> bool:
        """Wait until tasks() is empty, the seconds pass or `hurry` is done; whether some were still running."""
        deadline = time.monotonic() + seconds
        while (running := tasks()) and (left := deadline - time.monotonic()) > 0:
            if hurry is not None and hurry.done():
                break
            waited = [*running, hurry] if hurry is not None else running
            await asyncio.wait(waited, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return bool(tasks())

    @staticmethod
    def _hurry_on_a_second_signal() -> asyncio.Future:
        """A future done when SIGTERM or SIGINT comes again: Ctrl-C twice skips the rest of the grace."""
        loop = asyncio.get_running_loop()
        hurry = loop.create_future()

        def handler(signum, frame) -> None:
            log.warning("stop signal again: ending the running streams now")
            loop.call_soon_threadsafe(lambda: hurry.done() or hurry.set_result(None))

        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(signum, handler)
            except ValueError:  # not the main thread (embedded): no second-signal shortcut
                pass
        return hurry

    def _say_started(self) -> None:
        from django.conf import settings

        from chatsite import VERSION

        layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
        redis = " at " + redacted(settings.REDIS_URL) if settings.REDIS_URL else ""
        log.info(
            "chat server %s (pid %d) serving on %s; database %s; channel layer %s%s; metrics %s",
            VERSION, os.getpid(), ", ".join(self.endpoints) or "?", database_named(settings.DATABASES["default"]),
            layer, redis, "summed in " + metrics.MULTIPROCESS_DIR if metrics.MULTIPROCESS_DIR else "per process",
        )  # fmt: skip

    def _start_serving(self) -> None:
        from chat.apps import start_serving

        # Kept referenced until it is done (the loop holds tasks only weakly); a failure is logged
        # by chat.runtime.process_loops and tried again at the next request.
        self._starting = event_loop().create_task(start_serving())

    def run(self) -> None:
        freeze_start_up()
        share_the_interpreter()
        metrics.forget_dead_processes()
        reactor.callWhenRunning(self._start_serving)
        reactor.callWhenRunning(self._say_started)
        try:
            super().run()
        finally:
            metrics.process_exits()
        # Whatever is still pending would otherwise be finalised by the garbage collector
        # at exit, outside its loop: cancel it and let it unwind here.
        loop = event_loop()
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=UNWIND_SECONDS))
        loop.run_until_complete(loop.shutdown_asyncgens())


def _host(client: str | None) -> str:
    """daphne's "host:port" as the log shows it: the port only when it is known (a forwarded address has none)."""
    if not client:
        return "-"
    return client.removesuffix(":0")


def redacted(url: str) -> str:
    """A service URL without its password."""
    scheme, sep, rest = url.partition("://")
    _credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{host}"


def database_named(database: dict) -> str:
    """Which database the server uses, for its start-up line: the file, or the server and name (no password)."""
    if database["ENGINE"].endswith("sqlite3"):
        return f"SQLite {database['NAME']}"
    return f"PostgreSQL {database.get('HOST') or 'localhost'}:{database.get('PORT') or 5432}/{database['NAME']}"


def freeze_start_up() -> None:
    """Leave what start-up built (Django, the apps, their modules) out of every garbage collection from now on.

    A full collection walks every object the collector tracks, in one piece, while nothing else
    runs, and most of what a serving process tracks is start-up's, which never becomes garbage:
    every full pass walked it while no chunk went out. Frozen, start-up's objects are walked no more; what the
    requests make is collected as before. Called before the process listens, so no request's
    objects are frozen (a frozen object freed by its reference count still goes at once).
    """
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (loads the views and what they import, as a first request would)
    gc.collect()  # start-up's garbage is freed, not frozen
    gc.freeze()


def share_the_interpreter() -> None:
    """Make the event loop hand the interpreter to a waiting thread after GIL_SWITCH_INTERVAL_MS, not Python's 5 ms.

    A database thread (chat/runtime/db_threads.py) waits for the interpreter's lock after every
    round trip, and while the loop relays a burst's streams it waited up to the whole interval each
    time: a start under its person's lock, a few round trips, held the lock that much longer for
    every other start of the person.
    """
    from django.conf import settings

    sys.setswitchinterval(settings.GIL_SWITCH_INTERVAL_MS / 1000)


def main(argv: list[str] | None = None) -> None:
    """`python -m chatsite.server` with daphne's options; exits 1 when a port cannot be bound."""
    server = run_command_line(ChatServer, DESCRIPTION, sys.argv[1:] if argv is None else argv)
    if server is not None and server.bind_failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
