"""kill -9 at random instants of a revocation's new epoch on a summarised
store while two agents note (issue 27): nothing half-applied, no lockout, no
`store.rolled_back` or other 500 ever answered, the resend completes, every
acknowledged note is there, and the revocation's guarantee holds once it has
answered: no row written in a later epoch opens with the revoked token's
keys (docs/DESIGN.md, "Key epochs"). One trial per setup (1 and 2 workers),
seeded; more with STASH_EPOCH_KILL9_TRIALS. Each setup in main, and the
server's default one (2 workers, files kept open) in a second memory too
(its grants, rows and store id its own); the suite's time does not allow
all four."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from stash.crypto import aead, keys
from stash.service.access import Vault
from tests.invariants._kill9 import CASES
from tests.support import loopback
from tests.support.api import CHEAP_KDF, CHEAP_KDF_FLAGS
from tests.support.memories import SECOND, Memory
from tests.support.server import Server

T = 2048
# Revocations killed per server setup: one, for the suite's time budget
# (CONTRIBUTING); STASH_EPOCH_KILL9_TRIALS=20 for a longer run.
TRIALS = int(os.environ.get("STASH_EPOCH_KILL9_TRIALS", "1"))


def summarised_store(data: Path, memory: Memory) -> tuple[str, str, list[str], list[tuple[int, str]]]:
    """A plain-file store whose ``memory`` holds T memories with every block
    summarised: the owner token, the user id, two agents' full tokens and
    the read grants the trials revoke, all bound to that memory."""
    vault = Vault(data, CHEAP_KDF, "none")
    ident = vault.create_identity()
    memory.create_in(vault, ident.token)
    with vault.session(ident.token, "owner", memory=memory.name) as s:
        s.open_memory().import_entries([{"date": "2026-11-01", "text": f"old memory {i}"} for i in range(T)])
        while items := s.open_memory().batch_for(s.open_memory().mf.count(), 256)["batch"]:
            s.open_memory().settle([{"block": it["block"], "text": f"summary {it['block']}"} for it in items])
        agents = [vault.mint_grant(s, "full")[1] for _ in range(2)]
        readers = [vault.mint_grant(s, "read") for _ in range(TRIALS)]
    return ident.token, ident.user_id, agents, readers


class Agent(threading.Thread):
    """Notes with an Idempotency-Key, resending through the kills; records
    what was acknowledged and every answer that is not 200."""

    def __init__(self, server: Server, token: str, name: str) -> None:
        super().__init__(daemon=True)
        self.server, self.token, self.name = server, token, name
        self.acked: dict[int, str] = {}
        self.bad: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        k = 0
        while not self.stop.is_set():
            text, key = f"{self.name} note {k}", str(uuid.uuid4())
            while not self.stop.is_set():
                try:
                    resp = loopback.post(
                        self.server.url + "/note",
                        json={"text": text},
                        timeout=30,
                        headers={"Authorization": f"Bearer {self.token}", "Idempotency-Key": key},
                    )
                except httpx.TransportError:
                    time.sleep(0.05)  # the server is down: the same request again
                    continue
                if resp.status_code == 200:
                    self.acked[resp.json()["id"]] = text
                    break
                if resp.status_code == 409 and resp.json().get("error") == "store.rekeyed":
                    continue  # opened across the epoch's move: retry, as the answer says
                self.bad.append(f"{resp.status_code} {resp.text[:200]}")
                break
            k += 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "case,memory", [*((case, "main") for case in sorted(CASES)), ("2-workers-kept-open", SECOND)], indirect=["memory"]
)
def test_kill9_during_a_new_epoch_with_agents_writing(tmp_path: Path, case: str, memory: Memory) -> None:
    rng = random.Random(f"epoch-kill9-{case}-{memory}")
    data = tmp_path / "data"
    owner, user_id, agent_tokens, readers = summarised_store(data, memory)
    server = Server(data, tmp_path / "server.log", extra=[*CASES[case], *CHEAP_KDF_FLAGS]).start()
    agents = [Agent(server, tok, f"agent{k}") for k, tok in enumerate(agent_tokens)]
    http = loopback.client(timeout=30)
    try:
        for a in agents:
            a.start()
        for gid, reader in readers:
            key = str(uuid.uuid4())
            headers = {"Authorization": f"Bearer {owner}", "Idempotency-Key": key}
            sent = threading.Thread(
                target=lambda gid=gid, headers=headers: _quietly(server.url + f"/grants/{gid}", headers)
            )
            sent.start()
            time.sleep(rng.uniform(0, 0.08))
            server.kill9()
            sent.join(timeout=30)
            server.start(same_port=True)
            resent = http.delete(server.url + f"/grants/{gid}", headers=headers)
            assert resent.status_code == 200, resent.text
            assert resent.json()["revoked"] is not None
            assert (
                http.post(server.url + "/wake", headers={"Authorization": f"Bearer {reader}"}, json={}).status_code
                == 401
            )
            woke = http.post(
                server.url + memory.at("/recall"), headers={"Authorization": f"Bearer {owner}"}, json={"q": "^#0 "}
            )
            assert woke.status_code == 200, woke.text  # no lockout
            time.sleep(0.1)  # the agents write in the new epoch
    finally:
        for a in agents:
            a.stop.set()
        for a in agents:
            a.join(timeout=60)
        server.stop()
    for a in agents:
        assert a.bad == [], a.bad[:3]
        assert a.acked, "the agent wrote nothing"
    vault = Vault(data, CHEAP_KDF)
    with vault.session(owner, "owner", memory=memory.name) as s:
        mf = s.open_memory().mf
        chain = s.keys
        lines = [line for batch in mf.scan(mf.count()) for line in batch]
        assert chain.epoch == TRIALS and mf.epoch == TRIALS  # nothing half-applied
    for a in agents:
        for i, text in a.acked.items():
            assert lines[i].endswith(text), (i, lines[i], text)
    # The guarantee, on the bytes: a row sealed in epoch e opens under e's rows key only.
    conn = sqlite3.connect(memory.folder(data / "users" / user_id) / "memory.db")
    try:
        rows = conn.execute("SELECT chunk, sealed, epoch FROM memory_keys WHERE epoch IS NOT NULL").fetchall()
    finally:
        conn.close()
    assert {e for _, _, e in rows} >= {TRIALS}
    for c, sealed, e in rows:
        ad = f"stash/v1|{memory.store(user_id)}|memory_keys|{c}".encode()
        aead.open_sealed(keys.subkey(chain.key(e), b"rows"), sealed, ad)
        for older in range(e):
            with pytest.raises(aead.Unsealable):
                aead.open_sealed(keys.subkey(chain.key(older), b"rows"), sealed, ad)


def _quietly(url: str, headers: dict) -> None:
    try:
        loopback.delete(url, headers=headers, timeout=30)
    except httpx.TransportError:
        pass
