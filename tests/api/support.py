"""Support for the in-process API tests: a small driver over the ``api``
fixture whose expectations come from the oracle (tests/support/oracle.py), never from
the code under test."""

from __future__ import annotations

import datetime as dt
import io
import tarfile

from tests.support.api import Api, member_bytes
from tests.support.memories import MAIN_MEMORY, Memory
from tests.support.oracle import bid, spec_cover

OLD_DATE = "2021-03-04"
AWAKE = "You are awake.\n"

SPEC_SIZES = {
    "WAKE_LINES": 96,
    "WAKE_CHARS": 1_000_000,
    "ENTRY_CHARS": 280,
    "PART_CHARS": 20_000,
    "PART_LINES": 500,
}


def today_utc() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


# ---------------------------------------------------------------- driver


class Mem:
    """One user's memory (main, or ``memory`` reached by the owner under
    /m/{name}), driven over HTTP, remembering what it wrote so the tests can
    render what the server should answer."""

    def __init__(self, api: Api, token: str, memory: Memory = MAIN_MEMORY) -> None:
        self.api = api
        self.token = token
        self.at = memory.at  # this memory's address of a route
        self.log: list[tuple[str, str]] = []  # (date, text), position is identity
        self.summaries: dict[tuple[int, int], str] = {}

    def ok(self, resp, status: int = 200):
        assert resp.status_code == status, (resp.status_code, resp.text)
        return resp.json()

    def import_(self, texts: list[str], date: str = OLD_DATE) -> dict:
        body = self.ok(
            self.api.post(self.at("/import"), self.token, json={"entries": [{"date": date, "text": t} for t in texts]})
        )
        self.log += [(date, t) for t in texts]
        return body

    def note(self, text: str) -> dict:
        body = self.ok(self.api.post(self.at("/note"), self.token, json={"text": text}))
        self.log.append((today_utc().isoformat(), text))
        return body

    def nap(self, block: str, text: str) -> dict:
        body = self.ok(self.api.post(self.at("/nap"), self.token, json={"block": block, "text": text}))
        if body["saved"] is not None:
            lo, last = map(int, block.split("-"))
            self.summaries[(lo, last + 1)] = text
        return body

    def settle_all(self) -> int:
        nap = self.ok(self.api.post(self.at("/nap"), self.token, json={}))["nap"]
        n = 0
        while nap is not None:
            nap = self.nap(nap["block"], f"summary of {nap['block']}")["nap"]
            n += 1
        return n

    def set_config(self, **sizes) -> dict:
        return self.ok(self.api.post(self.at("/config"), self.token, json=sizes))

    def wake_all(self) -> list[dict]:
        first = self.ok(self.api.get(self.at("/wake"), self.token))
        out = [first]
        for k in range(2, first["parts"] + 1):
            out.append(self.ok(self.api.get(self.at(f"/wake?part={k}&T={first['T']}"), self.token)))
        return out

    # rendering, from what this driver wrote

    def memory_line(self, i: int) -> str:
        date, text = self.log[i]
        return f"#{i} {date} {text}"

    def render(self, lo: int, hi: int) -> str:
        if hi - lo == 1:
            return self.memory_line(lo)
        return f"#{bid(lo, hi)} {self.summaries[(lo, hi)]}"

    def wake_lines(self, budget: int, T: int | None = None) -> list[str]:
        T = len(self.log) if T is None else T
        return [self.render(lo, hi) for lo, hi in spec_cover(T, budget)]


def export_members(api: Api, token: str, path: str = "/export") -> dict[str, bytes]:
    resp = api.get(path, token)
    assert resp.status_code == 200, resp.text
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        return {m.name: member_bytes(tar, m) for m in tar.getmembers() if m.isfile()}


def state(api: Api, token: str) -> dict[str, bytes]:
    """Everything a request could have changed, read back through the export:
    the log, every level of the tree and the config overrides. What is due and
    what the wake shows are functions of these three, so equal exports mean an
    unchanged memory."""
    return export_members(api, token)


def mint(api: Api, owner: str, scope: str) -> str:
    vault = api.app.state.vault
    with vault.session(owner, "owner") as s:
        _, token = vault.mint_grant(s, scope)
    return token
