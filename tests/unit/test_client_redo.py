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


class Seen(dict[str, str]):
    """One request the peer took: its headers, and its method and path."""

    method: str
    path: str


def serve(
    refusals: int, refusal: tuple[int, dict[str, str]], answer: dict[str, object]
) -> tuple[HTTPServer, list[Seen]]:
    """A scripted peer: ``refusal`` (status, body) for the first ``refusals``
    requests, with ``Retry-After: 0`` on a 503, then 200 ``answer``."""
    seen: list[Seen] = []

    class Peer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            if "Content-Length" in self.headers:
                self.rfile.read(int(self.headers["Content-Length"]))
            one = Seen(self.headers)
            one.method, one.path = self.command, self.path
            seen.append(one)
            status, body = refusal if len(seen) <= refusals else (200, answer)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 503:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Peer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def serve_rekeyed(refusals: int) -> tuple[HTTPServer, list[Seen]]:
    """A host whose key epoch moved under the request: 409 store.rekeyed, then the note's answer."""
    return serve(refusals, (409, REKEYED), {"id": 7, "nap": None, "head": None})


def test_a_rekeyed_refusal_is_resent_with_the_same_key() -> None:
    server, seen = serve_rekeyed(refusals=2)
    try:
        mem = client.Stash(f"http://127.0.0.1:{server.server_port}", "stash1_" + "0" * 16 + "_" + "A" * 49, pin=False)
        assert mem.note("kept").id == 7
    finally:
        server.shutdown()
    assert len(seen) == 3
    assert len({h["Idempotency-Key"] for h in seen}) == 1


def test_a_rekeyed_refusal_that_keeps_coming_is_reported() -> None:
    server, seen = serve_rekeyed(refusals=100)
    try:
        mem = client.Stash(f"http://127.0.0.1:{server.server_port}", "stash1_" + "0" * 16 + "_" + "A" * 49, pin=False)
        with pytest.raises(client.Conflict) as refused:
            mem.note("kept")
    finally:
        server.shutdown()
    assert refused.value.code == "store.rekeyed" and "retry it" in refused.value.message
    assert client.refused(refused.value).code == client.REFUSED
    assert len(seen) == 1 + client.BUSY_RETRIES


MOVING = {
    "error": "fleet.moving",
    "message": "This user's shard is moving to another host of the fleet; nothing was done.",
}


def serve_moving(refusals: int) -> tuple[HTTPServer, list[Seen]]:
    """A host whose shard is moving: 503 fleet.moving with Retry-After 0 for the first ``refusals`` requests."""
    return serve(refusals, (503, MOVING), {"WAKE_LINES": 50})


def test_a_read_refused_while_its_shard_moves_is_sent_again_as_the_host_says() -> None:
    """A read is no keyed write, yet a shard's move (nothing done, Retry-After) is waited out, more
    times than a busy slot is, since a move takes seconds."""
    server, seen = serve_moving(refusals=client.BUSY_RETRIES + 2)
    try:
        mem = client.Stash(f"http://127.0.0.1:{server.server_port}", "stash1_" + "0" * 16 + "_" + "A" * 49, pin=False)
        assert mem.request("GET", "/config") == {"WAKE_LINES": 50}
    finally:
        server.shutdown()
    assert [(h.method, h.path) for h in seen] == [("GET", "/config")] * (client.BUSY_RETRIES + 3)


def test_a_move_that_outlasts_the_resends_is_reported() -> None:
    server, seen = serve_moving(refusals=1000)
    try:
        mem = client.Stash(f"http://127.0.0.1:{server.server_port}", "stash1_" + "0" * 16 + "_" + "A" * 49, pin=False)
        with pytest.raises(client.ServerError) as refused:
            mem.request("GET", "/config")
    finally:
        server.shutdown()
    assert refused.value.code == "fleet.moving"
    assert len(seen) == 1 + client.MOVING_RETRIES
