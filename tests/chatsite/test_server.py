"""chatsite/server.py against the running server: backpressure, body limits, graceful SIGTERM, bind failure."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import orjson
import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from chat.models import ApiToken, Message, Usage
from tests.conftest import MODELS, session_cookie
from tests.live import ROOT, LiveServer, database_url, wait_until
from tests.services import postgres_database, redis_prefix

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
CRASH_SIGNS = ("Segmentation fault", "Fatal Python error", "Task was destroyed but it is pending", "Traceback")


def live(**env: str) -> LiveServer:
    # Long fake answers need a max_tokens above the default limit.
    return LiveServer({"DATABASE_URL": database_url(connection.settings_dict), "MAX_TOKENS_LIMIT": "1000000", **env})


def rss(pid: int) -> int:
    """The resident memory of a process, bytes (from /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def api_request(token: str, content: str, **extra) -> dict:
    return {"model": I14, "messages": [{"role": "user", "content": content}], "stream": True,
            "max_tokens": 1_000_000, **extra}  # fmt: skip


def data_events(body: bytes) -> list[bytes]:
    return [block for block in body.split(b"\n\n") if block.startswith(b"data:")]


async def open_tab(session: aiohttp.ClientSession, server: LiveServer, user) -> aiohttp.ClientWebSocketResponse:
    cookie = await sync_to_async(session_cookie)(user)
    headers = {"Origin": server.url, "Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"}
    return await session.ws_connect(server.url.replace("http", "ws") + "/ws/chat/", headers=headers)


async def frames_until(ws, frame_type: str, frames: list[dict] | None = None, timeout: float = 30) -> list[dict]:
    frames = [] if frames is None else frames
    while not frames or frames[-1]["type"] != frame_type:
        message = await ws.receive(timeout=timeout)
        assert message.type == aiohttp.WSMsgType.TEXT, f"socket ended before `{frame_type}`: {message}"
        frames.append(orjson.loads(message.data))
    return frames


async def v1_stream(session, server, token, content) -> aiohttp.ClientResponse:
    response = await session.post(server.url + "/v1/chat/completions", json=api_request(token, content),
                                  headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert response.status == 200
    return response


async def read_events(response, count: int) -> bytes:
    """Read a streaming body until it holds `count` data events."""
    received = b""
    while len(data_events(received)) < count:
        received += await response.content.readany()
    return received


# --- graceful shutdown ------------------------------------------------------------------


async def test_sigterm_ends_streams_left_after_the_grace_and_exits_cleanly(alice, providers, fake):
    token = (await sync_to_async(ApiToken.issue)(alice, "tests"))[1]
    server = live(SHUTDOWN_GRACE_SECONDS="1")
    await sync_to_async(server.start)()
    slow = "[[delay:20]] [[chunks:3000]]"
    try:
        async with aiohttp.ClientSession() as session:
            tab = await open_tab(session, server, alice)
            await tab.send_str(orjson.dumps({"type": "send", "conversation": None, "content": slow,
                                             "model": "claude-sonnet-5"}).decode())  # fmt: skip
            frames = await frames_until(tab, "delta")
            response = await v1_stream(session, server, token, slow)
            before = await read_events(response, 3)
            stopped_at = time.monotonic()
            server.process.terminate()
            after = before + await response.content.read()
            await frames_until(tab, "done", frames)
            closing = await tab.receive(timeout=10)
            exit_code = await sync_to_async(server.process.wait)(30)
        output = server.output()
    finally:
        await sync_to_async(server.stop)()
    assert exit_code == 0, output
    assert not any(sign in output for sign in CRASH_SIGNS), output
    # The streams went on through the grace, then ended with an error event and [DONE].
    events = data_events(after)
    assert len(events) > len(data_events(before)) + 10
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2][len(b"data: ") :])["error"]
    assert error["code"] == "server_shutdown" and "server stopped" in error["message"]
    assert frames[-1]["status"] == "interrupted" and "server stopped" in frames[-1]["error"]
    assert time.monotonic() - stopped_at >= 1  # through the grace: a lower bound, which load only lengthens
    assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1012, (closing, tab.close_code, output)
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.status == "interrupted" and reply.content
    usages = [usage async for usage in Usage.objects.order_by("source")]
    assert [(u.source, u.status) for u in usages] == [("api", "interrupted"), ("chat", "interrupted")]
    assert all(u.ended is not None and u.completion_tokens > 0 for u in usages)


