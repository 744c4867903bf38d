"""Serve an ASGI app with uvicorn on a real socket, in a background thread, for tests."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn

__all__ = ["FakeServer"]


class _Server(uvicorn.Server):
    """A uvicorn server that signals a threading.Event once it accepts connections."""

    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self._ready.set()


class FakeServer:
    """Serve an ASGI app with uvicorn on 127.0.0.1:<free port> in a background thread.

    Usage::

        with FakeServer(app) as server:
            httpx.get(server.url + "/i14/v1/models")
    """

    def __init__(self, app: Any, *, start_timeout: float = 10.0, **config: Any) -> None:
        self.app = app
        self.url = ""
        self.port = 0
        self.start_timeout = start_timeout
        self._config_overrides = config
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()

    def start(self) -> str:
        if self._thread is not None:
            return self.url
        # Bind the socket ourselves (port 0) so the port is known and there is no race.
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto is IPPROTO_TCP, and without it Nagle + delayed ACK add ~40 ms to every response.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        sock.set_inheritable(True)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

        options: dict[str, Any] = {
            "lifespan": "off",
            "log_level": "warning",
            "log_config": None,  # leave logging to pytest / the caller
            "timeout_graceful_shutdown": 1,
            "access_log": False,
        }
        options.update(self._config_overrides)
        self._ready = ready = threading.Event()
        self._server = _Server(uvicorn.Config(self.app, **options), ready)
        self._thread = threading.Thread(target=self._run, name=f"FakeServer:{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(self.start_timeout) or not self._server.started:
            self.stop()
            raise RuntimeError(f"uvicorn did not start on {self.url}") from self._error
        return self.url

    def _run(self) -> None:
        assert self._server is not None and self._sock is not None
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            self._ready.set()  # never leave start() waiting on a server that died

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(5)
            if thread.is_alive():
                server.force_exit = True
                thread.join(5)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> FakeServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
