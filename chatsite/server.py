"""daphne, with flow control, request-body limits, a graceful SIGTERM and a non-zero exit on bind failure.

Start it as daphne (same options): `python -m chatsite.server -b 127.0.0.1 -p 8000 chatsite.asgi:application`.

* Flow control. daphne writes every response body and websocket frame into Twisted's
  transport buffer at once, so a client that reads nothing makes the buffer (and the
  process) grow without end. Here an HTTP body `send` waits while the buffer is over
  FLOW_HIGH_WATER: the streaming view stops pulling from its generator, the relay's
  queue fills and the upstream read pauses. A client that stays behind for
  API_SLOW_CLIENT_SECONDS is disconnected; the view learns why from the scope's
  `chatsite.flow` extension. A websocket `send` never waits (one slow tab must not slow
  a stream others watch); a socket whose unsent bytes (Twisted's buffer and the kernel's
  send queue) stay over FLOW_HIGH_WATER for CHAT_SLOW_CLIENT_SECONDS, or ever pass
  WEBSOCKET_MAX_BUFFER, is closed with 4008.
* Request bodies. twisted.web buffers a whole request body (in memory, then in a temp
  file) before daphne hands it over. Bodies over Django's DATA_UPLOAD_MAX_MEMORY_SIZE are
  refused with 413 while they arrive: at the Content-Length header, or as soon as a
  chunked body's running size passes the limit. The attachment upload's path alone
  may send ATTACHMENT_MAX_FILE_BYTES and its multipart framing.
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
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import io
import logging
import signal
import struct
import sys
import termios
import time

from daphne.cli import CommandLineInterface  # installs the asyncio reactor first
from daphne.http_protocol import WebRequest
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet import defer, reactor, tcp

log = logging.getLogger("chatsite.server")


def _unwrap_http_module() -> None:
    """daphne's http_protocol reaches twisted.web.http through Twisted's deprecation proxy.

    That proxy (twisted.python.deprecate._ModuleProxy) runs a Python __getattribute__ with
    bookkeeping on every attribute read, and daphne reads `http.Request.write` on every body
    chunk it writes: about 4% of the server's CPU on a /v1 stream. daphne uses none of the
    deprecated names, so it gets the module itself.
    """
    import daphne.http_protocol
    import twisted.web.http

    try:
        module = object.__getattribute__(twisted.web.http, "_module")
    except AttributeError:
        return  # not proxied (a newer Twisted): nothing to do
    if daphne.http_protocol.http is twisted.web.http:
        daphne.http_protocol.http = module


_unwrap_http_module()

# Bytes waiting in Twisted's send buffer (on top of the kernel's socket buffer) above which
# a client counts as behind (Twisted pauses its own producers at this size too): an HTTP body
# send waits, a websocket's slow-client clock runs.
FLOW_HIGH_WATER = 64 * 1024
# A websocket whose unsent frames pass this is closed at once, whatever its clock says.
WEBSOCKET_MAX_BUFFER = 16 * 1024 * 1024
# The close code of a websocket closed for not reading (docs/websocket.md).
SLOW_CLOSE_CODE = 4008
# The close code of every websocket at shutdown: "service restart", clients reconnect.
RESTART_CLOSE_CODE = 1012
# How often a waiting send looks at the buffer again; only while a client is behind.
POLL = 0.05
# At shutdown, after the waiting connections were accepted: time for their requests to be read.
ACCEPTED_SETTLE_SECONDS = 0.2
# At shutdown, after the streams were ended: time for their last frames to be written.
SETTLE_SECONDS = 1.0
# ... and the longest an ended /v1 stream may take to unwind before its socket is cut.
UNWIND_SECONDS = 5.0


def buffered(transport) -> int:
    """Bytes written to a Twisted TCP transport and not yet handed to the kernel."""
    if transport is None:
        return 0
    pending = getattr(transport, "dataBuffer", b"")
    return len(pending) - getattr(transport, "offset", 0) + getattr(transport, "_tempDataLen", 0)


def unsent(transport) -> int:
    """Bytes written to a Twisted TCP transport that the client has not yet acknowledged.

    A websocket's frames are small and few (coalesced), so the kernel's send buffer, which
    Linux grows to megabytes, would hide a client that reads nothing for minutes: its
    queue (TIOCOUTQ) counts too.
    """
    size = buffered(transport)
    try:
        queued = fcntl.ioctl(transport.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return size  # not a socket of this kernel's kind (TLS wrapper, closed, not Linux)
    return size + struct.unpack("i", queued)[0]


def text_frame(protocol, message: dict) -> bytes | None:
    """A `websocket.send` of text as the one frame autobahn would write, or None to leave it to autobahn.

    autobahn's sendMessage checks its arguments, counts statistics and formats the arguments
    of a debug log line (with click's colours, whether or not debug is on) for every frame:
    about 6 % of a chat stream's CPU in py-spy. A server's text frame (RFC 6455 5.2: FIN, opcode
    1, unmasked, one frame) is a 2- to 10-byte header and the UTF-8 payload. Anything
    autobahn would do differently (compression, masking, fragmenting, a size limit, frames
    queued before) is left to it.
    """
    text = message.get("text")
    if (type(text) is not str or message.get("bytes") or protocol._perMessageCompress is not None
            or protocol.maskServerFrames or protocol.send_queue or protocol.trackedTimings):  # fmt: skip
        return None
    payload = text.encode()
    size = len(payload)
    if 0 < protocol.maxMessagePayloadSize < size or 0 < protocol.autoFragmentSize < size:
        return None
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


@contextlib.contextmanager
def written_through(transport):
    """What the block writes to an idle transport is handed to the socket at its end, not on the reactor's next turn.

    Twisted only buffers a write and asks the loop to watch the socket for writability
    (an epoll_ctl to add it, a loop turn, the write, an epoll_ctl to remove it): for a
    stream's small chunk that costs more than the chunk. Here the write goes straight to
    the socket; whatever the kernel does not take (or an error) is left to the reactor as
    before, so flow control and disconnects are unchanged. A transport that already has
    bytes (or a close) waiting for the reactor is left as it is: the new bytes queue behind.
    """
    if transport.dataBuffer or transport._tempDataBuffer or transport.disconnecting:
        yield
        return
    transport.startWriting = _no_start  # shadows the method for these writes
    try:
        yield
    finally:
        # Even if the block raised after writing: nothing may stay buffered unwatched.
        del transport.startWriting
        _send_now(transport)


def _no_start() -> None:
    """A transport's startWriting while bytes are written through (written_through)."""


def _send_now(transport) -> None:
    """Hand a transport's newly buffered bytes to the socket; the rest, or an error, to the reactor."""
    if not transport._tempDataBuffer:
        return  # nothing written (closed, or an empty body)
    if transport.connected and not transport.disconnecting and transport.doWrite() is None:
        if not transport._tempDataBuffer and transport.offset == len(transport.dataBuffer):
            return  # all of it is with the kernel
    transport.startWriting()


class Flow:
    """The `chatsite.flow` scope extension of an HTTP request: why the server cut it, if it did."""

    def __init__(self) -> None:
        self.slow_cut = False


# Room for the multipart framing and form fields around an uploaded file.
UPLOAD_FRAMING = 64 * 1024


class LimitedRequest(WebRequest):
    """daphne's request, refusing a body over the limit while it arrives instead of buffering it."""

    max_body: int | None = None
    # Paths allowed a larger body (the attachment upload: a file and its multipart framing).
    large_bodies: dict[bytes, int] = {}

    def __init__(self, *args, **kwargs) -> None:
        # daphne hands Django the raw body, so Twisted's parse of POSTed forms into request.args is
        # never read: it ran the email package on every POST's Content-Type (2 % of a /v1 start's
        # CPU) and held a second, parsed copy of every multipart upload.
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    def gotLength(self, length):
        self._received = 0
        self._refused = False
        # The request line is parsed by now (the channel keeps it until the body is complete).
        path = getattr(self.channel, "_path", b"").split(b"?", 1)[0]
        self.max_body = self.large_bodies.get(path, type(self).max_body)
        if self.max_body is not None and length is not None and length > self.max_body:
            self.content = io.BytesIO()  # stays empty; Twisted still seeks it if the body completes
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data):
        if self._refused:
            return
        self._received += len(data)
        if self.max_body is not None and self._received > self.max_body:
            self._refuse()
            return
        super().handleContentChunk(data)

    def process(self):
        if getattr(self, "_refused", False):
            return None  # the rest of a refused body may complete the request: it is not served
        return super().process()

    def _refuse(self) -> None:
        self._refused = True
        client = getattr(self.getClientAddress(), "host", "?")
        log.warning("refused a request body over %d bytes from %s", self.max_body, client)
        body = f"The request body is larger than {self.max_body} bytes.\n".encode()
        transport = self.channel.transport
        transport.write(
            b"HTTP/1.1 413 Content Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        # The rest of the body is never read: the connection ends once the answer is out.
        self.channel.loseConnection()
        # Twisted would answer `Expect: 100-continue` right after this (curl sends it for big bodies).
        self.requestHeaders.removeHeader(b"Expect")


def accept_waiting(port) -> int:
    """Accept the connections waiting in `port`'s backlog, so that closing it resets none; how many.

    The kernel completes a handshake before the server accepts it: nginx may already have sent
    a request on such a connection, and a POST whose connection is reset is answered 502, not
    tried on the next process. Accepted, it is served like any other before the process exits.
    """
    start = getattr(port, "sessionno", None)
    if start is None:
        return 0
    for _ in range(1000):  # each read accepts what is there; at most this many
        before = port.sessionno
        if getattr(port, "socket", None) is None:
            break
        port.doRead()
        if port.sessionno == before:
            break
    return port.sessionno - start


class ChatServer(Server):
    """daphne's Server with flow control, body limits, a graceful shutdown and a bind-failure exit."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from django.conf import settings

        self.grace = settings.SHUTDOWN_GRACE_SECONDS
        self.api_slow = settings.API_SLOW_CLIENT_SECONDS
        self.chat_slow = settings.CHAT_SLOW_CLIENT_SECONDS
        LimitedRequest.max_body = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        LimitedRequest.large_bodies = {b"/api/attachments": settings.ATTACHMENT_MAX_FILE_BYTES + UPLOAD_FRAMING}
        self.ports: list = []
        self.bind_failed = False
        # Called by daphne once its factories exist and before the reactor runs.
        self.ready_callable = self._use_limited_requests

    def _use_limited_requests(self) -> None:
        build = self.http_factory.buildProtocol

        def build_protocol(addr):
            protocol = build(addr)
            protocol.requestFactory = LimitedRequest
            return protocol

        self.http_factory.buildProtocol = build_protocol
        # Twisted's own access line: built for every request in its combined log format, then sent to
        # a log daphne throws away below verbosity 2 (and above it, a second copy of daphne's own
        # access log): 1.4 % of a one-token /v1 answer's CPU. daphne's access log is unchanged.
        self.http_factory.log = _no_access_line

    # --- listening --------------------------------------------------------------

    def listen_success(self, port) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def listen_error(self, failure) -> None:
        self.bind_failed = True
        super().listen_error(failure)

    # --- flow control -----------------------------------------------------------

    def create_application(self, protocol, scope):
        if scope["type"] == "http":
            protocol.flow = Flow()
            scope = {**scope, "extensions": {**scope.get("extensions", {}), "chatsite.flow": protocol.flow}}
        return super().create_application(protocol, scope)

    async def handle_reply(self, protocol, message) -> None:
        kind = message["type"]
        if kind == "websocket.send" and protocol.state != WebSocketProtocol.STATE_OPEN:
            return  # closing (maybe by us, for not reading): autobahn would raise on a send
        transport = protocol.transport
        through = type(transport) is tcp.Server and (kind == "websocket.send" or message.get("more_body"))
        frame = text_frame(protocol, message) if through and kind == "websocket.send" else None
        if frame is not None:
            # daphne's own check before a reply, which this write goes around.
            if protocol in self.connections and not self.connections[protocol].get("disconnected"):
                with written_through(transport):
                    transport.write(frame)
        elif through:
            with written_through(transport):
                await super().handle_reply(protocol, message)
        else:
            await super().handle_reply(protocol, message)
        if kind == "http.response.body" and message.get("more_body"):
            if buffered(protocol.transport) > FLOW_HIGH_WATER:
                await self._wait_for_reader(protocol)
        elif kind == "websocket.send":
            self._watch_websocket(protocol)

    async def _wait_for_reader(self, protocol) -> None:
        """Hold the app's send until the client takes its bytes; cut a client that stays behind."""
        deadline = time.monotonic() + self.api_slow
        while buffered(protocol.transport) > FLOW_HIGH_WATER:
            if protocol.finished or protocol.transport is None:
                return
            if time.monotonic() > deadline:
                log.warning("closed an HTTP response to %s: the client read nothing for %g s",
                            protocol.client_addr, self.api_slow)  # fmt: skip
                protocol.flow.slow_cut = True
                protocol.transport.abortConnection()
                # The app hears `http.disconnect` and is cancelled here; never send on.
                await asyncio.sleep(UNWIND_SECONDS)
                return
            await asyncio.sleep(POLL)

    def _watch_websocket(self, protocol) -> None:
        if protocol.state != WebSocketProtocol.STATE_OPEN:
            return
        size = unsent(protocol.transport)
        if size <= FLOW_HIGH_WATER:
            protocol.behind_since = None
            return
        now = time.monotonic()
        if getattr(protocol, "behind_since", None) is None:
            protocol.behind_since = now
            # Looked at again then even if nothing more is sent (the stream may have ended).
            reactor.callLater(self.chat_slow + POLL, self._watch_websocket, protocol)
        if size > WEBSOCKET_MAX_BUFFER or now - protocol.behind_since >= self.chat_slow:
            log.warning("closed a websocket to %s: %d bytes unread for %.1f s",
                        protocol.client_addr, size, now - protocol.behind_since)  # fmt: skip
            # Sent after what is queued; a client that reads nothing is dropped by autobahn's
            # close-handshake timeout.
            protocol.sendClose(code=SLOW_CLOSE_CODE, reason="The client did not keep up with the stream.")

    # --- shutdown ---------------------------------------------------------------

    def kill_all_applications(self):
        """At reactor shutdown (SIGTERM): the graceful stop instead of cancelling everything at once."""
        return defer.Deferred.fromFuture(asyncio.ensure_future(self._shutdown_logged()))

    async def _shutdown_logged(self) -> None:
        # daphne sends Twisted's log (where a failed trigger would be reported) nowhere.
        try:
            await self.shutdown()
        except BaseException:
            log.exception("the graceful shutdown failed")
            raise

    async def shutdown(self) -> None:
        from chat.apps import close_clients, end_streams, running_streams

        # The connections already waiting are accepted before the port closes, then given a moment
        # for their requests (already sent) to begin: the wait below then counts them.
        accepted = sum(accept_waiting(port) for port in self.ports)
        for port in self.ports:
            port.stopListening()
        if accepted:
            log.info("stopping: accepted %d connection(s) that were waiting", accepted)
            await asyncio.sleep(ACCEPTED_SETTLE_SECONDS)
        if not self.bind_failed:
            log.info("stopping: no new connections; waiting up to %g s for running streams", self.grace)
            hurry = self._hurry_on_a_second_signal()
            if await self._wait_for(lambda: self._http_running() + running_streams(), self.grace, hurry):
                log.warning("ending the streams still running as interrupted")
        try:
            await end_streams("The server stopped while this answer was streaming.")
        except Exception:
            log.exception("could not end every stream cleanly")
        if self.connections:
            await asyncio.sleep(SETTLE_SECONDS)  # for the `done` frames to reach the sockets
        closing = []
        for protocol in list(self.connections):
            if isinstance(protocol, WebSocketProtocol) and protocol.state == WebSocketProtocol.STATE_OPEN:
                # sendClose() allows only 1000 and 3000-4999; 1012 is the registered "service restart".
                protocol.sendCloseFrame(code=RESTART_CLOSE_CODE, reasonUtf8=b"The server is restarting.")
                closing.append(defer.Deferred.asFuture(protocol.is_closed, asyncio.get_running_loop()))
        await self._wait_for(lambda: self._http_running() + [c for c in closing if not c.done()], UNWIND_SECONDS)
        for protocol in list(self.connections):
            # A client too slow to take its last events: cut it, its usage is written as it unwinds.
            if isinstance(protocol, WebRequest) and protocol.transport is not None:
                protocol.transport.abortConnection()
        remaining = [
            details["application_instance"]
            for details in self.connections.values()
            if "application_instance" in details and not details["application_instance"].done()
        ]
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

    def _start_serving(self) -> None:
        from chat.apps import start_serving

        # Kept referenced until it is done (the loop holds tasks only weakly); a failure is logged
        # by chat.process and tried again at the next request.
        self._starting = reactor._asyncioEventloop.create_task(start_serving())

    def _http_running(self) -> list:
        return [
            details["application_instance"]
            for protocol, details in list(self.connections.items())
            if isinstance(protocol, WebRequest)
            and "application_instance" in details
            and not details["application_instance"].done()
        ]

    def run(self) -> None:
        freeze_start_up()
        reactor.callWhenRunning(self._start_serving)
        super().run()
        # Whatever is still pending would otherwise be finalised by the garbage collector
        # at exit, outside its loop: cancel it and let it unwind here.
        loop = reactor._asyncioEventloop
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=UNWIND_SECONDS))
        loop.run_until_complete(loop.shutdown_asyncgens())


def freeze_start_up() -> None:
    """Leave what start-up built (Django, the apps, their modules) out of every garbage collection from now on.

    A full collection walks every object the collector tracks, in one piece, while nothing else
    runs: in a process serving 200 streams, about 170,000 objects, 105,000 of them start-up's, for
    77–263 ms in which no chunk went out. Frozen, start-up's objects are walked no more; what the
    requests make is collected as before. Called before the process listens, so no request's
    objects are frozen (a frozen object freed by its reference count still goes at once).
    """
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (loads the views and what they import, as a first request would)
    gc.collect()  # start-up's garbage is freed, not frozen
    gc.freeze()


def _no_access_line(request) -> None:
    """Twisted's HTTPFactory.log, replaced: daphne writes the access log."""


class CommandLine(CommandLineInterface):
    description = "The chat server: daphne with flow control and a graceful shutdown"
    server_class = ChatServer


def main(argv: list[str] | None = None) -> None:
    """`python -m chatsite.server` with daphne's options; exits 1 when a port cannot be bound."""
    cli = CommandLine()
    cli.run(sys.argv[1:] if argv is None else argv)
    if cli.server is not None and cli.server.bind_failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
