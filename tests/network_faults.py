"""Servers that fail as real ones do, for the tests of bounded network calls.

- `SilentServer`: a TCP listener on 127.0.0.1 that accepts every connection and never sends a byte (a hung
  server, a proxy whose backend is gone, a PostgreSQL that never finishes its start-up). Every accepted socket is
  held open until the server stops, so the client sees an established connection that never answers.
- `closed_port()`: a port on 127.0.0.1 nobody listens on (connection refused at once).

    with SilentServer() as silent:
        url = f"http://user:pw@127.0.0.1:{silent.port}"
"""

from __future__ import annotations

import socket
import threading

from tests.mlflow_server import free_port


class SilentServer:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the listener was closed: stop
                return
            self.accepted += 1
            self._held.append(conn)  # held open, never read from or written to

    def __enter__(self) -> "SilentServer":
        self._sock.listen(128)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()


def closed_port() -> int:
    """A free port: nothing listens there (free_port binds it briefly and lets it go)."""
    return free_port()
