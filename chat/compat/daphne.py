"""daphne's internals, and those of the Twisted and autobahn under it, that chatsite/server.py relies on.

Written against daphne 4.2.3, Twisted 26.10.0 and autobahn 26.10.2 (requirements.lock);
tests/compat/test_compat_daphne.py fails when one of these changes.

* daphne.server.Server. Its run() listens on each of `endpoints` with Twisted's
  serverFromString; Server below adds a listen backlog to them (with_backlog). It overrides
  its handle_reply (daphne passes a reply to the protocol only while `connections[protocol]`
  has no "disconnected"), create_application,
  listen_success, listen_error and kill_all_applications (run() makes it the reactor's
  "before shutdown" trigger; daphne's cancels every application at once), sets its
  ready_callable (run() calls it once `http_factory` exists, before the reactor runs) and
  reads its `connections` (protocol -> {"application_instance", "disconnected"}). It names
  the hooks chatsite/server.py fills: http_scope, wait_for_reader, watch_websocket and
  graceful_shutdown. daphne's command line exits with status 1 after a failed bind only if
  the failure came before its reactor ran (`abort_start`); otherwise with 0
  (django/daphne#552, #577): `bind_failed` says it happened. daphne.cli.CommandLineInterface:
  the `server_class` and `description` it is made with, and the `server` its run() leaves.
* daphne.http_protocol reaches twisted.web.http through Twisted's deprecation proxy
  (twisted.python.deprecate._ModuleProxy, the module in its `_module`), whose Python
  __getattribute__ runs on every attribute read, and daphne reads `http.Request.write` for
  every body chunk it writes: daphne gets the module itself (twisted/twisted#12200 and pull
  request #12149 take such reads out of twisted.web for the same cost).
* HTTPFactory.buildProtocol gives each HTTP channel daphne's WebRequest as requestFactory;
  BodyLimitedRequest takes its place. It overrides Twisted's Request.gotLength (called once
  the headers are read, while the channel still holds the request line in `_path`),
  handleContentChunk and process, so a body over the limit is refused while it arrives
  instead of read whole into memory first (django/daphne#483); and it passes
  parsePOSTFormSubmission=False: daphne hands Django the raw body, so Twisted's own parse
  of a POSTed form (the email package on every POST, a second copy of every upload) was
  never read. Twisted's HTTPFactory.log, which formats an access line per request for a log
  daphne throws away, is replaced by one that does nothing; daphne's access log stays.
* daphne's WebRequest.handle_exception answers an application's exception with a 500 page
  (basic_error). Once the response has started, that page's `http.response.start` raises
  ValueError inside daphne's Server.application_checker, which then is never scheduled again:
  the connection hung, and no later connection was reaped or timed out. BodyLimitedRequest
  closes a started response's connection instead, without its end, which a client reads as cut.
* Twisted's Request.setResponseCode takes the status line's reason from twisted.web.http's
  RESPONSES table, else writes "Unknown Status": the table lacks 429 (and 421-426, 428,
  431, 451, 506, 508, 511), which daphne would send as `429 Unknown Status`.
  BodyLimitedRequest.setResponseCode gives those the standard reason (http.HTTPStatus).
* Twisted's TCP transport (twisted/internet/abstract.py, tcp.py): its write buffers
  (dataBuffer, offset, _tempDataBuffer, _tempDataLen), doWrite and startWriting, read by
  buffered() for flow control (daphne writes every reply into that buffer at once, however
  far behind the client is: django/daphne#170) and used by written_through() to hand a write
  to the socket at once instead of on the reactor's next turn, which cost two epoll_ctl
  calls and a loop turn per small chunk. tcp.Port's sessionno, socket, factory and doRead, used by
  accept_waiting(); HTTPChannel's requests and daphne's WebRequest.application_queue, read by
  awaits_its_request().
* autobahn's WebSocketProtocol: text_frame() is the frame sendMessage would write, which
  checks its arguments, counts statistics and formats a debug line's arguments for every
  frame; it reads the attributes that decide whether sendMessage would do anything else
  (_perMessageCompress, maskServerFrames, send_queue, trackedTimings, maxMessagePayloadSize,
  autoFragmentSize). close_websockets() uses sendCloseFrame, which takes 1012 ("service
  restart") where sendClose allows only 1000 and 3000-4999; `is_closed` fires once closed.
* The asyncio loop under daphne's reactor: `reactor._asyncioEventloop` (event_loop()).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http
import io
import json
import struct
import termios

import daphne.http_protocol
import twisted.web.http
from daphne.cli import CommandLineInterface  # installs daphne's asyncio reactor, before Twisted's is imported
from daphne.http_protocol import WebRequest
from daphne.server import Server as DaphneServer
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet import defer, reactor, tcp

WEBSOCKET_OPEN = WebSocketProtocol.STATE_OPEN
# The reason phrase of every status the standard library knows ("Too Many Requests" for 429).
REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


def _unwrap_http_module() -> None:
    """daphne's http_protocol gets twisted.web.http itself, not Twisted's deprecation proxy of it."""
    try:
        module = object.__getattribute__(twisted.web.http, "_module")
    except AttributeError:
        return  # not proxied (a newer Twisted): nothing to do
    if daphne.http_protocol.http is twisted.web.http:
        daphne.http_protocol.http = module


_unwrap_http_module()


def event_loop() -> asyncio.AbstractEventLoop:
    """The asyncio loop daphne's Twisted reactor runs on."""
    return reactor._asyncioEventloop


