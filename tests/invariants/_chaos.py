"""Honest chaos against one memory: what an operator and their agents do at
once, on a real ``stash serve`` with several workers and kept-open files.

Threads of one process play the clients (the server is the processes under
test): note writers on two full capabilities, a batch napper
(``{"batch": 64}`` then ``{"summaries": [...]}`` as printed), a reader (wake
and recall), an agent writing to another memory (``side``) through a
capability bound to it, and the owner looping over rotate, mint + revoke,
erase three ids, forget a block, ``stash backup`` and a change of the
identity's memories (create one and note in it, fork ``side``, delete one
it made), in turn. Every write carries an
Idempotency-Key and is resent with the same key after a busy answer or a
lost connection, as a careful client would. Then :func:`check` asks what a
user is promised: every acknowledged note present (or erased by a receipt),
no 5xx at all, the memory settled and awake, every note acknowledged in
``side`` present, the memories listed exactly those made and not deleted,
each fork holding the ``at`` its answer named, ``stash verify --token`` ok
(every memory), and the last backup holding every note acknowledged before
it began, in main and in ``side``.

Used by tests/invariants/test_chaos.py (a few seconds per seed) and by
bench/chaos.py (minutes, with the numbers it writes to bench/README.md).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from stash.core.errors import StashError
from stash.service.access import Vault
from tests.support import loopback
from tests.support.installed import OUTSIDE
from tests.support.server import Server

RETRY_STATUSES = (409, 429, 503)  # refusals a client waits out (409: store.rekeyed only)
RESEND_CODES = ("store.rekeyed", "busy.user", "busy.slow", "busy.server")


@dataclass
class Tally:
    """Everything the clients saw, shared by their threads."""

    statuses: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # "STATUS code" of every 4xx and 5xx
    errors: list[str] = field(default_factory=list)  # "STATUS code route" of every 5xx
    acked: dict[int, str] = field(default_factory=dict)  # memory id -> text the server acknowledged
    backups: list[tuple[Path, dict[int, str]]] = field(default_factory=list)  # (folder, acked before it began)
    backup_failures: list[str] = field(default_factory=list)
    side: dict[int, str] = field(default_factory=dict)  # memory side: id -> text acknowledged
    side_token: str = ""  # the full capability bound to side
    side_backups: list[dict[int, str]] = field(default_factory=list)  # side's acked before each backup began
    memories: dict[str, int | None] = field(default_factory=dict)  # made, not deleted -> a fork's at
    memory_steps: Counter = field(default_factory=Counter)  # create, fork, delete: how many were done
    owner: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, route: str, resp: httpx.Response) -> None:
        with self.lock:
            self.statuses[resp.status_code] += 1
            if resp.status_code >= 400:
                try:
                    code, message = resp.json().get("error"), resp.json().get("message")
                except ValueError:
                    code, message = resp.text[:80], ""
                self.refusals[f"{resp.status_code} {code}" + (f" {route}" if resp.status_code == 401 else "")] += 1
                if resp.status_code >= 500:
                    self.errors.append(f"{resp.status_code} {code} {route}: {message}")

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())


class Client:
    """One client thread's connection; every request is tallied."""

    def __init__(self, server: Server, tally: Tally) -> None:
        self.http = loopback.client(base_url=server.url, timeout=60.0)
        self.tally = tally
        self.server_data = server.data

    def call(
        self, method: str, url: str, token: str, *, key: str | None = None, stop: threading.Event | None = None, **kw
    ) -> httpx.Response:
        """One request, resent (with the same Idempotency-Key) while the
        server asks to wait or the connection drops; the last answer."""
        headers = {"Authorization": f"Bearer {token}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        for attempt in range(200):
            try:
                resp = self.http.request(method, url, headers=headers, **kw)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            self.tally.saw(f"{method} {url.split('?')[0]}", resp)
            code = (
                resp.json().get("error")
                if resp.headers.get("content-type", "").startswith("application/json") and resp.status_code >= 400
                else None
            )
            if resp.status_code in RETRY_STATUSES and code in RESEND_CODES:
                time.sleep(min(0.02 * (attempt + 1), 0.3))
                continue
            return resp
        return resp

    def close(self) -> None:
        self.http.close()


def _writer(
    server: Server, tally: Tally, token: str, name: str, stop: threading.Event, acked: dict[int, str] | None = None
) -> None:
    c = Client(server, tally)
    k = 0
    acked = tally.acked if acked is None else acked
    try:
        while not stop.is_set():
            text = f"chaos {name} note {k}"
            resp = c.call("POST", "/note", token, key=str(uuid.uuid4()), json={"text": text})
            if resp.status_code == 200:
                with tally.lock:
                    acked[resp.json()["id"]] = text
            k += 1
    finally:
        c.close()


def _napper(server: Server, tally: Tally, token: str, stop: threading.Event) -> None:
    c = Client(server, tally)
    try:
        while not stop.is_set():
            resp = c.call("POST", "/nap", token, key=str(uuid.uuid4()), json={"batch": 64})
            items = resp.json().get("batch") if resp.status_code == 200 else None
            if not items:
                time.sleep(0.05)
                continue
            summaries = [{"block": it["block"], "text": f"sum {it['block']}"} for it in items]
            c.call("POST", "/nap", token, key=str(uuid.uuid4()), json={"summaries": summaries})
    finally:
        c.close()


def _reader(server: Server, tally: Tally, token: str, stop: threading.Event) -> None:
    c = Client(server, tally)
    try:
        while not stop.is_set():
            c.call("GET", "/wake", token)
            c.call("GET", "/recall?q=chaos", token)
    finally:
        c.close()


OPS = ("erase", "rotate", "revoke", "forget", "backup")
MEMORY_STEPS = ("create", "fork", "delete")


def _memories(c: Client, tally: Tally, owner: str, step: str, n: int) -> None:
    """One change of the identity's memories while agents write to others;
    ``tally.memories`` follows what the answers say was done."""
    if step == "create":
        name = f"made{n}"
        resp = c.call("POST", "/memories", owner, key=str(uuid.uuid4()), json={"name": name})
        if resp.status_code == 201:
            tally.memories[name] = None
            tally.memory_steps[step] += 1
            c.call("POST", f"/m/{name}/note", owner, key=str(uuid.uuid4()), json={"text": f"in {name}"})
    elif step == "fork":
        name = f"fork{n}"
        resp = c.call("POST", "/memories/side/fork", owner, key=str(uuid.uuid4()), json={"name": name})
        if resp.status_code == 201:
            tally.memories[name] = resp.json()["at"]
            tally.memory_steps[step] += 1
    else:
        mine = sorted(m for m in tally.memories if m != "side")
        if mine:
            resp = c.call("DELETE", f"/memories/{mine[0]}", owner, key=str(uuid.uuid4()))
            if resp.status_code == 200:
                del tally.memories[mine[0]]
                tally.memory_steps[step] += 1


def _owner(
    server: Server, tally: Tally, rng: random.Random, stop: threading.Event, scratch: Path, pause: tuple[float, float]
) -> None:
    c = Client(server, tally)
    n = n_op = n_mem = 0
    order = list(OPS)
    try:
        while not stop.is_set():
            # Every action in turn, in a shuffled order, erasure first: a short
            # run still sees each one, and batches answered after an erasure.
            if n_op % len(OPS) == 0:
                order = [OPS[0], *rng.sample(OPS[1:], len(OPS) - 1)]
            op = order[n_op % len(OPS)]
            n_op += 1
            owner = tally.owner
            if op == "rotate":
                resp = c.call("POST", "/rotate", owner, key=str(uuid.uuid4()), json={})
                if resp.status_code == 200:
                    tally.owner = resp.json()["token"]
            elif op == "revoke":
                resp = c.call("POST", "/grants", owner, key=str(uuid.uuid4()), json={"scope": "full"})
                if resp.status_code == 201:
                    c.call("DELETE", f"/grants/{resp.json()['id']}", owner, key=str(uuid.uuid4()))
            elif op == "erase":
                with tally.lock:
                    ids = sorted(tally.acked)
                if ids:
                    c.call(
                        "POST", "/erase", owner, key=str(uuid.uuid4()), json={"ids": rng.sample(ids, min(3, len(ids)))}
                    )
            elif op == "forget":
                with tally.lock:
                    top = max(tally.acked, default=0)
                if top >= 2:
                    lo = rng.randrange(0, top // 2) * 2
                    c.call("POST", "/forget", owner, json={"block": f"{lo}-{lo + 1}"})
            else:
                with tally.lock:
                    before = dict(tally.acked)
                    side_before = dict(tally.side)
                dest = scratch / f"backup{n}"
                n += 1
                res = subprocess.run(
                    [sys.executable, "-m", "stash", "backup", str(dest), "--data", str(server.data)],
                    cwd=OUTSIDE,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if res.returncode == 0:
                    tally.backups.append((dest, before))
                    tally.side_backups.append(side_before)
                else:
                    tally.backup_failures.append(res.stdout[-400:] + res.stderr[-400:])
            # And after each, the next change of the memories (after the first, all three in turn, so that
            # even a short run on a loaded machine sees a create, a fork and a delete).
            for _ in range(len(MEMORY_STEPS) if n_mem == 0 else 1):
                _memories(c, tally, tally.owner, MEMORY_STEPS[n_mem % len(MEMORY_STEPS)], n_mem)
                n_mem += 1
            stop.wait(rng.uniform(*pause))
    finally:
        c.close()


def run(
    server: Server,
    seed: int,
    seconds: float,
    scratch: Path,
    writers: int = 3,
    pause: tuple[float, float] = (0.1, 0.6),
    preload: int = 0,
) -> tuple[Tally, list[str]]:
    """One chaos run on a new memory of ``server`` (``preload`` memories
    imported and settled first): returns the tally and the full capabilities
    of its writers."""
    rng = random.Random(seed)
    tally = Tally()
    boot = Client(server, tally)
    resp = boot.http.post("/init", json={})
    assert resp.status_code == 201, resp.text
    tally.owner = resp.json()["token"]
    fulls = []
    for _ in range(2):
        resp = boot.call("POST", "/grants", tally.owner, json={"scope": "full"})
        assert resp.status_code == 201, resp.text
        fulls.append(resp.json()["token"])
    assert boot.call("POST", "/memories", tally.owner, json={"name": "side"}).status_code == 201
    tally.memories["side"] = None
    resp = boot.call("POST", "/grants", tally.owner, json={"scope": "full", "memory": "side"})
    assert resp.status_code == 201, resp.text
    side = tally.side_token = resp.json()["token"]
    if preload:
        # A memory with a settled past, so erasures leave holes below the frontiers.
        resp = boot.call(
            "POST",
            "/import",
            tally.owner,
            key=str(uuid.uuid4()),
            json={"entries": [{"date": "2026-01-01", "text": f"chaos past {k}"} for k in range(preload)]},
        )
        assert resp.status_code == 200, resp.text
        tally.acked.update({k: f"chaos past {k}" for k in range(preload)})
        for _ in range(64):
            items = boot.call("POST", "/nap", tally.owner, json={"batch": 256}).json()["batch"]
            if not items:
                break
            resp = boot.call(
                "POST",
                "/nap",
                tally.owner,
                json={"summaries": [{"block": it["block"], "text": f"past {it['block']}"} for it in items]},
            )
            assert resp.status_code == 200, resp.text
    boot.close()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_writer, args=(server, tally, fulls[k % 2], f"w{k}", stop)) for k in range(writers)
    ]
    threads.append(threading.Thread(target=_napper, args=(server, tally, fulls[0], stop)))
    threads.append(threading.Thread(target=_reader, args=(server, tally, fulls[1], stop)))
    threads.append(threading.Thread(target=_writer, args=(server, tally, side, "side", stop, tally.side)))
    owner_rng = random.Random(rng.random())
    threads.append(threading.Thread(target=_owner, args=(server, tally, owner_rng, stop, scratch, pause)))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=180)
    return tally, fulls


