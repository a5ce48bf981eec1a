"""A TCP proxy on a free loopback port that a test can cut and restore: the
way to make a shared server (tests/support/seaweedfs.py) unreachable for one
client without stopping it for the others.

While cut, every open connection is reset and every new one is reset as soon
as it is accepted (the client sees "connection reset by peer", as when a
network path or a load balancer in front of a bucket goes away)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

BUFFER = 64 * 1024


def _reset(sock: socket.socket) -> None:
    """Close with an RST rather than a FIN: the peer sees the connection fail, not end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.refused = 0  # connections reset while cut
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """From now on, nothing gets through: open connections are reset too."""
        with self._lock:
            self._cut = True
            live, self._open = self._open, set()
        for sock in live:
            _reset(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open |= {client, upstream}
            ends = [2]  # directions still pumping; the last one out closes both sockets
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, ends), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, ends: list[int]) -> None:
        try:
            while chunk := src.recv(BUFFER):
                dst.sendall(chunk)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            _reset(dst)
            _reset(src)
        with self._lock:
            ends[0] -= 1
            if ends[0]:
                return
            self._open -= {src, dst}
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.close()
