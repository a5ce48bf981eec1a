"""kill -9 at a random instant during an owner action, then the same request
resent (same Idempotency-Key, same token): no lockout, nothing half-applied,
the resend completes. A rotation in particular is delivered exactly once: the
old owner token still works (nothing happened) or the resend returns the new
token (SECURITY.md, "Rotation answers kept for a resend"). bench/ runs more
trials; here a few per case, seeded."""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers import CHEAP_KDF_FLAGS
from tests.live import start_server

CASES = [("1-worker", ["--workers", "1", "--keep-open", "0"]), ("2-workers-kept-open",
                                                                  ["--workers", "2", "--keep-open", "5"])]


def send(url: str, method: str, path: str, token: str, key: str, out: list, **kw) -> None:
    try:
        out.append(httpx.request(method, url + path, headers={"Authorization": f"Bearer {token}",
                                                              "Idempotency-Key": key}, timeout=30, **kw))
    except httpx.TransportError:
        out.append(None)


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", CASES, ids=[c[0] for c in CASES])
def test_kill9_during_owner_actions_then_resend(tmp_path: Path, name: str, flags: list[str]) -> None:
    rng = random.Random(f"owner-kill9-{name}")
    server = start_server(tmp_path, *flags, *CHEAP_KDF_FLAGS)
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        owner = http.post("/init", json={}).json()["token"]
        auth = {"Authorization": f"Bearer {owner}"}
        for k in range(24):
            assert http.post("/note", headers=auth, json={"text": f"m{k}"}).status_code == 200
        for op in ("rotate", "revoke", "erase"):
            auth = {"Authorization": f"Bearer {owner}"}
            key = str(uuid.uuid4())
            if op == "rotate":
                request = ("POST", "/rotate", {"json": {}})
            elif op == "revoke":
                grant = http.post("/grants", headers=auth, json={"scope": "full"}).json()
                request = ("DELETE", f"/grants/{grant['id']}", {})
            else:
                request = ("POST", "/erase", {"json": {"ids": rng.sample(range(24), 3)}})
            out: list = []
            thread = threading.Thread(target=send, args=(server.url, request[0], request[1], owner, key, out),
                                      kwargs=request[2])
            thread.start()
            threading.Event().wait(rng.uniform(0, 0.08))
            server.kill9()
            thread.join(timeout=30)
            server.start(same_port=True)
            http.close()
            http = httpx.Client(base_url=server.url, timeout=30)
            resent = http.request(request[0], request[1], headers={**auth, "Idempotency-Key": key}, **request[2])
            assert resent.status_code == 200, (op, resent.status_code, resent.text)
            if op == "rotate":
                old = owner
                owner = resent.json()["token"]
                again = http.post("/rotate", headers={"Authorization": f"Bearer {old}", "Idempotency-Key": key},
                                  json={})
                assert again.status_code == 200 and again.json()["token"] == owner  # exactly once
                assert http.get("/wake", headers={"Authorization": f"Bearer {old}"}).status_code == 401
                other = http.post("/rotate", headers={"Authorization": f"Bearer {old}",
                                                      "Idempotency-Key": str(uuid.uuid4())}, json={})
                assert other.status_code == 401  # only the same key opens the record
                live = [g for g in http.get("/grants", headers={"Authorization": f"Bearer {owner}"}).json()["grants"]
                        if g["scope"] == "owner" and g["live"]]
                assert len(live) == 1
            elif op == "revoke":
                assert resent.json()["revoked"] is not None
                assert http.get("/wake", headers={"Authorization": f"Bearer {grant['token']}"}).status_code == 401
            else:
                erased = {i for r in http.get("/erasures", headers={"Authorization": f"Bearer {owner}"}
                                               ).json()["erasures"] for i in r["erased"]}
                assert set(request[2]["json"]["ids"]) <= erased
            woke = http.get("/wake", headers={"Authorization": f"Bearer {owner}"})
            assert woke.status_code in (200, 409), (op, woke.text)  # 409: naps due after an erasure
            assert http.post("/note", headers={"Authorization": f"Bearer {owner}"},
                             json={"text": f"after {op}"}).status_code == 200
        http.close()
    finally:
        server.stop()
