"""What chat/compat/daphne.py relies on in daphne, Twisted and autobahn still holds: these fail when it changes."""

from __future__ import annotations

import collections
import http
import inspect
import json
import select
import socket
from types import SimpleNamespace

import daphne.http_protocol
import daphne.server
import pytest
import twisted.web.http
from autobahn.websocket.protocol import TrafficStats
from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.ws_protocol import WebSocketFactory
from twisted.internet import abstract, main, protocol, tcp
from twisted.internet.address import IPv4Address
from twisted.python.failure import Failure

from chat.compat import daphne as compat
from chat.compat.daphne import BodyLimitedRequest, _send_now, buffered, text_frame, written_through
from tests.upstream_source import assert_unchanged

RELIED_ON_BY = "chat/compat/daphne.py"
DaphneServer = daphne.server.Server


# --- daphne's server ---------------------------------------------------------------------


def test_ports_the_server_opens_get_the_backlog_and_passed_sockets_keep_theirs():
    endpoints = ["tcp:port=8000:interface=127.0.0.1", "unix:/run/chat.sock", "fd:fileno=3", "tcp:port=1:backlog=9"]
    assert compat.with_backlog(endpoints, 2048) == [
        "tcp:port=8000:interface=127.0.0.1:backlog=2048", "unix:/run/chat.sock:backlog=2048", "fd:fileno=3",
        "tcp:port=1:backlog=9",
    ]  # fmt: skip
    assert compat.Server(application=None, endpoints=endpoints[:1], listen_backlog=7).endpoints == [
        "tcp:port=8000:interface=127.0.0.1:backlog=7"
    ]


def test_the_servers_methods_overridden_and_read_are_the_ones_read():
    assert_unchanged(DaphneServer.__init__, "e090af1e2673d44f", RELIED_ON_BY)  # ready_callable
    assert_unchanged(DaphneServer.run, "447c6bd42c62e98c", RELIED_ON_BY)  # http_factory, the shutdown trigger
    assert_unchanged(DaphneServer.handle_reply, "9d9dbaea6de0657a", RELIED_ON_BY)  # the "disconnected" check
    assert_unchanged(DaphneServer.create_application, "f1e300b4ecf636c8", RELIED_ON_BY)
    assert_unchanged(DaphneServer.listen_success, "0aa2ef7d71380301", RELIED_ON_BY)
    assert_unchanged(DaphneServer.listen_error, "4fd283e70bafe3ad", RELIED_ON_BY)
    assert_unchanged(DaphneServer.kill_all_applications, "4e1618c6f7871758", RELIED_ON_BY)
    assert_unchanged(HTTPFactory.buildProtocol, "35e878a6e0e41af2", RELIED_ON_BY)
    assert_unchanged(CommandLineInterface.__init__, "8d2314df61ee67c2", RELIED_ON_BY)
    assert_unchanged(CommandLineInterface.run, "039cb21244f402ac", RELIED_ON_BY)


def server(**kwargs) -> compat.Server:
    return compat.Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"], **kwargs)


def test_the_ready_callable_gives_http_connections_the_request_class_and_no_access_line():
    limited = server()
    limited.http_factory = HTTPFactory(limited)  # as daphne's run() makes it before calling ready_callable
    limited.ready_callable()
    channel = limited.http_factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
    assert channel.requestFactory is BodyLimitedRequest
    # Twisted logs each finished request through its factory's log: that is what is replaced.
    assert "self.channel.factory.log(self)" in inspect.getsource(twisted.web.http.Request.finish)
    assert limited.http_factory.log is compat._no_access_line


async def test_an_http_application_gets_the_scope_http_scope_gives():
    seen = []

    class Scoped(compat.Server):
        def http_scope(self, protocol, scope):
            return {**scope, "extensions": {"mine": protocol}}

    async def application(scope, receive, send):
        seen.append(scope)

    scoped = Scoped(application=application, endpoints=["tcp:port=0"])
    scoped.connections = {"a protocol": {}}
    scoped.create_application("a protocol", {"type": "http"})
    await scoped.connections["a protocol"]["application_instance"]
    assert seen[0]["extensions"] == {"mine": "a protocol"}
    assert scoped.running_applications() == []


