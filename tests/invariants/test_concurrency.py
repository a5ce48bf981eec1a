"""Concurrent writers on one identity: real OS processes on the same files,
and real HTTP clients against a real server process.

Whatever the interleaving, the log must come out as if the writes had been
made one at a time: ids dense from 0, no duplicate, no gap, every text once,
every acknowledged id holding the text it was acknowledged for, every summary
written from its own block's lines, and the append-only triggers in place.
"""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stash.core.sizes import DEFAULTS
from stash.service.access import Vault
from tests.invariants._workers import Child
from tests.support import loopback, oracle
from tests.support.api import CHEAP_KDF, CHEAP_KDF_FLAGS, assert_error
from tests.support.server import start_server

pytestmark = pytest.mark.slow

PROCESSES = 4
NOTES_EACH = 50
THREADS = 4
HTTP_NOTES_EACH = 25


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def test_processes_appending_to_one_store_keep_the_log_dense(tmp_path: Path, file_cipher: str):
    vault = Vault(tmp_path / "data", kdf=CHEAP_KDF, file_cipher=file_cipher)
    ident = vault.create_identity()
    assert ident.file_cipher == file_cipher
    token = ident.token
    day_before = today()
    kids = [
        Child(
            ["writer", str(tmp_path / "data"), f"w{k}", str(NOTES_EACH), "1" if k % 2 == 0 else "0"],
            token,
            tmp_path / f"w{k}.err",
        )
        for k in range(PROCESSES)
    ]
    acked: dict[int, str] = {}
    saved: list[str] = []
    try:
        for kid in kids:
            assert kid.next(timeout=60) == "ready"
        # every session is open before anyone writes, so the writes overlap
        for kid in kids:
            kid.send("go\n")
        for k, kid in enumerate(kids):
            lines = kid.rest(timeout=120)
            assert lines and lines[-1] == "done", (lines[-3:], kid.stderr())
            assert kid.proc.wait(timeout=30) == 0, kid.stderr()
            notes = [line.split() for line in lines if line.startswith("n ")]
            assert [int(n[2]) for n in notes] == list(range(NOTES_EACH))
            for _, i, n in notes:
                assert int(i) not in acked, f"id {i} acknowledged twice"
                acked[int(i)] = f"w{k} note {n}"
            saved += [line.split()[1] for line in lines if line.startswith("s ")]
    finally:
        for kid in kids:
            kid.stop()
    day_after = today()

    total = PROCESSES * NOTES_EACH
    assert sorted(acked) == list(range(total))
    assert saved, "the writers that answer naps saved nothing"
    assert len(saved) == len(set(saved)), "one block saved twice"

    with vault.session(token, "owner") as s:
        mem = s.open_memory()
        model = oracle.load_model(mem)
        assert model.T == total
        texts = [text for _, text in model.notes]
        assert sorted(texts) == sorted(acked.values()), "a text is missing or doubled"
        for nid, text in acked.items():
            assert model.notes[nid][1] == text, (nid, model.notes[nid], text)
        assert {date for date, _ in model.notes} <= {day_before, day_after}
        for block in saved:
            assert oracle.parse_bid(block) in model.summaries, f"{block} acknowledged but not stored"
        oracle.check_summaries_match_sources(model)
        oracle.check_log_triggers(mem.mf.conn)
        # what the writers left due is still answerable, then the wake is whole
        oracle.answer_all(mem, model)
        oracle.check_summaries_match_sources(model)
        oracle.check_wake(mem, model, dict(DEFAULTS))


# ---------------------------------------------------------------- over HTTP


def test_http_clients_posting_at_once_keep_the_log_dense(tmp_path: Path):
    server = start_server(tmp_path, *CHEAP_KDF_FLAGS)
    try:
        resp = loopback.post(server.url + "/init", json={}, timeout=30)
        assert resp.status_code == 201, resp.text
        token = resp.json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        start = threading.Barrier(THREADS, timeout=30)
        day_before = today()

        def client(k: int) -> tuple[list[tuple[int, str]], list[str]]:
            """One client posting its notes; the even ones also answer naps."""
            noted, saved = [], []
            with loopback.client(base_url=server.url, headers=auth, timeout=30) as http:
                start.wait()
                for n in range(HTTP_NOTES_EACH):
                    text = f"t{k} note {n}"
                    resp = http.post("/note", json={"text": text})
                    assert resp.status_code == 200, resp.text
                    noted.append((resp.json()["id"], text))
                    nap = resp.json()["nap"]
                    for _ in range(64):
                        if nap is None or k % 2:
                            break
                        resp = http.post(
                            "/nap",
                            json={
                                "block": nap["block"],
                                "text": f"{nap['block']} {oracle.digest(nap['source'])} t{k}",
                            },
                        )
                        if resp.status_code == 409:
                            # another client's note made a smaller block due first
                            nap = assert_error(resp, 409, "nap.wrong_block")["nap"]
                            continue
                        assert resp.status_code == 200, resp.text
                        if resp.json()["saved"] is not None:
                            saved.append(resp.json()["saved"])
                        nap = resp.json()["nap"]
            return noted, saved

        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(client, range(THREADS), timeout=120))
        day_after = today()

        noted = [pair for got, _ in results for pair in got]
        saved = [block for _, got in results for block in got]
        total = THREADS * HTTP_NOTES_EACH
        assert sorted(i for i, _ in noted) == list(range(total)), "ids not dense, or one given twice"
        assert len(saved) == len(set(saved))

        with loopback.client(base_url=server.url, headers=auth, timeout=30) as http:
            # a wake that shows every memory verbatim reads the whole log back
            resp = http.post("/config", json={"WAKE_LINES": 2 * total})
            assert resp.status_code == 200, resp.text
            first = http.get("/wake").json()
            assert first["T"] == total
            lines = list(first["lines"])
            for part in range(2, first["parts"] + 1):
                lines += http.get("/wake", params={"part": part, "T": total}).json()["lines"]
            parsed = [oracle.parse_line(line) for line in lines]
            assert [p[0] for p in parsed] == list(range(total))
            assert all(p[1] - p[0] == 1 and p[2] in {day_before, day_after} for p in parsed)
            assert {p[0]: p[3] for p in parsed} == dict(noted)

            recalled = http.get("/recall", params={"q": r"T\d NOTE \d"}).json()
            assert recalled["total"] == total
            assert recalled["matches"] == lines

            # every summary any client saved is stored for its own block and
            # was written from that block's lines
            model = oracle.Model()
            for _, _, date, text in parsed:
                assert date is not None
                model.add_note(date, text)
            size = 4
            while size // 2 <= total:
                for lo in range(0, total, size):
                    shown = http.get("/zoom", params={"block": oracle.bid(lo, lo + size)}).json()["lines"]
                    for line in shown:
                        a, b, _, text = oracle.parse_line(line)
                        if b - a > 1 and text != "not compressed yet":
                            model.settle((a, b), text)
                size *= 2
            assert {oracle.parse_bid(b) for b in saved} <= set(model.summaries)
            oracle.check_summaries_match_sources(model)

        # the files the server wrote, read directly: same log, same tree
        with Vault(tmp_path / "data").session(token, "owner") as s:
            stored = oracle.load_model(s.open_memory())
            assert stored.notes == model.notes
            assert stored.summaries == model.summaries
            oracle.check_log_triggers(s.open_memory().mf.conn)
    finally:
        server.stop()