# --- Twisted's transports ---------------------------------------------------------------


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


def accept_waiting(port) -> list:
    """Accept the connections waiting in a listening port's backlog, so that closing it resets none; their protocols."""
    factory = getattr(port, "factory", None)
    if getattr(port, "sessionno", None) is None or factory is None:
        return []
    accepted = []
    build = factory.buildProtocol

    def built(address):
        accepted.append(protocol := build(address))
        return protocol

    factory.buildProtocol = built  # an instance attribute over the class's method, removed below
    try:
        for _ in range(1000):  # each read accepts what is there; at most this many
            before = port.sessionno
            if getattr(port, "socket", None) is None:
                break
            port.doRead()
            if port.sessionno == before:
                break
    finally:
        del factory.buildProtocol
    return [protocol for protocol in accepted if protocol is not None]


def awaits_its_request(protocol) -> bool:
    """Whether an accepted HTTP connection is open and its request has not yet reached the application.

    Twisted's HTTPChannel keeps a request in `requests` from its first line until it is done;
    daphne's WebRequest sets its application_queue once the whole request is in (process()).
    An idle keep-alive connection counts as waiting too: the caller bounds the wait.
    """
    transport = getattr(protocol, "transport", None)
    if transport is None or not getattr(transport, "connected", False):
        return False
    requests = getattr(protocol, "requests", None) or [None]
    return getattr(requests[-1], "application_queue", None) is None


# --- autobahn's websocket frames --------------------------------------------------------


def text_frame(protocol, message: dict) -> bytes | None:
    """A `websocket.send` of text as the one frame autobahn would write, or None to leave it to autobahn.

    A server's text frame (RFC 6455 5.2: FIN, opcode 1, unmasked, one frame) is a 2- to
    10-byte header and the UTF-8 payload. Anything autobahn would do differently
    (compression, masking, fragmenting, a size limit, frames queued before) is left to it.
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


# --- daphne's request and server --------------------------------------------------------


class BodyLimitedRequest(WebRequest):
    """daphne's request, refusing a body over `max_body` (or its path's in `large_bodies`) while it arrives."""

    max_body: int | None = None
    # Paths allowed a larger body than max_body.
    large_bodies: dict[bytes, int] = {}

    def __init__(self, *args, **kwargs) -> None:
        # daphne hands Django the raw body: Twisted's parse of a POSTed form would never be read.
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    def gotLength(self, length):
        self._received = 0
        self._refused = False
        # The request line is parsed by now (the channel keeps it until the body is complete).
        path = self._limited_path = getattr(self.channel, "_path", b"").split(b"?", 1)[0]
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

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        # Twisted's table of reasons lacks some that the server sends (429): "Unknown Status" otherwise.
        if message is None and code not in twisted.web.http.RESPONSES:
            message = REASONS.get(code)
        super().setResponseCode(code, message)

    def process(self):
        if getattr(self, "_refused", False):
            return None  # the rest of a refused body may complete the request: it is not served
        return super().process()

    def handle_exception(self, exception):
        if not self._response_started:
            super().handle_exception(exception)  # the 500 page
            return
        # Too late for a page: what was sent stays, the rest never comes, and the client is told by the close.
        self.channel.loseConnection()

    def refused(self) -> None:
        """Called once this request's body was refused (with a 413 already on its way)."""

    def _refuse(self) -> None:
        self._refused = True
        self.refused()
        detail = f"The request body is larger than {self.max_body} bytes."
        if self._limited_path.startswith(b"/v1/"):  # an OpenAI client reads the error's JSON, as from every /v1/ answer
            error = {"message": detail, "type": "invalid_request_error", "param": None, "code": "request_too_large"}
            body, kind = json.dumps({"error": error}).encode(), b"application/json"
        else:
            body, kind = f"{detail}\n".encode(), b"text/plain; charset=utf-8"
        transport = self.channel.transport
        transport.write(
            b"HTTP/1.1 413 Content Too Large\r\nContent-Type: %s\r\nCache-Control: no-store\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (kind, len(body), body)
        )
        # The rest of the body is never read: the connection ends once the answer is out.
        self.channel.loseConnection()
        # Twisted would answer `Expect: 100-continue` right after this (curl sends it for big bodies).
        self.requestHeaders.removeHeader(b"Expect")


