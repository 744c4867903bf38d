"""The real server for tests: daphne in a subprocess, on a socket bound here, sharing the test database."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson
from asgiref.sync import sync_to_async

ROOT = Path(__file__).resolve().parent.parent


def database_url(settings_dict: dict) -> str:
    """The URL of the (test) database the pytest process uses, for the server to share."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    at = "@" if user else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgres://{user}{password}{at}{host}{port}/{settings_dict['NAME']}"


class LiveServer:
    """`python -m chatsite.server chatsite.asgi:application` on 127.0.0.1:<free port>, logs kept for assertions."""

    def __init__(self, env: dict[str, str]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DEMO_UPSTREAM": "0",
            # No model-written titles: one more upstream request and usage row after a first answer,
            # which the tests do not expect (tests/actions/test_titles.py turns them on in-process).
            "CHAT_TITLES": "0",
            # Access rules and providers read on every start: tests change them from their own process, which
            # cannot tell a server without Redis (tests/runtime/test_kept_reads.py keeps them, as servers do).
            "ACCESS_CACHE_SECONDS": "0",
            "PORT": str(self.port),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.log = tempfile.NamedTemporaryFile(prefix="daphne-", suffix=".log", delete=False)
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> str:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "chatsite.server", "--fd", str(self.sock.fileno()), "chatsite.asgi:application"],
            cwd=ROOT,
            env=self.env,
            pass_fds=[self.sock.fileno()],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        # The socket already listens, so this request waits in its backlog until daphne
        # accepts it: an answer means the server is up, with no polling.
        try:
            httpx.get(self.url + "/admin/login/", timeout=timeout)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"daphne did not answer ({exc!r}):\n{self.output()}") from None
        return self.url

    def restart(self, timeout: float = 60) -> None:
        """Kill the server process and start a new one on the same socket (a crash and a restart)."""
        self.process.kill()
        self.process.wait()
        self.start(timeout)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.sock.close()
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self) -> LiveServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def wait_until(predicate, timeout: float = 30) -> bool:
    """Poll `predicate` until true (False after `timeout`): for what the server writes as a stream
    unwinds, just after its client left, where no event tells the test it happened."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Tab:
    """A browser tab's websocket to a running server, signed in as `who`: a user, or a session cookie."""

    def __init__(self, server, who) -> None:
        self.server, self.who = server, who

    async def __aenter__(self):
        from tests.conftest import session_cookie

        cookie = self.who if isinstance(self.who, str) else await sync_to_async(session_cookie)(self.who)
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(
            self.server.url.replace("http", "ws") + "/ws/chat/",
            headers={"Origin": self.server.url, "Cookie": f"sessionid={cookie}"},
        )
        return self

    async def __aexit__(self, *exc_info):
        await self.ws.close()
        await self.session.close()

    async def send(self, **frame):
        await self.ws.send_str(orjson.dumps(frame).decode())

    async def frame(self, timeout: float = 20) -> dict:
        """The next frame, with `at`: when it arrived (time.monotonic())."""
        received = await self.ws.receive(timeout=timeout)
        assert received.type == aiohttp.WSMsgType.TEXT, f"socket closed: {received}\n{self.server.output()[-4000:]}"
        frame = orjson.loads(received.data)
        frame["at"] = time.monotonic()
        return frame

    receive = frame

    async def until(self, frame_type: str, timeout: float = 20) -> list[dict]:
        """Frames up to the first of `frame_type`; an unexpected `error` frame fails."""
        frames = []
        while not frames or frames[-1]["type"] != frame_type:
            frames.append(await self.frame(timeout))
            assert frames[-1]["type"] != "error" or frame_type == "error", frames[-1]
        return frames

    async def silent_for(self, seconds: float) -> None:
        """Nothing arrives for that long, and the socket stays open (daphne's pings are answered meanwhile)."""
        # Not ws.receive(timeout=...): aiohttp restarts that timeout after each ping it answers.
        try:
            async with asyncio.timeout(seconds):
                received = await self.ws.receive()
                raise AssertionError(f"expected silence, got {received}")
        except TimeoutError:
            pass
        assert not self.ws.closed

    async def closed(self, timeout: float = 5) -> int | None:
        """Drop frames until the server closes the socket; its close code."""
        while True:
            message = await self.ws.receive(timeout=timeout)
            if message.type == aiohttp.WSMsgType.CLOSE:
                # The server's code as sent: aiohttp's close_code turns 1006 when its answering
                # close frame finds the server already gone.
                return message.data
            if message.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                return self.ws.close_code

    async def still_open(self) -> bool:
        await self.send(type="attach", conversation=999_999_999)
        return (await self.until("error"))[-1]["code"] == "not_found"
