"""The client resends a request the server refused with nothing done and
"retry it" (409 store.rekeyed: a revocation moved the key epoch while the
request opened the memory), with the same Idempotency-Key, and reports the
refusal when it keeps coming. The peer is a scripted HTTP server on
loopback that answers what a Stash server answers in that race."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from stash import client

REKEYED = {
    "error": "store.rekeyed",
    "message": "A revocation changed this memory's keys while the request was "
    "being opened; nothing was done; retry it.",
}


def serve(refusals: int) -> tuple[HTTPServer, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []

    class Peer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(dict(self.headers))
            status, body = (409, REKEYED) if len(seen) <= refusals else (200, {"id": 7, "nap": None, "head": None})
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Peer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_a_rekeyed_refusal_is_resent_with_the_same_key() -> None:
    server, seen = serve(refusals=2)
    try:
        mem = client.Stash(f"http://127.0.0.1:{server.server_port}", "stash1_" + "0" * 16 + "_" + "A" * 49, pin=False)
        assert mem.note("kept").id == 7
    finally:
        server.shutdown()
    assert len(seen) == 3
    assert len({h["Idempotency-Key"] for h in seen}) == 1


def test_a_rekeyed_refusal_that_keeps_coming_is_reported() -> None:
    server, seen = serve(refusals=100)
    try:
        mem = client.Stash(f"http://127.0.0.1:{server.server_port}", "stash1_" + "0" * 16 + "_" + "A" * 49, pin=False)
        with pytest.raises(client.Conflict) as refused:
            mem.note("kept")
    finally:
        server.shutdown()
    assert refused.value.code == "store.rekeyed" and "retry it" in refused.value.message
    assert client.refused(refused.value).code == client.REFUSED
    assert len(seen) == 1 + client.BUSY_RETRIES
