"""A TCP proxy on 127.0.0.1 that a test can cut and restore, to take a shared service away from one server only."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target`; cut() drops every connection and refuses new ones until restore()."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.connections: list[socket.socket] = []
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]
        self._serve()

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        return listener

    def _serve(self) -> None:
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut or closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                self.connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """The service is gone: open connections reset, new ones refused."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            connections, self.connections = self.connections, []
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()

    def restore(self) -> None:
        """The service is back, on the same port."""
        self.listener = self._listen(self.port)
        self._serve()

    def close(self) -> None:
        self.cut()