def with_backlog(endpoints: list[str], backlog: int) -> list[str]:
    """Twisted endpoint strings for TCP and Unix sockets with this listen backlog, unless they name one.

    Twisted listens with a backlog of 50: a burst of more connections than the loop accepts at
    once overflowed it, and each connection dropped so waited a second or more for its client to
    try again. A socket passed in (`fd:`) keeps the backlog it was opened with.
    """
    return [
        f"{endpoint}:backlog={backlog}"
        if endpoint.split(":", 1)[0] in ("tcp", "tcp6", "unix") and ":backlog=" not in endpoint
        else endpoint
        for endpoint in endpoints
    ]


class Server(DaphneServer):
    """daphne's Server with replies written through and its internal hooks given names a subclass fills."""

    # The request class of HTTP connections.
    request_class: type[WebRequest] = BodyLimitedRequest
    # Bytes waiting in Twisted's buffer past which an HTTP body send calls wait_for_reader().
    flow_high_water: int

    def __init__(self, *args, listen_backlog: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if listen_backlog > 0:
            self.endpoints = with_backlog(self.endpoints, listen_backlog)
        self.ports: list = []
        self.bind_failed = False
        # Called by daphne once its factories exist and before the reactor runs.
        self.ready_callable = self._use_request_class

    def _use_request_class(self) -> None:
        build = self.http_factory.buildProtocol
        request_class = self.request_class

        def build_protocol(addr):
            protocol = build(addr)
            protocol.requestFactory = request_class
            return protocol

        self.http_factory.buildProtocol = build_protocol
        # Twisted's own access line: built for every request in its combined log format, then sent to
        # a log daphne throws away below verbosity 2 (and above it, a second copy of daphne's own).
        self.http_factory.log = _no_access_line

    # --- hooks for a subclass ---------------------------------------------------------

    def http_scope(self, protocol, scope: dict) -> dict:
        """The scope an HTTP request's application gets (a subclass may add to it)."""
        return scope

    async def wait_for_reader(self, protocol) -> None:
        """After an HTTP body part left over flow_high_water bytes unsent: the application's send waits for this."""

    def watch_websocket(self, protocol) -> None:
        """After each websocket.send written to an open websocket."""

    async def graceful_shutdown(self) -> None:
        """At the reactor's shutdown (SIGTERM), in place of daphne's cancelling every application at once."""
        running = self.running_applications()
        for application in running:
            application.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    # --- daphne's methods ---------------------------------------------------------------

    def listen_success(self, port) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def listen_error(self, failure) -> None:
        self.bind_failed = True
        super().listen_error(failure)

    def create_application(self, protocol, scope):
        if scope["type"] == "http":
            scope = self.http_scope(protocol, scope)
        return super().create_application(protocol, scope)

    async def handle_reply(self, protocol, message) -> None:
        kind = message["type"]
        if kind == "websocket.send" and protocol.state != WEBSOCKET_OPEN:
            return  # closing (maybe for not reading): autobahn would raise on a send
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
            if buffered(protocol.transport) > self.flow_high_water:
                await self.wait_for_reader(protocol)
        elif kind == "websocket.send":
            self.watch_websocket(protocol)

    def kill_all_applications(self):
        return defer.Deferred.fromFuture(asyncio.ensure_future(self.graceful_shutdown()))

    # --- the connections ----------------------------------------------------------------

    def connected(self) -> bool:
        """Whether any connection is still open."""
        return bool(self.connections)

    def running_applications(self) -> list[asyncio.Future]:
        """The applications of every connection that have not finished."""
        return [
            details["application_instance"]
            for details in list(self.connections.values())
            if "application_instance" in details and not details["application_instance"].done()
        ]

    def running_http(self) -> list[asyncio.Future]:
        """The applications of HTTP requests that have not finished."""
        return [
            details["application_instance"]
            for protocol, details in list(self.connections.items())
            if isinstance(protocol, WebRequest)
            and "application_instance" in details
            and not details["application_instance"].done()
        ]

    def close_websockets(self, code: int, reason: bytes) -> list[asyncio.Future]:
        """Send every open websocket a close frame with `code`; a future for each, done once it is closed."""
        closing = []
        for protocol in list(self.connections):
            if isinstance(protocol, WebSocketProtocol) and protocol.state == WEBSOCKET_OPEN:
                protocol.sendCloseFrame(code=code, reasonUtf8=reason)
                closing.append(defer.Deferred.asFuture(protocol.is_closed, asyncio.get_running_loop()))
        return closing

    def abort_http(self) -> None:
        """Cut the connection of every HTTP request still open."""
        for protocol in list(self.connections):
            if isinstance(protocol, WebRequest) and protocol.transport is not None:
                protocol.transport.abortConnection()


def _no_access_line(request) -> None:
    """Twisted's HTTPFactory.log, replaced: daphne writes the access log."""


class _CommandLine(CommandLineInterface):
    def __init__(self, server_class: type[Server], description: str) -> None:
        self.server_class = server_class
        self.description = description
        super().__init__()


def run_command_line(server_class: type[Server], description: str, argv: list[str]) -> Server | None:
    """daphne's command line (the same options) serving with `server_class`; the server it ran, if it got that far."""
    command_line = _CommandLine(server_class, description)
    command_line.run(argv)
    return command_line.server
