"""The real server for tests: daphne in a subprocess, on a socket bound here, sharing the test database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
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
            "PORT": str(self.port),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.log = tempfile.NamedTemporaryFile(prefix="daphne-", suffix=".log", delete=False)
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> str:
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

    def restart(self, timeout: float = 30) -> None:
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


class Tab:
    """A browser tab's websocket to a running server."""

    def __init__(self, server, user) -> None:
        self.server, self.user = server, user

    async def __aenter__(self):
        from tests.conftest import session_cookie

        cookie = await sync_to_async(session_cookie)(self.user)
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

    async def receive(self, timeout: float = 20) -> dict:
        message = await self.ws.receive(timeout=timeout)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        return orjson.loads(message.data)

    async def until(self, frame_type: str, timeout: float = 20) -> list[dict]:
        frames = []
        while not frames or frames[-1]["type"] != frame_type:
            frames.append(await self.receive(timeout))
        return frames