def _erased(c: Client, owner: str, problems: list[str]) -> set[int]:
    resp = c.call("GET", "/erasures", owner)
    if resp.status_code != 200:
        problems.append(f"erasures: {resp.status_code} {resp.text[:200]}")
        return set()
    return {i for r in resp.json()["erasures"] for i in r["erased"]}


def check(server: Server, tally: Tally, fulls: list[str]) -> list[str]:
    """What a user is promised after the chaos; the broken promises, each a line."""
    problems = [f"5xx: {e}" for e in tally.errors]
    problems += [f"backup failed: {f}" for f in tally.backup_failures]
    problems += [
        f"an action in force answered {code}" for code in tally.refusals if code.endswith(("grants.busy", "erase.busy"))
    ]
    problems += [f"a live capability was refused: {code}" for code in tally.refusals if code.startswith("401")]
    c = Client(server, tally)
    try:
        owner = tally.owner
        erased = _erased(c, owner, problems)
        # Settle everything due, as printed (a batch at a time), then wake to the last part.
        for _ in range(1000):
            resp = c.call("POST", "/nap", owner, key=str(uuid.uuid4()), json={"batch": 256})
            if resp.status_code != 200:
                problems.append(f"nap: {resp.status_code} {resp.text[:200]}")
                break
            items = resp.json()["batch"]
            if not items:
                break
            resp = c.call(
                "POST",
                "/nap",
                owner,
                key=str(uuid.uuid4()),
                json={"summaries": [{"block": it["block"], "text": "settled"} for it in items]},
            )
            if resp.status_code != 200 or len(resp.json()["saved"]) != len(items):
                problems.append(f"summaries as printed: {resp.status_code} {resp.text[:200]}")
                break
        part, awake = 1, False
        while not awake:
            resp = c.call("GET", f"/wake?part={part}", owner)
            if resp.status_code != 200:
                problems.append(f"wake: {resp.status_code} {resp.text[:200]}")
                break
            awake, part = resp.json()["awake"], part + 1
        try:
            with Vault(server.data).session(owner, "read") as s:
                mf = s.open_memory().mf
                rows = {i: text for i, _, text in mf.memories(0, mf.count())}
        except StashError as e:
            return [*problems, f"read the memory: {e.code}"]
        erased = _erased(c, owner, problems)
        for i, text in sorted(tally.acked.items()):
            if rows.get(i) != text and not (rows.get(i) == "[erased]" and i in erased):
                problems.append(f"note #{i}: {rows.get(i)!r}, acknowledged {text!r}")
        problems += _check_memories(c, owner, tally)
        env = {**os.environ, "STASH_TOKEN": owner}
        res = subprocess.run(
            [sys.executable, "-m", "stash", "verify", str(server.data), "--token"],
            cwd=OUTSIDE,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if res.returncode != 0:
            failed = [ln for ln in res.stdout.splitlines() if "FAIL" in ln]
            problems.append(f"verify --token: {res.returncode} {failed or res.stdout[-600:]} {res.stderr[-300:]}")
    finally:
        c.close()
    if tally.backups:
        problems += check_backup(*tally.backups[-1], fulls[0], erased)
        # The backup holds memory side too, every note acknowledged there before it began.
        problems += [
            f"side: {p}" for p in check_backup(tally.backups[-1][0], tally.side_backups[-1], tally.side_token, set())
        ]
    return problems


def _check_memories(c: Client, owner: str, tally: Tally) -> list[str]:
    """The memories are those made and not deleted, each fork holds the
    ``at`` it answered, and every note acknowledged in ``side`` is there."""
    resp = c.call("GET", "/memories", owner)
    if resp.status_code != 200:
        return [f"memories: {resp.status_code} {resp.text[:200]}"]
    listed = {m["name"]: m["T"] for m in resp.json()["memories"]}
    problems = (
        []
        if set(listed) == {"main", *tally.memories}
        else [f"memories listed {sorted(listed)}, made and not deleted {sorted(tally.memories)}"]
    )
    problems += [
        f"fork {name}: T {listed.get(name)}, forked at {at}"
        for name, at in tally.memories.items()
        if at is not None and listed.get(name) != at
    ]
    try:
        with Vault(c.server_data).session(owner, "read", memory="side") as s:
            mf = s.open_memory().mf
            rows = {i: text for i, _, text in mf.memories(0, mf.count())}
    except StashError as e:
        return [*problems, f"read memory side: {e.code}"]
    problems += [
        f"side note #{i}: {rows.get(i)!r}, acknowledged {text!r}"
        for i, text in sorted(tally.side.items())
        if rows.get(i) != text
    ][:5]
    return problems


def check_backup(folder: Path, before: dict[int, str], token: str, erased_now: set[int]) -> list[str]:
    """The backup holds every note acknowledged before it began (or its
    erasure, when that came first)."""
    try:
        with Vault(folder).session(token, "full") as s:
            mf = s.open_memory().mf
            T = mf.count()
            rows = {i: text for i, _, text in mf.memories(0, T)}
    except StashError as e:
        return [f"read the backup: {e.code}"]
    missing = [i for i in before if i >= T]
    out = [f"backup lacks #{i}" for i in missing[:5]]
    out += [
        f"backup #{i}: {rows[i]!r}, acknowledged {text!r}"
        for i, text in before.items()
        if i < T and rows[i] != text and not (rows[i] == "[erased]" and i in erased_now)
    ]
    return out
