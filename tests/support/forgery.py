"""What a hostile client sends before it can authenticate: tokens with a
valid checksum and a made-up secret, and a forged ``POST /import`` flood
sent over a raw socket. Shared by the pre-auth tests and bench/hostile.py."""

from __future__ import annotations

import os
import socket
import time
import zlib
from pathlib import Path

B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def with_checksum(body: str) -> str:
    """docs/DESIGN.md, "Tokens": the last 6 characters are the base62 CRC32 of what precedes them."""
    n = zlib.crc32(body.encode())
    digits = ""
    for _ in range(6):
        n, r = divmod(n, 62)
        digits = B62[r] + digits
    return body + digits


def random_secret_digits() -> str:
    # 43 base62 digits hold more than 256 bits; a small first digit keeps it a valid secret.
    return "1" + "".join(B62[b % 62] for b in os.urandom(42))


MIB = 1 << 20
FLOOD = 16
FLOOD_BODY = 15 * MIB
CHUNK = 64 * 1024
FLOOD_DEADLINE = 60.0  # seconds for the whole flood


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def forged_for(token: str) -> str:
    return with_checksum(token[:24] + random_secret_digits())


def forged_import(port: int, token: str, results: list, deadline: float) -> None:
    """One forged POST /import of FLOOD_BODY bytes, sent as fast as the
    server takes it; records the status line's code (or the error)."""
    head = (
        f"POST /import HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {forged_for(token)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {FLOOD_BODY}\r\n\r\n"
    ).encode()
    chunk = b'{"entries": [' + b" " * (CHUNK - 13)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        sent = 0
        try:
            while sent < FLOOD_BODY and time.monotonic() < deadline:
                n = min(CHUNK, FLOOD_BODY - sent)
                s.sendall(chunk[:n])
                sent += n
        except OSError:
            pass  # the server answered and closed the connection: what it should do
        try:
            answer = s.recv(4096)
        except OSError as exc:
            results.append(f"error {type(exc).__name__}")
            return
    results.append(answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else "no answer")
