"""Batch naps (docs/DESIGN.md, "Nap"; issue 12 item 1): ``{"batch": k}`` lists the due
blocks that can be written at once, ``{"summaries": [...]}`` settles them in
order, all or nothing. The oracle is the single nap: the same summaries must
give the same tree and the same wake."""

from __future__ import annotations

import json
import random

import pytest

from tests.api.support import Mem, state
from tests.support.api import assert_error
from tests.support.oracle import bid, oracle_pending

RAW_MAX = 16  # docs/DESIGN.md, "Nap": larger blocks are written from their halves' summaries


def text_of(lo: int, hi: int) -> str:
    return f"s{lo}.{hi} → digest"


def oracle_batch(T: int, settled: set[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """docs/DESIGN.md, "Nap", alone: the first pending blocks, stopping at the first one
    written from halves that are not settled before the batch."""
    out = []
    for lo, hi in oracle_pending(T, settled)[:k]:
        mid = (lo + hi) // 2
        if hi - lo > RAW_MAX and not {(lo, mid), (mid, hi)} <= settled:
            break
        out.append((lo, hi))
    return out


def tree_by_zoom(mem: Mem, T: int) -> dict[str, list[str]]:
    """Every summary of the tree, read back through zoom of each block above
    size 2 that starts inside the log (a zoom shows both halves)."""
    out = {}
    size = 4
    while size <= 2 * T:
        for lo in range(0, T, size):
            out[bid(lo, lo + size)] = mem.ok(mem.api.post("/zoom", mem.token, json={"block": bid(lo, lo + size)}))[
                "lines"
            ]
        size *= 2
    return out


def settle_by_batches(mem: Mem, rng: random.Random) -> int:
    """Settle everything due through batches of random size; returns requests."""
    requests = 0
    settled: set[tuple[int, int]] = set(mem.summaries)
    T = len(mem.log)
    while True:
        k = rng.choice([1, 2, 3, 7, 64, 256])
        ans = mem.ok(mem.api.post("/nap", mem.token, json={"batch": k}))
        requests += 1
        want = oracle_batch(T, settled, k)
        assert [b["block"] for b in ans["batch"]] == [bid(*b) for b in want]
        if not want:
            assert ans["nap"] is None
            return requests
        for item, (lo, hi) in zip(ans["batch"], want):
            assert item["max_bytes"] == 280
            if hi - lo <= RAW_MAX:
                assert item["source"] == [mem.memory_line(i) for i in range(lo, hi)]
            else:
                mid = (lo + hi) // 2
                assert item["source"] == [mem.render(lo, mid), mem.render(mid, hi)]
        body = {"summaries": [{"block": bid(lo, hi), "text": text_of(lo, hi)} for lo, hi in want]}
        out = mem.ok(mem.api.post("/nap", mem.token, json=body))
        requests += 1
        assert out["saved"] == [bid(*b) for b in want]
        for lo, hi in want:
            mem.summaries[(lo, hi)] = text_of(lo, hi)
            settled.add((lo, hi))
        rest = oracle_pending(T, settled)
        assert (out["nap"] or {}).get("block") == (bid(*rest[0]) if rest else None)


def settle_singly(mem: Mem) -> None:
    nap = mem.ok(mem.api.post("/nap", mem.token, json={}))["nap"]
    while nap is not None:
        lo, last = map(int, nap["block"].split("-"))
        nap = mem.nap(nap["block"], text_of(lo, last + 1))["nap"]


@pytest.mark.slow
@pytest.mark.parametrize("T", [2, 5, 37, 70, 131])
def test_batches_make_the_tree_and_wake_single_naps_make(api, T: int) -> None:
    rng = random.Random(T)
    texts = [f"m{i} ünï" for i in range(T)]
    single, batched = Mem(api, api.init()["token"]), Mem(api, api.init()["token"])
    for mem in (single, batched):
        mem.import_(texts)
    settle_singly(single)
    settle_by_batches(batched, rng)
    assert single.summaries == batched.summaries
    assert tree_by_zoom(single, T) == tree_by_zoom(batched, T)
    for budget in (96, 9, 3):
        for mem in (single, batched):
            mem.set_config(WAKE_LINES=budget)
        a, b = single.wake_all(), batched.wake_all()
        assert [p["lines"] for p in a] == [p["lines"] for p in b]
        assert [line for p in b for line in p["lines"]] == batched.wake_lines(budget)


@pytest.mark.slow
def test_batches_between_notes_match_single_naps(api) -> None:
    """Memories that arrive one at a time, with a batch taken now and then."""
    rng = random.Random(7)
    single, batched = Mem(api, api.init()["token"]), Mem(api, api.init()["token"])
    for i in range(90):
        for mem in (single, batched):
            mem.note(f"n{i}")
        settle_singly(single)
        if rng.random() < 0.2:
            settle_by_batches(batched, rng)
    settle_by_batches(batched, rng)
    assert single.summaries == batched.summaries
    assert single.wake_all()[-1]["lines"] == batched.wake_all()[-1]["lines"]


def test_a_batch_stops_before_a_block_whose_halves_are_not_written(mem: Mem) -> None:
    mem.import_([f"m{i}" for i in range(64)])
    ans = mem.ok(mem.api.post("/nap", mem.token, json={"batch": 256}))
    # 32 + 16 + 8 + 4 raw blocks (sizes 2 to 16); 32-63 waits for 0-15 and 16-31.
    assert len(ans["batch"]) == 60
    assert ans["batch"][-1]["block"] == "48-63"
    assert ans["nap"]["block"] == "0-1"
    assert ans["prompt"].split("\nRun: ")[-1].startswith("curl") and "?" not in ans["prompt"]
    body = ans["run"][0]["fields"]
    assert [s["block"] for s in body["summaries"]] == [b["block"] for b in ans["batch"]]
    assert ans["prompt"].endswith(
        "\n".join(f"{b['block']} <your line for {b['block']}>" for b in ans["batch"]) + "\nSTASH_END"
    )


def test_the_nap_prompt_names_the_batch_when_more_than_one_is_due(mem: Mem) -> None:
    first = mem.import_(["a", "b", "c", "d"])
    assert first["pending"] == 3
    nap = mem.ok(mem.api.post("/nap", mem.token, json={}))["nap"]
    assert nap["prompt"].splitlines()[-1].startswith("Run: ")
    assert nap["prompt"].splitlines()[-1].endswith(""" -d '{"batch": 3}'""")
    assert [s["fields"] for s in nap["run"]] == [{"block": "0-1", "text": "<your line>"}, {"batch": 3}]
    mem.nap("0-1", "x")
    mem.nap("2-3", "y")
    last = mem.ok(mem.api.post("/nap", mem.token, json={}))["nap"]
    assert last["block"] == "0-3" and "batch" not in last["prompt"]


def test_a_wrong_block_refuses_the_whole_batch(mem: Mem) -> None:
    mem.import_([f"m{i}" for i in range(8)])
    before = state(mem.api, mem.token)
    body = {"summaries": [{"block": "0-1", "text": "a"}, {"block": "4-5", "text": "b"}]}
    err = assert_error(mem.api.post("/nap", mem.token, json=body), 409, "nap.wrong_block")
    assert err["due"] == "0-1" and err["index"] == 1 and "2-3" in err["message"]
    assert state(mem.api, mem.token) == before
    bad_text = {"summaries": [{"block": "0-1", "text": "a"}, {"block": "2-3", "text": "x\ny"}]}
    err = assert_error(mem.api.post("/nap", mem.token, json=bad_text), 422)
    assert err["index"] == 1
    assert state(mem.api, mem.token) == before


def test_a_resent_batch_writes_nothing_again(mem: Mem) -> None:
    mem.import_([f"m{i}" for i in range(4)])
    body = {"summaries": [{"block": "0-1", "text": "a"}, {"block": "2-3", "text": "b"}]}
    assert mem.ok(mem.api.post("/nap", mem.token, json=body))["saved"] == ["0-1", "2-3"]
    before = state(mem.api, mem.token)
    again = mem.ok(mem.api.post("/nap", mem.token, json=body))
    assert again["saved"] == [] and again["nap"]["block"] == "0-3"
    assert state(mem.api, mem.token) == before


@pytest.mark.parametrize(
    "body",
    [
        {"batch": 0},
        {"batch": 257},
        {"batch": True},
        {"batch": "3"},
        {"batch": 2, "block": "0-1"},
        {"summaries": []},
        {"summaries": "0-1"},
        {"summaries": [{"block": "0-1"}]},
        {"summaries": [{"block": "0-1", "text": "a", "extra": 1}]},
        {"batch": 2, "summaries": []},
        {"summaries": [{"block": "0-1", "text": "a"}] * 257},
    ],
)
def test_bad_batch_requests_are_422_and_write_nothing(mem: Mem, body: dict) -> None:
    mem.import_(["a", "b"])
    before = state(mem.api, mem.token)
    assert_error(mem.api.post("/nap", mem.token, json=body), 422)
    assert state(mem.api, mem.token) == before


def test_a_full_batch_of_the_longest_lines_fits_the_body_cap(mem: Mem) -> None:
    mem.import_([f"m{i}" for i in range(512)])
    # A part large enough for all 256 blocks: a batch answers only as many as fit in one.
    assert mem.api.post("/config", mem.token, json={"PART_CHARS": 1_000_000}).status_code == 200
    ans = mem.ok(mem.api.post("/nap", mem.token, json={"batch": 256}))
    line = "😀" * 70  # 280 bytes, 840 once escaped as \uXXXX pairs
    body = {"summaries": [{"block": b["block"], "text": line} for b in ans["batch"]]}
    raw = json.dumps(body).encode()  # ensure_ascii: the worst case
    assert len(raw) > 64 * 1024
    resp = mem.api.post("/nap", mem.token, content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["saved"]) == 256


def test_a_2000_memory_import_is_awake_within_50_requests(mem: Mem) -> None:
    """Follow only what the server prints: the refused wake's nap, the batch
    command its prompt names, each batch's own answering command. Each batch
    holds what fits in one part (20 KB), so the long leaf blocks come a few
    at a time (49 requests, against 40 when a batch was any size)."""
    mem.import_([f"imported {i}" for i in range(2000)])
    requests = 0

    def call(step: dict) -> tuple[int, dict]:
        nonlocal requests
        requests += 1
        assert "?" not in step["path"]
        if step["method"] == "GET":
            r = mem.api.get(step["path"], mem.token)
        else:
            data = json.loads(json.dumps(step["fields"]))
            for s in data.get("summaries", []):
                s["text"] = f"summary of {s['block']}"
            if "text" in data:
                data["text"] = "one line"
            r = mem.api.post(step["path"], mem.token, json=data)
        return r.status_code, r.json()

    wake = {"method": "GET", "path": "/wake", "fields": {}}
    status, ans = call(wake)
    assert status == 409 and ans["run"] == [{**wake, "plain": None, "placeholders": []}]
    nap = ans["nap"]
    while True:
        # The batch offer when there is one, else the nap itself.
        status, listed = call(nap["run"][-1])
        assert status == 200
        if "batch" in listed:
            status, listed = call(listed["run"][0])
            assert status == 200
        if listed["nap"] is None:
            break
        nap = listed["nap"]
    status, woke = call(wake)
    assert status == 200 and woke["awake"]
    print("requests to awake:", requests)
    assert requests <= 50, requests


def test_batch_answers_match_the_openapi_document(mem: Mem) -> None:
    from tests.support.docs.openapi import check_answer

    doc = mem.api.get("/openapi.json").json()
    mem.import_([f"m{i}" for i in range(40)])
    listed = check_answer(doc, "POST", "/nap", mem.api.post("/nap", mem.token, json={"batch": 5}), 200)
    body = {"summaries": [{"block": b["block"], "text": "x"} for b in listed["batch"]]}
    check_answer(doc, "POST", "/nap", mem.api.post("/nap", mem.token, json=body), 200)
    check_answer(
        doc, "POST", "/nap", mem.api.post("/nap", mem.token, json={"summaries": [{"block": "0-3", "text": "x"}]}), 409
    )


def test_a_batch_after_a_whole_block_was_erased_settles_as_offered(api, owner):
    """A wholly erased block needs no summary, so the batch offer skips it;
    the summaries sent back exactly as offered must then settle (found by a
    chaos run: the check of their order still counted the erased block as
    due and refused every batch with nap.wrong_block)."""
    for i in range(8):
        assert api.post("/note", owner, json={"text": f"memory {i}"}).status_code == 200
    assert api.post("/erase", owner, json={"ids": [0, 1]}).status_code == 200
    offer = api.post("/nap", owner, json={"batch": 64}).json()
    blocks = [item["block"] for item in offer["batch"]]
    assert blocks and "0-1" not in blocks, offer
    resp = api.post("/nap", owner, json={"summaries": [{"block": b, "text": f"sum {b}"} for b in blocks]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["saved"] == blocks
    assert api.post("/nap", owner, json={"batch": 64}).json()["batch"] == []
    assert api.get("/wake", owner).json()["awake"] is True