def test_the_command_line_serves_with_the_server_class_and_description_given():
    command_line = compat._CommandLine(compat.Server, "the description")
    assert command_line.parser.description == "the description" and command_line.server is None
    assert "self.server = self.server_class(" in inspect.getsource(CommandLineInterface.run)


def test_the_reactor_is_daphnes_asyncio_one():
    assert compat.event_loop() is daphne.server.twisted_loop


def test_daphne_reads_twisted_web_http_itself_not_its_deprecation_proxy():
    proxied = type(twisted.web.http).__name__ == "_ModuleProxy"
    assert type(daphne.http_protocol.http).__name__ == "module"
    if proxied:
        assert daphne.http_protocol.http is object.__getattribute__(twisted.web.http, "_module")
    assert daphne.http_protocol.http.Request is twisted.web.http.Request


# --- the request --------------------------------------------------------------------------


def test_twisteds_request_hooks_are_the_ones_overridden():
    assert_unchanged(WebRequest.__init__, "ec85d9f2a762a39f", RELIED_ON_BY)
    assert_unchanged(twisted.web.http.Request.__init__, "2d3f7dbd28d0ce02", RELIED_ON_BY)
    assert_unchanged(twisted.web.http.Request.gotLength, "1c389b99da50b0ae", RELIED_ON_BY)
    assert_unchanged(twisted.web.http.Request.handleContentChunk, "6e942756afb787b4", RELIED_ON_BY)
    assert_unchanged(twisted.web.http.Request.requestReceived, "99ca6c5e24305de4", RELIED_ON_BY)
    assert_unchanged(twisted.web.http.HTTPChannel.lineReceived, "b77ec6f21116e827", RELIED_ON_BY)
    assert_unchanged(twisted.web.http.HTTPChannel.allContentReceived, "9f7c990696871a92", RELIED_ON_BY)


class RecordingRequest(BodyLimitedRequest):
    max_body = 10
    large_bodies = {b"/big": 100}
    refusals: list = []

    def refused(self) -> None:
        self.refusals.append((self.channel._path, self.max_body))

    def process(self):
        self.refusals.append("served")


def http_channel():
    from twisted.internet.testing import StringTransport

    channel = twisted.web.http.HTTPChannel()
    channel.requestFactory = RecordingRequest
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda request: None))
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport


