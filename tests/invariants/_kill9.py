"""kill -9 at a random instant of one action, then the same request resent
(same Idempotency-Key, same token): the trials of tests/invariants/
test_owner_kill9.py (a few, seeded) and bench/kill9.py (many).

After each trial: the resend completes, nothing is half-applied (the action's
own check below), the owner is not locked out (wake and a note work), and at
the end every acknowledged note is present and the memory settles and wakes.
"""

from __future__ import annotations

import datetime as dt
import random
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx

from stash.service.access import Vault
from tests.support import loopback
from tests.support.installed import OUTSIDE
from tests.support.server import Server


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


OPS = ("rotate", "rotate-unkeyed", "revoke", "erase", "forget", "batch", "import", "backup")
CASES = {
    "1-worker": ["--workers", "1", "--keep-open", "0"],
    "2-workers-kept-open": ["--workers", "2", "--keep-open", "5"],
}


class Memory:
    """One memory on a server that is killed and restarted under it."""

    def __init__(self, server: Server, rng: random.Random, scratch: Path) -> None:
        self.server, self.rng, self.scratch = server, rng, scratch
        self.http = loopback.client(base_url=server.url, timeout=30)
        self.owner = self.http.post("/init", json={}).json()["token"]
        resp = self.http.post(
            "/import", headers=self.h(), json={"entries": [{"date": today(), "text": f"m{k}"} for k in range(40)]}
        )
        assert resp.status_code == 200, resp.text
        self.notes: dict[int, str] = {k: f"m{k}" for k in range(40)}
        self.backups = 0

    def h(self, key: str | None = None, token: str | None = None) -> dict:
        headers = {"Authorization": f"Bearer {token or self.owner}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    def note(self, text: str) -> None:
        resp = self.http.post("/note", headers=self.h(str(uuid.uuid4())), json={"text": text})
        assert resp.status_code == 200, resp.text
        self.notes[resp.json()["id"]] = text

    def restart(self) -> None:
        self.server.start(same_port=True)
        self.http.close()
        self.http = loopback.client(base_url=self.server.url, timeout=30)

    def trial(self, op: str) -> None:
        key = str(uuid.uuid4())
        if op == "backup":
            return self._backup()
        if op == "rotate-unkeyed":
            return self._rotate_unkeyed()
        request: tuple[str, str, dict[str, Any]]
        if op == "rotate":
            request = ("POST", "/rotate", {"json": {}})
        elif op == "revoke":
            grant = self.http.post("/grants", headers=self.h(), json={"scope": "full"}).json()
            request = ("DELETE", f"/grants/{grant['id']}", {})
        elif op == "erase":
            request = ("POST", "/erase", {"json": {"ids": self.rng.sample(sorted(self.notes), 3)}})
        elif op == "forget":
            lo = self.rng.randrange(0, 16) * 2
            request = ("POST", "/forget", {"json": {"block": f"{lo}-{lo + 1}"}})
        elif op == "batch":
            items = self.http.post("/nap", headers=self.h(), json={"batch": 64}).json()["batch"]
            request = (
                "POST",
                "/nap",
                {"json": {"summaries": [{"block": it["block"], "text": f"s {it['block']}"} for it in items]}},
            )
        else:
            request = (
                "POST",
                "/import",
                {"json": {"entries": [{"date": today(), "text": f"imp {key} {k}"} for k in range(200)]}},
            )
        self._killed_during(request[0], request[1], self.h(key), request[2])
        resent = self.http.request(request[0], request[1], headers=self.h(key), **request[2])
        if op == "forget":  # no key: forgetting twice finds nothing the second time
            assert resent.status_code in (200, 404), resent.text
        else:
            assert resent.status_code == 200, (op, resent.status_code, resent.text)
        body = resent.json()
        if op == "rotate":
            old, self.owner = self.owner, body["token"]
            again = self.http.post("/rotate", headers=self.h(key, old), json={})
            assert again.status_code == 200 and again.json()["token"] == self.owner  # exactly once
            # The new token's first use retires the old one; from then on the
            # old token, with the key or without, is refused as revoked.
            grants = self.http.get("/grants", headers=self.h()).json()["grants"]
            assert sum(g["scope"] == "owner" and g["live"] for g in grants) == 1
            assert self.http.get("/wake", headers=self.h(token=old)).status_code == 401
            assert self.http.post("/rotate", headers=self.h(key, old), json={}).status_code == 401
            other = self.http.post("/rotate", headers=self.h(str(uuid.uuid4()), old), json={})
            assert other.status_code == 401
        elif op == "revoke":
            assert body["revoked"] is not None
            assert self.http.get("/wake", headers=self.h(token=grant["token"])).status_code == 401
        elif op == "erase":
            erased = {i for r in self.http.get("/erasures", headers=self.h()).json()["erasures"] for i in r["erased"]}
            assert set(request[2]["json"]["ids"]) <= erased
            for i in request[2]["json"]["ids"]:
                self.notes.pop(i, None)
        elif op == "batch":
            assert body["saved"] is not None
        elif op == "import":
            lines = self.http.post("/recall", headers=self.h(), json={"q": f"imp {key} "}).json()
            assert lines["total"] == 200, lines["total"]  # once, whole
            self.notes.update({body["first"] + k: f"imp {key} {k}" for k in range(200)})
        self.alive(op)

    def _killed_during(self, method: str, path: str, headers: dict, kw: dict) -> httpx.Response | None:
        """Send one request, kill -9 the server at a random instant of it
        and start it again; the answer, if one arrived before the kill."""
        out: list = []

        def send() -> None:
            try:
                out.append(loopback.request(method, self.server.url + path, headers=headers, timeout=30, **kw))
            except httpx.TransportError:
                out.append(None)

        thread = threading.Thread(target=send)
        thread.start()
        threading.Event().wait(self.rng.uniform(0, 0.08))
        self.server.kill9()
        thread.join(timeout=30)
        self.restart()
        return out[0] if out else None

    def _rotate_unkeyed(self) -> None:
        """``POST /rotate`` without an Idempotency-Key, as API-REFERENCE's
        curl example sends it, killed at a random instant: the old token is
        still the owner unless the answer arrived, and then the new one is.
        Either way the owner can go on (rotating again if the answer was
        lost), and once the token held is used there is one live owner."""
        out = self._killed_during("POST", "/rotate", self.h(), {"json": {}})
        answered = out if out is not None and out.status_code == 200 else None
        if answered is None:
            # The answer was lost: the old token still works as the owner.
            assert self.http.get("/grants", headers=self.h()).status_code == 200
            resent = self.http.post("/rotate", headers=self.h(), json={})
            assert resent.status_code == 200, resent.text
            answered = resent
        old, self.owner = self.owner, answered.json()["token"]
        grants = self.http.get("/grants", headers=self.h()).json()["grants"]
        assert sum(g["scope"] == "owner" and g["live"] for g in grants) == 1
        assert self.http.get("/wake", headers=self.h(token=old)).status_code == 401
        self.alive("rotate-unkeyed")

    def _backup(self) -> None:
        dest = self.scratch / f"backup{self.backups}"
        self.backups += 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "stash", "backup", str(dest), "--data", str(self.server.data)],
            cwd=OUTSIDE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        threading.Event().wait(self.rng.uniform(0, 0.3))
        proc.kill()
        proc.wait(timeout=30)
        self.alive("backup")
        done = subprocess.run(
            [sys.executable, "-m", "stash", "backup", str(dest) + "-again", "--data", str(self.server.data)],
            cwd=OUTSIDE,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def alive(self, op: str) -> None:
        woke = self.http.get("/wake", headers=self.h())
        assert woke.status_code in (200, 409), (op, woke.status_code, woke.text)  # 409: naps due
        self.note(f"after {op}")

    def settled_and_whole(self) -> None:
        for _ in range(200):
            items = self.http.post("/nap", headers=self.h(), json={"batch": 256}).json()["batch"]
            if not items:
                break
            resp = self.http.post(
                "/nap",
                headers=self.h(str(uuid.uuid4())),
                json={"summaries": [{"block": it["block"], "text": "settled"} for it in items]},
            )
            assert resp.status_code == 200 and len(resp.json()["saved"]) == len(items), resp.text
        woke = self.http.get("/wake", headers=self.h())
        assert woke.status_code == 200, woke.text
        with Vault(self.server.data).session(self.owner, "read") as session:
            mf = session.open_memory().mf
            rows = {i: text for i, _, text in mf.memories(0, mf.count())}
        assert {i: rows.get(i) for i in self.notes} == self.notes

    def close(self) -> None:
        self.http.close()
