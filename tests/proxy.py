"""A TCP proxy the tests can cut and restore: an outage of a shared service without touching the service."""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from urllib.parse import urlsplit


class TcpProxy:
    """127.0.0.1:<free port> -> target, in a thread; cut() drops every connection and refuses new ones."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._lock = threading.Lock()
        self._listen()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(256)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener

    def cut(self) -> None:
        """The service goes away: open connections are reset, new ones refused."""
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            for pair in self._pairs:
                for sock in pair:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
                    sock.close()
            self._pairs.clear()
        self._wake_w.send(b"x")

    def restore(self) -> None:
        """The service is back on the same port."""
        with self._lock:
            self._listen()
        self._wake_w.send(b"x")

    def close(self) -> None:
        self._stopped = True
        self.cut()
        self._thread.join(5)
        self._wake_r.close()
        self._wake_w.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        watched: set[socket.socket] = set()
        while not self._stopped:
            with self._lock:
                wanted = {sock for pair in self._pairs for sock in pair}
                if self._listener is not None:
                    wanted.add(self._listener)
                for sock in watched - wanted:
                    selector.unregister(sock)
                for sock in wanted - watched:
                    selector.register(sock, selectors.EVENT_READ)
                watched = wanted
                peers = {}
                for a, b in self._pairs:
                    peers[a], peers[b] = b, a
            for key, _ in selector.select(1.0):
                sock = key.fileobj
                if sock is self._wake_r:
                    sock.recv(1024)
                elif sock is self._listener:
                    self._accept()
                elif sock in peers:
                    self._relay(sock, peers[sock])
        selector.close()

    def _accept(self) -> None:
        with self._lock:
            if self._listener is None:
                return
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        client.setblocking(True)
        with self._lock:
            self._pairs.add((client, upstream))

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            data = source.recv(65536)
            if data:
                sink.sendall(data)
                return
        except OSError:
            pass
        with self._lock:
            for pair in list(self._pairs):
                if source in pair:
                    self._pairs.discard(pair)
                    for sock in pair:
                        sock.close()


def via(proxy: TcpProxy, url: str) -> str:
    """The URL with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    netloc[-1] = f"127.0.0.1:{proxy.port}"
    return parts._replace(netloc="@".join(netloc)).geturl()


def proxy_for(url: str) -> TcpProxy:
    """A proxy in front of the service at `url` (its host and port)."""
    parts = urlsplit(url)
    return TcpProxy(parts.hostname, parts.port)