def test_a_v1_body_over_the_limit_is_refused_in_openais_error_shape():
    RecordingRequest.refusals = []
    channel, transport = http_channel()
    channel.dataReceived(b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n")
    head, body = transport.value().split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413 ") and b"Content-Type: application/json" in head
    assert b"Cache-Control: no-store" in head
    error = json.loads(body)["error"]
    assert error == {"message": "The request body is larger than 10 bytes.", "type": "invalid_request_error",
                     "param": None, "code": "request_too_large"}  # fmt: skip


@pytest.mark.parametrize(("path", "length", "refused"), [(b"/small", 11, True), (b"/big", 11, False),
                                                         (b"/big?x=1", 101, True)])  # fmt: skip
def test_a_body_over_its_paths_limit_is_refused_from_its_length_with_the_request_line_known(path, length, refused):
    RecordingRequest.refusals = []
    channel, transport = http_channel()
    channel.dataReceived(b"POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % (path, length))
    if refused:
        assert RecordingRequest.refusals == [(path, 10 if path == b"/small" else 100)]
        assert transport.value().startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    else:
        channel.dataReceived(b"x" * length)
        assert RecordingRequest.refusals == ["served"]


class FakeTransport:
    """Twisted's FileDescriptor buffering and doWrite, with a socket that takes `room` bytes."""

    def __init__(self, room: int | None, error: Exception | None = None) -> None:
        self.room, self.error = room, error
        self.dataBuffer, self.offset, self._tempDataBuffer, self._tempDataLen = b"", 0, [], 0
        self.connected, self.disconnecting, self.sent, self.watched = True, False, b"", False

    def doWrite(self):
        self.dataBuffer, self.offset = self.dataBuffer[self.offset :] + b"".join(self._tempDataBuffer), 0
        self._tempDataBuffer, self._tempDataLen = [], 0
        if self.error is not None:
            return self.error
        taken = len(self.dataBuffer) if self.room is None else min(self.room, len(self.dataBuffer))
        self.sent += self.dataBuffer[:taken]
        self.offset = taken
        if self.offset == len(self.dataBuffer):
            self.dataBuffer, self.offset = b"", 0
        return None

    def startWriting(self):
        self.watched = True


@pytest.mark.parametrize(
    ("room", "error", "sent", "watched"),
    [(None, None, b"abcdef", False), (4, None, b"abcd", True), (None, ConnectionError(), b"", True)],
)
def test_a_write_through_leaves_what_the_socket_did_not_take_to_the_reactor(room, error, sent, watched):
    transport = FakeTransport(room, error)
    transport._tempDataBuffer, transport._tempDataLen = [b"abc", b"def"], 6
    _send_now(transport)
    assert transport.sent == sent and transport.watched is watched
    idle = FakeTransport(None)
    _send_now(idle)  # nothing written: nothing to do
    assert not idle.watched and idle.sent == b""


class CapturingTransport:
    def __init__(self) -> None:
        self.out = b""

    def write(self, data: bytes) -> None:
        self.out += data


def open_protocol(**options):
    """daphne's websocket protocol, open, as its factory configures it, writing to a buffer."""
    factory = WebSocketFactory(None)
    factory.setProtocolOptions(**options)
    protocol = factory.buildProtocol(None)
    for attr in protocol.CONFIG_ATTRS:  # what autobahn copies from the factory when a connection opens
        setattr(protocol, attr, getattr(factory, attr))
    protocol.transport, protocol.state = CapturingTransport(), protocol.STATE_OPEN
    protocol._perMessageCompress, protocol.send_queue, protocol.trackedTimings = None, collections.deque(), None
    protocol.trafficStats, protocol.logOctets, protocol.logFrames = TrafficStats(), False, False
    return protocol


def test_a_text_frame_is_byte_for_byte_the_frame_autobahn_writes():
    protocol = open_protocol(maxMessagePayloadSize=2**20)
    # Each length encoding (7 bits, 16 bits, 64 bits) at its edges, with multi-byte characters.
    for size in (0, 1, 125, 126, 127, 65535, 65536, 70001):
        text = "é" * (size // 2) + "a" * (size % 2)
        protocol.transport.out = b""
        protocol.sendMessage(text.encode(), False)
        assert text_frame(protocol, {"type": "websocket.send", "text": text}) == protocol.transport.out, size
    # What autobahn would do otherwise is left to it.
    assert text_frame(protocol, {"type": "websocket.send", "bytes": b"x"}) is None
    assert text_frame(protocol, {"type": "websocket.send", "text": "x" * (2**20 + 1)}) is None  # it raises
    protocol.send_queue.append((b"earlier", True))
    assert text_frame(protocol, {"type": "websocket.send", "text": "x"}) is None  # after what is queued
    assert text_frame(open_protocol(autoFragmentSize=10), {"type": "websocket.send", "text": "x" * 11}) is None
    assert text_frame(open_protocol(maskServerFrames=True), {"type": "websocket.send", "text": "x"}) is None


def request_on_a_channel():
    """A daphne request on an HTTP channel over a StringTransport, as daphne's HTTPFactory makes them."""
    from twisted.internet.testing import StringTransport

    channel = twisted.web.http.HTTPChannel()
    server = SimpleNamespace(protocol_connected=lambda request: None, protocol_disconnected=lambda request: None,
                             server_name="", log_action=lambda *args: None)  # fmt: skip
    channel.factory = SimpleNamespace(server=server, log=lambda request: None)
    transport = StringTransport()
    channel.makeConnection(transport)
    request = BodyLimitedRequest(channel)
    request.clientproto = b"HTTP/1.1"
    channel.requests.append(request)  # as the channel does once a request's line arrives
    return request, transport


def test_an_exception_after_the_response_started_cuts_the_connection_instead_of_breaking_daphne():
    assert_unchanged(WebRequest.handle_exception, "e6ae4e5c7fdbcb30", RELIED_ON_BY)
    request, transport = request_on_a_channel()
    request.handle_reply({"type": "http.response.start", "status": 200, "headers": []})
    request.handle_reply({"type": "http.response.body", "body": b"id,day\n", "more_body": True})
    # daphne's own answer is a 500 page, whose start raises here, inside its application checker (which
    # then never runs again): the reason BodyLimitedRequest answers otherwise.
    with pytest.raises(ValueError, match="already been started"):
        WebRequest.handle_exception(request, RuntimeError("a row could not be read"))
    request.handle_exception(RuntimeError("a row could not be read"))
    assert transport.disconnecting  # closed, so the client reads the response as cut
    assert transport.value().endswith(b"id,day\n\r\n")  # the part sent, and no chunked end ("0\r\n\r\n")
    before, transport = request_on_a_channel()
    before.handle_exception(RuntimeError("failed before any reply"))
    assert transport.value().startswith(b"HTTP/1.1 500 Internal Server Error\r\n")  # daphne's page, as before


class StubChannel:
    """What daphne's request reads from its HTTP channel when it is made."""

    transport = None

    def __init__(self) -> None:
        self.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda request: None))

    def getPeer(self):
        return IPv4Address("TCP", "127.0.0.1", 50000)

    getHost = getPeer


@pytest.mark.parametrize("content_type", [b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=b"])
def test_twisted_leaves_a_posted_form_to_django(content_type):
    body = b"a=1" if content_type.startswith(b"application") else (
        b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--b--\r\n')  # fmt: skip
    request = BodyLimitedRequest(StubChannel())
    request.requestHeaders.setRawHeaders(b"content-type", [content_type])
    request.gotLength(len(body))
    request.handleContentChunk(body)
    request.process = lambda: None  # daphne's hand-over to Django is not what this test is about
    request.requestReceived(b"POST", b"/api/attachments", b"HTTP/1.1")
    assert request.args == {}  # Twisted parsed nothing: Django parses the body, once
    assert request.content.read() == body


def test_twisteds_status_reasons_still_lack_the_ones_filled_in():
    assert_unchanged(twisted.web.http.Request.setResponseCode, "1f3fdd8f61d45cac", RELIED_ON_BY)  # RESPONSES
    # When Twisted's table has 429, BodyLimitedRequest.setResponseCode has nothing left to fill in for it.
    assert 429 not in twisted.web.http.RESPONSES
    assert twisted.web.http.Request(StubChannel()).code_message == b"OK"  # its default, before a code is set


@pytest.mark.parametrize("status", [s.value for s in http.HTTPStatus if s.value >= 200])
def test_every_status_goes_out_with_a_reason_phrase(status):
    request = BodyLimitedRequest(StubChannel())
    request.setResponseCode(status)
    assert request.code_message not in (b"Unknown Status", b"")
    if status not in twisted.web.http.RESPONSES:
        assert request.code_message == http.HTTPStatus(status).phrase.encode()
    request.setResponseCode(429, b"Slow Down")  # a reason given is kept
    assert request.code_message == b"Slow Down"


def test_a_429_status_line_says_too_many_requests():
    from twisted.internet.testing import StringTransport

    channel = twisted.web.http.HTTPChannel()
    channel.requestFactory = BodyLimitedRequest
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda request: None))
    transport = StringTransport()
    channel.makeConnection(transport)
    request = BodyLimitedRequest(channel)
    request.clientproto = b"HTTP/1.1"
    request.setResponseCode(429)
    request.write(b"")  # the status line and headers go out with the first write
    assert transport.value().startswith(b"HTTP/1.1 429 Too Many Requests\r\n")


# --- Twisted's transports ------------------------------------------------------------------


def test_twisteds_write_buffers_are_the_ones_read():
    assert_unchanged(abstract.FileDescriptor.__init__, "6405435a8c04d4c9", RELIED_ON_BY)
    assert_unchanged(abstract.FileDescriptor.write, "3e46c97fc173bc7e", RELIED_ON_BY)
    assert_unchanged(abstract.FileDescriptor.doWrite, "a986d7b1b1054e43", RELIED_ON_BY)
    assert_unchanged(tcp.Port.doRead, "d240fc123090ee23", RELIED_ON_BY)


class Socketless(abstract.FileDescriptor):
    """Twisted's own FileDescriptor buffering, over a socket that takes `room` bytes a write."""

    def __init__(self, room: int | None) -> None:
        super().__init__(reactor=SimpleNamespace())
        self.room, self.sent, self.watched, self.connected = room, b"", False, 1

    def writeSomeData(self, data) -> int:
        taken = len(data) if self.room is None else min(self.room, len(data))
        self.sent += bytes(data[:taken])
        return taken

    def startWriting(self) -> None:
        self.watched = True

    def stopWriting(self) -> None:
        self.watched = False


@pytest.mark.parametrize(("room", "sent", "left"), [(None, b"abcdef", 0), (4, b"abcd", 2)])
def test_a_real_transport_written_through_hands_the_socket_what_it_takes(room, sent, left):
    transport = Socketless(room)
    transport.write(b"abc")  # buffered, the reactor asked to watch
    assert buffered(transport) == 3 and transport.watched and transport.sent == b""
    transport = Socketless(room)
    with written_through(transport):
        transport.write(b"abc")
        transport.write(b"def")
        assert buffered(transport) == 6 and not transport.watched
    assert transport.sent == sent and buffered(transport) == left and transport.watched is bool(left)


def test_waiting_connections_are_accepted_from_a_real_port():
    port = tcp.Port(0, protocol.Factory.forProtocol(protocol.Protocol), interface="127.0.0.1")
    port.startListening()
    clients = [socket.create_connection(("127.0.0.1", port.getHost().port)) for _ in range(2)]
    try:
        accepted = compat.accept_waiting(port)
        assert len(accepted) == 2 and all(isinstance(p, protocol.Protocol) and p.transport for p in accepted)
        assert compat.accept_waiting(port) == []
        assert "buildProtocol" not in vars(port.factory)  # the factory's own method again
    finally:
        for client in clients:
            client.close()
        port.connectionLost(Failure(main.CONNECTION_DONE))
    assert compat.accept_waiting(SimpleNamespace()) == []  # not a listening port


class Processed(twisted.web.http.Request):
    """A request that, like daphne's WebRequest, sets application_queue once it is whole."""

    application_queue = None

    def process(self):
        self.application_queue = object()


def read(channel, client: socket.socket, data: bytes) -> None:
    """Send `data` and have the channel read all of it, as the reactor would."""
    client.sendall(data)  # on loopback, one small send arrives whole
    assert select.select([channel.transport.socket], [], [], 30)[0]
    assert channel.transport.doRead() is None  # read, not closed


def test_an_accepted_connection_awaits_its_request_until_the_request_reaches_the_application():
    factory = protocol.Factory.forProtocol(twisted.web.http.HTTPChannel)
    factory.protocol = type("Channel", (twisted.web.http.HTTPChannel,), {"requestFactory": Processed})
    port = tcp.Port(0, factory, interface="127.0.0.1")
    port.startListening()
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    try:
        (channel,) = compat.accept_waiting(port)
        assert compat.awaits_its_request(channel)  # nothing sent yet
        read(channel, client, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        assert channel.requests and compat.awaits_its_request(channel)  # begun, its body not whole
        read(channel, client, b"cd")
        assert not compat.awaits_its_request(channel)
    finally:
        client.close()
        port.connectionLost(Failure(main.CONNECTION_DONE))
    # daphne's WebRequest has no application_queue until process() sets it.
    assert "self.application_queue = None" in inspect.getsource(WebRequest.__init__)
    assert "self.application_queue = " in inspect.getsource(WebRequest.process).replace("= None", "")


# --- autobahn --------------------------------------------------------------------------------


def test_autobahns_send_and_close_are_the_ones_read():
    assert_unchanged(AutobahnProtocol.sendMessage, "048d6bcf0d712309", RELIED_ON_BY)
    assert_unchanged(AutobahnProtocol.sendCloseFrame, "a511406d6b0d711e", RELIED_ON_BY)
    assert_unchanged(AutobahnProtocol.sendClose, "6ccfd325e6272309", RELIED_ON_BY)


def test_only_the_close_frame_takes_service_restart():
    with pytest.raises(Exception, match="invalid close code 1012"):
        open_protocol().sendClose(code=1012)
    protocol = open_protocol()
    protocol.sendCloseFrame(code=1012, reasonUtf8=b"restart")
    assert protocol.transport.out == bytes((0x88, 9)) + (1012).to_bytes(2, "big") + b"restart"
