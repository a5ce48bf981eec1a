"""kill -9 at a random instant of each new multi-step write — create, fork,
delete, erase across memories — on a real ``stash serve``, then the same
request resent: nothing is half-done (a memory is there whole or not at all,
never listed but unopenable; an erasure leaves no match in any memory once
resent), and the owner and every other memory keep working. One seeded trial
each (docs/DESIGN.md, "Memories": one rename each)."""

from __future__ import annotations

import random
import sqlite3
import threading
from pathlib import Path

import httpx
import pytest

from stash.storage import memories
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import start_server


@pytest.mark.slow
def test_kill9_during_each_memory_write_leaves_nothing_half_done(tmp_path: Path) -> None:
    rng = random.Random("memories-kill9")
    server = start_server(tmp_path, "--workers", "1", "--keep-open", "0", *CHEAP_KDF_FLAGS)
    http = loopback.client(base_url=server.url, timeout=30)
    try:
        owner = http.post("/init", json={}).json()["token"]
        h = {"Authorization": f"Bearer {owner}"}
        assert http.post("/memories", headers=h, json={"name": "src"}).status_code == 201
        entries = [{"date": "2021-01-01", "text": f"ada line {k}" if k % 3 == 0 else f"line {k}"} for k in range(300)]
        assert http.post("/m/src/import", headers=h, json={"entries": entries}).status_code == 200
        http.post("/memories", headers=h, json={"name": "doomed"})
        http.post("/m/doomed/note", headers=h, json={"text": "ada was here"})
        trials: list[tuple[str, str, dict | None, tuple[int, ...]]] = [
            ("POST", "/memories", {"name": "made"}, (201, 409)),
            ("POST", "/memories/src/fork", {"name": "forked", "at": 250}, (201, 409)),
            ("DELETE", "/memories/doomed", None, (200, 404)),
            ("POST", "/memories/erase", {"q": "ada"}, (200,)),
        ]
        for method, path, body, resent_ok in trials:

            def send(method: str = method, path: str = path, body: dict | None = body) -> None:
                try:
                    loopback.request(method, server.url + path, headers=h, json=body, timeout=30)
                except httpx.TransportError:
                    pass

            thread = threading.Thread(target=send)
            thread.start()
            threading.Event().wait(rng.uniform(0, 0.05))
            server.kill9()
            thread.join(timeout=30)
            server.start(same_port=True)
            http.close()
            http = loopback.client(base_url=server.url, timeout=30)
            listed = {m["name"] for m in http.get("/memories", headers=h).json()["memories"]}
            for name in listed:  # whatever is listed opens, whole
                assert http.get(f"/m/{name}/config", headers=h).status_code == 200, name
            resent = http.request(method, path, headers=h, json=body)
            assert resent.status_code in resent_ok, (path, resent.status_code, resent.text)
        names = {m["name"] for m in http.get("/memories", headers=h).json()["memories"]}
        assert names == {"main", "src", "made", "forked"}
        # Main's key ring names the same memories (what stash restore brings back), the deleted one not.
        ring = sqlite3.connect(next(p for p in (server.data / "users").iterdir() if p.is_dir()) / "keyring.db")
        assert set(memories.named(ring)) == names - {"main"}
        ring.close()
        assert http.post("/m/forked/recall", headers=h, json={"q": "line 248$"}).json()["total"] == 1
        assert http.post("/m/forked/recall", headers=h, json={"q": "line 250$"}).json()["total"] == 0
        for name in names:  # the erasure reached every memory, once resent
            assert http.post(f"/m/{name}/recall", headers=h, json={"q": "ada"}).json()["total"] == 0
        assert http.post("/m/src/note", headers=h, json={"text": "still writable"}).status_code == 200
    finally:
        http.close()
        server.stop()
