"""Client processes for the crash and parallel-writer tests, run as

    python -m tests.e2e._http_clients noter URL OUT NAME NAPS [COUNT]
    python -m tests.e2e._http_clients reader URL OUT
    python -m tests.e2e._http_clients oneshot URL

The token comes in the environment (STASH_TEST_TOKEN), never on a command
line. A noter and a reader run until the file ``OUT.stop`` appears (or COUNT
notes are acknowledged), riding out a server that dies and comes back: a
request that fails without an answer is recorded as unknown and the next one
goes to the restarted server. Each outcome is appended to OUT and flushed the
moment it is known, so the parent reads exactly what was acknowledged:

    a ID K        note K ("NAME note K") was acknowledged as memory #ID
    u K           note K got no answer: it may or may not be stored
    s BLOCK       the summary of BLOCK was acknowledged as saved
    r             one whole read (wake, every part, and a recall) checked out
    e WHAT        an answer that must never happen (a 5xx, a torn line, ...)

``oneshot`` opens a connection, prints ``ready``, then performs one request
per JSON line on stdin (``{"method", "path", "json"}``) and prints
``{"status", "body"}`` for each: a parent releases several of them at once.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import httpx

from tests.support.oracle import digest

TOKEN_ENV = "STASH_TEST_TOKEN"
LIFETIME_S = 180  # a client never outlives a parent that forgot it
PAUSE_S = 0.05  # between attempts while the server is down
MEMORY = re.compile(r"#(\d+) \d{4}-\d{2}-\d{2} (c\d+ note \d+)")
SUMMARY = re.compile(r"#(\d+)-(\d+) (\d+-\d+) ([0-9a-f]{8}) c\d+")


class Log:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", encoding="utf-8")

    def __call__(self, line: str) -> None:
        self.f.write(line + "\n")
        self.f.flush()


def client(url: str) -> httpx.Client:
    return httpx.Client(
        base_url=url, timeout=20, trust_env=False, headers={"Authorization": f"Bearer {os.environ[TOKEN_ENV]}"}
    )


def post(http: httpx.Client, path: str, body: dict) -> httpx.Response | None:
    """One attempt; None when no answer came back (the server died)."""
    try:
        return http.post(path, json=body)
    except httpx.TransportError:
        return None


def settle(http: httpx.Client, nap: dict | None, name: str, log: Log) -> None:
    """Answer what is due, following whatever other writers made due first."""
    for _ in range(64):
        if nap is None:
            return
        resp = post(http, "/nap", {"block": nap["block"], "text": f"{nap['block']} {digest(nap['source'])} {name}"})
        if resp is None:
            return  # the server died; the next note brings the nap back
        body = resp.json()
        if resp.status_code == 409 and body.get("error") == "nap.wrong_block":
            nap = body["nap"]
            continue
        if resp.status_code != 200:
            log(f"e nap {resp.status_code} {body.get('error')}")
            return
        if body["saved"] is not None:
            log(f"s {body['saved']}")
        nap = body["nap"]


def noter(url: str, out: str, name: str, naps: bool, count: int | None) -> None:
    log = Log(out)
    stop = Path(out + ".stop")
    end = time.monotonic() + LIFETIME_S
    acked = 0
    k = 0
    with client(url) as http:
        while not stop.exists() and time.monotonic() < end and (count is None or acked < count):
            resp = post(http, "/note", {"text": f"{name} note {k}"})
            if resp is None:
                log(f"u {k}")
                k += 1
                time.sleep(PAUSE_S)
                continue
            if resp.status_code != 200:
                log(f"e note {resp.status_code} {resp.json().get('error')}")
                k += 1
                continue
            body = resp.json()
            log(f"a {body['id']} {k}")
            acked += 1
            k += 1
            if naps:
                settle(http, body["nap"], name, log)


def check_lines(lines: list[str], log: Log) -> bool:
    for line in lines:
        if not (MEMORY.fullmatch(line) or SUMMARY.fullmatch(line)):
            log(f"e torn {line[:60]!r}")
            return False
    return True


def read_once(http: httpx.Client, log: Log) -> None:
    resp = http.get("/wake")
    if resp.status_code == 409 and resp.json().get("error") == "wake.needs_nap":
        return  # a writer has not settled what the wake needs yet
    if resp.status_code != 200:
        log(f"e wake {resp.status_code} {resp.json().get('error')}")
        return
    first = resp.json()
    lines = list(first["lines"])
    for part in range(2, first["parts"] + 1):
        resp = http.get("/wake", params={"part": part, "T": first["T"]})
        if resp.status_code != 200:
            log(f"e wake-part {resp.status_code} {resp.json().get('error')}")
            return
        lines += resp.json()["lines"]
    resp = http.get("/recall", params={"q": "note"})
    if resp.status_code != 200:
        log(f"e recall {resp.status_code} {resp.json().get('error')}")
        return
    if check_lines(lines, log) and check_lines(resp.json()["matches"], log):
        log("r")


def reader(url: str, out: str) -> None:
    log = Log(out)
    stop = Path(out + ".stop")
    end = time.monotonic() + LIFETIME_S
    with client(url) as http:
        while not stop.exists() and time.monotonic() < end:
            try:
                read_once(http, log)
            except httpx.TransportError:
                time.sleep(PAUSE_S)


def oneshot(url: str) -> None:
    with client(url) as http:
        http.get("/health")  # the connection is open before the parent says go
        print("ready", flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            resp = http.request(req["method"], req["path"], json=req.get("json"))
            print(json.dumps({"status": resp.status_code, "body": resp.json()}), flush=True)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "noter":
        noter(rest[0], rest[1], rest[2], rest[3] == "1", int(rest[4]) if len(rest) > 4 else None)
    elif mode == "reader":
        reader(rest[0], rest[1])
    elif mode == "oneshot":
        oneshot(rest[0])
    else:
        sys.exit(f"unknown mode {mode}")