async def test_sigterm_lets_streams_finish_inside_the_grace_and_refuses_new_connections(alice, providers, fake):
    token = (await sync_to_async(ApiToken.issue)(alice, "tests"))[1]
    server = live(SHUTDOWN_GRACE_SECONDS="60")
    await sync_to_async(server.start)()
    server.sock.close()  # the server's copy of the listening socket is then the only one
    short = "[[delay:20]] [[chunks:80]]"
    try:
        async with aiohttp.ClientSession() as session:
            tab = await open_tab(session, server, alice)
            await tab.send_str(orjson.dumps({"type": "send", "conversation": None, "content": short,
                                             "model": "claude-sonnet-5"}).decode())  # fmt: skip
            frames = await frames_until(tab, "delta")
            response = await v1_stream(session, server, token, short)
            await read_events(response, 3)
            stopped_at = time.monotonic()
            server.process.terminate()
            # Stopped listening at once; a refused connection shows it.
            refused = False
            while not refused and server.process.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
                    await asyncio.sleep(0.05)
                except ConnectionRefusedError:
                    refused = True
            body = await response.content.read()
            await frames_until(tab, "done", frames)
            exit_code = await sync_to_async(server.process.wait)(30)
            took = time.monotonic() - stopped_at
        output = server.output()
    finally:
        await sync_to_async(server.stop)()
    assert refused and exit_code == 0, output
    # The streams end about 2 s after the signal; the grace is 60 s: a bound far from both.
    assert took < 30, "the server waited for the whole grace though its streams had finished"
    assert not any(sign in output for sign in CRASH_SIGNS), output
    assert data_events(body)[-1] == b"data: [DONE]" and b"error" not in body
    assert frames[-1]["status"] == "complete"
    usages = [usage async for usage in Usage.objects.order_by("source")]
    assert [(u.source, u.status) for u in usages] == [("api", "complete"), ("chat", "complete")]


def test_a_second_sigterm_ends_the_streams_without_waiting_for_the_grace(alice, providers, fake):
    token = ApiToken.issue(alice, "tests")[1]
    body = api_request(token, "[[delay:20]] [[chunks:3000]]")
    with live(SHUTDOWN_GRACE_SECONDS="600") as server:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {token}"}, timeout=30) as response:  # fmt: skip
            lines = response.iter_lines()
            while "content" not in next(lines):
                pass
            server.process.terminate()
            deadline = time.monotonic() + 30
            while "stopping: no new connections" not in server.output() and time.monotonic() < deadline:
                time.sleep(0.05)  # the log line is the only sign that the first signal was handled
            server.process.terminate()
            rest = [line for line in lines if line.startswith("data:")]
        exit_code = server.process.wait(30)
        output = server.output()
    assert exit_code == 0 and "stop signal again" in output, output
    assert rest[-1] == "data: [DONE]" and orjson.loads(rest[-2][len("data: ") :])["error"]["code"] == "server_shutdown"
    assert Usage.objects.get().status == "interrupted"


def test_a_port_already_taken_ends_the_server_with_an_error(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3", "DEMO_UPSTREAM": "0"}
    try:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "chatsite.server", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        taken.close()
    assert result.returncode != 0
    assert "Address already in use" in result.stderr + result.stdout
    assert time.monotonic() - started < 30  # it gives up (~2 s to start and fail), it does not retry the port


def listen_backlog(port: int) -> int | None:
    """The backlog of the socket listening on this port (ss's Send-Q for a listener), None if none listens."""
    lines = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(lines.split()[2]) if lines.strip() else None


def test_a_port_the_server_opens_holds_a_bursts_connections(tmp_path):
    # Twisted listens with a backlog of 50: a burst's 51st connection waited a second for its SYN to be sent again.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3", "DEMO_UPSTREAM": "0"}
    command = [sys.executable, "-m", "chatsite.server", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: listen_backlog(port) is not None or process.poll() is not None, 60)
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert listen_backlog(port) == min(settings.LISTEN_BACKLOG, somaxconn) > 50
    finally:
        process.terminate()
        process.wait(30)


def test_every_request_has_one_access_line(server):
    """Twisted's own access line is no longer built (chatsite/server.py); the access log has one line a request."""
    path = f"/no-such-page-{os.getpid()}-{time.monotonic_ns()}"
    assert httpx.get(server.url + path).status_code == 404
    assert wait_until(lambda: path in server.output())
    lines = [line for line in server.output().splitlines() if path in line]
    assert len([line for line in lines if "chatsite.access" in line and f"GET {path} 404" in line]) == 1, lines


# --- request bodies ---------------------------------------------------------------------


def read_answer(sock: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return received


@pytest.fixture(scope="module")
def small_bodies(django_db_setup, django_db_blocker):
    with live(REQUEST_MAX_BYTES="100000", API_MAX_BODY_BYTES="100000") as server:  # the path below has the second
        yield server


@pytest.mark.parametrize("length, sent", [(300_000_000, 0), (100_001, 100_001)])
def test_a_body_declared_too_large_is_refused_before_it_is_read(small_bodies, length, sent):
    with socket.create_connection(("127.0.0.1", small_bodies.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (length, b"x" * sent))  # fmt: skip
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"larger than 100000 bytes" in answer


def test_a_body_too_large_for_expect_continue_gets_only_the_413(small_bodies):
    with socket.create_connection(("127.0.0.1", small_bodies.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                     b"Content-Length: 300000000\r\n\r\n")  # fmt: skip
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in answer


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(small_bodies):
    rss_before = rss(small_bodies.process.pid)
    chunk = b"x" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", small_bodies.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while sent < 300_000_000:
                sock.sendall(b"10000\r\n" + chunk + b"\r\n")
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        answer = read_answer(sock)
    # The server stopped reading right after the limit: what went out fits the sockets' buffers.
    assert sent < 50_000_000
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413 ")
    assert rss(small_bodies.process.pid) - rss_before < 30_000_000
    assert "refused a request body over 100000 bytes" in small_bodies.output()


# --- slow readers -----------------------------------------------------------------------


def wait_for_usage(timeout: float = 120) -> Usage:
    deadline = time.monotonic() + timeout
    while (usage := Usage.objects.filter(ended__isnull=False).first()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert usage is not None, "no usage row written"
    return usage


def slow_reader(server, token: str, body: bytes, path: str = "/v1/chat/completions") -> socket.socket:
    """A raw `/v1` request from a client with a 4 KiB receive buffer: it takes (almost) nothing unless it reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" % path.encode()
    head += b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (token.encode(), len(body))
    sock.sendall(head + body)
    return sock


def test_a_v1_client_that_reads_nothing_holds_the_upstream_back_and_is_cut_off(alice, providers, fake):
    token = ApiToken.issue(alice, "tests")[1]
    # About 90 MB: half of it is more than the kernel can hold between the upstream and the server (the
    # upstream's send buffer and the server's receive buffer at their largest, 4 + 32 MiB here), so the
    # upstream writing over half means the server read on for a client that took nothing.
    chunks = 400_000
    with live(API_SLOW_CLIENT_SECONDS="2") as server:
        baseline = rss(server.process.pid)
        body = orjson.dumps(api_request(token, f"[[chunks:{chunks}]]"))
        sock = slow_reader(server, token, body)
        peak = baseline
        deadline = time.monotonic() + 60
        while not Usage.objects.filter(ended__isnull=False).exists() and time.monotonic() < deadline:
            peak = max(peak, rss(server.process.pid))
            time.sleep(0.1)
        usage = wait_for_usage()
        sock.close()
        output = server.output()
    record = fake.app.last()
    assert record.disconnected.wait(5), "the upstream stream was left open"
    # The upstream was read only as fast as the client took it: most of the answer was never asked for.
    assert len(record.sent) < chunks // 2
    assert peak - baseline < 40_000_000
    assert usage.status == "stopped" and usage.completion_tokens > 0
    assert usage.error == "the client did not read the stream for 2 s and was disconnected"
    assert "the client read nothing for 2 s" in output


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_v1_client_cut_off_after_the_upstream_finished_is_billed_as_the_upstream_reported(
    alice, providers, fake, path
):
    """The answer was whole upstream, held back only by the client: the cut reads the rest for its usage."""
    token = ApiToken.issue(alice, "tests")[1]
    # 400 events, few enough for the cut's drain (DRAIN_SECONDS) to read them all on a busy machine,
    # and half as big again as the largest send buffer the kernel may give the server's socket
    # (tcp_wmem's maximum, 4 MiB here): were the whole answer to fit, it would end `complete`.
    size = max(8000, largest_send_buffer() * 3 // 2 // 400)
    prompt = f"[[chunks:400]] [[size:{size}]]"
    with live(API_SLOW_CLIENT_SECONDS="2", CHAT_MAX_REPLY_BYTES="20000000") as server:
        request = api_request(token, prompt)
        if path == "/v1/responses":
            request = {"model": I14, "input": prompt, "stream": True, "max_output_tokens": 1_000_000}
        sock = slow_reader(server, token, orjson.dumps(request), path)
        assert wait_until(lambda: fake.app.streams, 30)
        record = fake.app.last()
        assert record.completed.wait(60) and record.finish_reason == "stop", "the upstream did not finish"
        usage = wait_for_usage()
        sock.close()
    assert usage.status == "stopped" and "did not read the stream for 2 s" in usage.error
    reported = [orjson.loads(event[6:])["usage"] for event in record.sent if b'"usage"' in event]
    assert not usage.estimated and usage.completion_tokens == reported[-1]["completion_tokens"]


def largest_send_buffer() -> int:
    """The most a TCP socket's send buffer grows to on this machine (Linux's tcp_wmem)."""
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


def test_a_v1_client_that_reads_slowly_but_steadily_is_kept_and_billed_as_reported(alice, providers, fake):
    """Reading is judged, not speed: a client taking a little every half second outlives the limit many times."""
    token = ApiToken.issue(alice, "tests")[1]
    with live(API_SLOW_CLIENT_SECONDS="2") as server:
        body = orjson.dumps(api_request(token, "[[chunks:30000]]", stream_options={"include_usage": True}))
        sock = slow_reader(server, token, body)
        sock.settimeout(30)
        received = b""
        # 4 KiB every half second for 12 s: six times the limit of 2 s, far slower than the stream.
        for _ in range(24):
            try:
                received += sock.recv(4096)
            except OSError:
                raise AssertionError(server.output()[-3000:]) from None
            time.sleep(0.5)
        ended = Usage.objects.filter(ended__isnull=False).values_list("status", "error", "completion_tokens")
        assert not ended, (ended, len(received))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # now the rest, fast
        while b"data: [DONE]" not in received[-64:]:
            chunk = sock.recv(65536)
            assert chunk, "the stream was cut"
            received += chunk
        sock.close()
        usage = wait_for_usage()
        output = server.output()
    assert b"data: [DONE]" in received and "read nothing" not in output
    # Billed as the upstream reported it: the stream ended upstream, not estimated.
    assert usage.status == "complete" and not usage.estimated
    chunks = [orjson.loads(event[6:]) for event in data_events(received) if b'"usage"' in event]
    reported = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert usage.completion_tokens == reported[-1]["completion_tokens"]


def test_an_estimate_never_passes_the_requests_cap():
    from chat.streaming.upstream.state import StreamState

    state = StreamState(started_at=0.0, completion_cap=100)
    state.content.append("x" * 10_000)  # about 2,500 tokens by characters, over the cap of 100
    usage = state.metering(0, 1.0)
    assert usage["estimated"] and usage["completion_tokens"] == 100
    state.usage = {"prompt_tokens": 1, "completion_tokens": 120, "total_tokens": 121}
    assert state.metering(0, 1.0)["completion_tokens"] == 120  # a reported figure is the upstream's own


def raw_websocket(server: LiveServer, user) -> socket.socket:
    """A websocket opened by hand, so that the test decides when (not) to read it."""
    cookie = session_cookie(user)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.settimeout(10)
    key = base64.b64encode(os.urandom(16))
    cookie_header = f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()
    sock.sendall(b"GET /ws/chat/ HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nOrigin: %s\r\nCookie: %s\r\n\r\n"
                 % (server.port, key, server.url.encode(), cookie_header))  # fmt: skip
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def send_text(sock: socket.socket, payload: dict) -> None:
    data = orjson.dumps(payload)
    mask = os.urandom(4)
    assert len(data) < 126
    sock.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def receive_text(sock: socket.socket) -> dict:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            data += sock.recv(n - len(data))
        return data

    first, length = exactly(2)
    assert first == 0x81, first
    if length == 126:
        length = int.from_bytes(exactly(2), "big")
    elif length == 127:
        length = int.from_bytes(exactly(8), "big")
    return orjson.loads(exactly(length))


def closed_by_server(sock: socket.socket) -> bool:
    """Read what is left; whether the server ended the connection (rather than the read timing out)."""
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


async def test_a_websocket_that_reads_nothing_is_closed_and_the_stream_goes_on(alice, providers, fake):
    server = live(CHAT_SLOW_CLIENT_SECONDS="1")
    await sync_to_async(server.start)()
    # About 1 MB over 4 s: the socket that reads nothing stays behind for longer than its 1 s.
    chunks, size = 1_000, 1_000
    slow = None
    try:
        slow = await sync_to_async(raw_websocket)(server, alice)
        send_text(slow, {"type": "send", "content": f"[[chunks:{chunks}]][[size:{size}]][[delay:4]]",
                         "model": "claude-sonnet-5", "params": {"max_tokens": 1_000_000}})  # fmt: skip
        started = await sync_to_async(receive_text)(slow)
        assert started["type"] == "started"
        # From here on the first tab reads nothing; a second one watches the same stream.
        async with aiohttp.ClientSession() as session:
            tab = await open_tab(session, server, alice)
            await tab.send_str(orjson.dumps({"type": "attach", "conversation": started["conversation"]}).decode())
            frames = await frames_until(tab, "done", timeout=120)
        ended = await sync_to_async(closed_by_server)(slow)
        output = server.output()
    finally:
        if slow is not None:
            slow.close()
        await sync_to_async(server.stop)()
    assert frames[-1]["status"] == "complete"
    reply = await Message.objects.aget(pk=started["message"])
    assert reply.status == "complete" and len(reply.content) >= chunks * size
    assert "closed a websocket to" in output
    assert ended, "the socket that read nothing was never closed"


# --- graceful shutdown beside another process (PostgreSQL + Redis) ---------------------------


@pytest.mark.cluster
def test_sigterm_in_the_multi_process_setup_ends_the_stream_for_watchers_on_the_other_process(fake_server):
    from tests.cluster.test_scaleout import _cluster

    with postgres_database("chat_flow_sigterm", migrated=True) as db_url, redis_prefix("chat_flow_sigterm") as prefix:
        pair = _cluster(fake_server, db_url, prefix, SHUTDOWN_GRACE_SECONDS="1", MAX_TOKENS_LIMIT="1000000")
        first, second = next(pair)
        try:
            frames, streamed_on, exit_code, output = asyncio.run(stop_the_owner_while_the_other_watches(first, second))
        finally:
            next(pair, None)
        with psycopg.connect(db_url) as db:
            status, content = db.execute(
                "SELECT status, content FROM chat_message WHERE id = %s", [frames[0]["message"]]
            ).fetchone()
            (usage_status,) = db.execute("SELECT status FROM chat_usage WHERE message_id = %s",
                                         [frames[0]["message"]]).fetchone()  # fmt: skip
    assert exit_code == 0 and not any(sign in output for sign in CRASH_SIGNS), output
    done = frames[-1]
    # A lower bound, which load only lengthens: the stream went on through the 1 s grace.
    assert streamed_on >= 1, "the stream was ended before the grace was over"
    assert done["type"] == "done" and done["status"] == "interrupted" and "server stopped" in done["error"]
    assert status == usage_status == "interrupted"
    # What the watcher got after its snapshot is part of the saved text. (Not exactly snapshot +
    # deltas: on Redis a snapshot can race a delta, and the last delta was once seen missing before
    # `done`; both are generation.py's, reported separately.)
    live_text = "".join(f.get("content", "") for f in frames if f["type"] == "delta")
    assert live_text and live_text in content


async def stop_the_owner_while_the_other_watches(first, second):
    from tests.cluster.test_scaleout import sign_in
    from tests.live import Tab

    cookie = await asyncio.to_thread(sign_in, first)
    async with Tab(first, cookie) as tab, Tab(second, cookie) as other:
        await tab.send(type="send", conversation=None, content="[[delay:20]] [[chunks:3000]]")
        started = (await tab.until("delta"))[0]
        await other.send(type="attach", conversation=started["conversation"])
        frames = [started] + await other.until("snapshot")
        first.process.terminate()
        stopped_at = time.monotonic()
        frames += await other.until("done")
        streamed_on = time.monotonic() - stopped_at
        exit_code = await asyncio.to_thread(first.process.wait, 30)
    return frames, streamed_on, exit_code, first.output()


# --- garbage collection -----------------------------------------------------------------


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen():
    import gc

    yield gc
    gc.unfreeze()  # this test process's objects go back to being collected


def test_start_up_is_frozen_out_of_garbage_collection_but_its_garbage_is_collected_first(unfrozen):
    import weakref

    from chatsite.server import freeze_start_up

    gc = unfrozen
    gc.unfreeze()
    garbage = Cycle()
    gone = weakref.ref(garbage)
    gc.collect()  # survived: in the oldest generation, which only a full collection sweeps
    del garbage  # unreachable, but only the collector frees a cycle
    assert gone() is not None
    freeze_start_up()
    assert gone() is None  # collected, not frozen
    assert gc.get_freeze_count() > 10_000  # Django, the apps and the views' modules


def test_the_server_freezes_start_up_before_it_listens(unfrozen, monkeypatch):
    from daphne.server import Server
    from twisted.internet import reactor

    from chatsite.server import ChatServer

    frozen_when_serving = []
    monkeypatch.setattr(Server, "run", lambda self: frozen_when_serving.append(unfrozen.get_freeze_count()))
    monkeypatch.setattr(reactor, "callWhenRunning", lambda *args: None)
    unfrozen.unfreeze()
    # Server.run is stubbed: it never listens.
    ChatServer(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"]).run()
    assert frozen_when_serving and frozen_when_serving[0] > 10_000
