"""Every route's success answer, field by field, against docs/DESIGN.md, "HTTP surface",
and the memory behaviour of its "Memory model" as seen over HTTP. Expected lines are rendered by
the test's own driver from what it wrote, and block layouts come from the
oracles in ``support`` — never from the server."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any, cast

import httpx

from stash.web.routes import ROUTES
from tests.api.support import AWAKE, OLD_DATE, SPEC_SIZES, Mem, export_members, state, today_utc
from tests.support.api import Api, assert_error, matched
from tests.support.oracle import bid, cost, oracle_parts, oracle_pending
from tests.support.oracle import spec_cover as oracle_cover

TOKEN_RE = re.compile(r"stash1_[0-9a-f]{16}_[0-9A-Za-z]{49}")
NAP_STATUS: dict[str, Any] = {"method": "POST", "path": "/nap", "fields": {}, "plain": None, "placeholders": []}
NAP_KEYS = {"block", "source", "remaining", "max_bytes", "prompt", "run"}
MEMORY_LINE = re.compile(r"#(\d+) (\d{4}-\d{2}-\d{2}) (.+)")


def texts(n: int, fmt: str = "memory number {k} about the garden") -> list[str]:
    return [fmt.format(k=k) for k in range(n)]


def check_nap(nap: dict, mem: Mem, block: tuple[int, int], remaining: int) -> None:
    """A nap object as docs/DESIGN.md defines it ("Nap", "HTTP surface"), for ``block``, whose source
    is rendered by the driver from what it wrote."""
    assert set(nap) == NAP_KEYS, nap
    lo, hi = block
    assert nap["block"] == bid(lo, hi)
    if hi - lo <= 16:
        assert nap["source"] == [mem.memory_line(i) for i in range(lo, hi)]
    else:
        mid = (lo + hi) // 2
        assert nap["source"] == [mem.render(lo, mid), mem.render(mid, hi)]
    assert nap["remaining"] == remaining
    assert nap["max_bytes"] == SPEC_SIZES["ENTRY_CHARS"]
    # The first order of the prompt is the command that answers it: the nap route and this block.
    assert nap["run"][0]["fields"] == {"block": bid(lo, hi), "text": "<your line>"}
    first = nap["prompt"].split("\nRun: ", 1)[1].split("\n")
    assert "/nap" in first[0] and first[1] == f"{bid(lo, hi)} <your line>", nap["prompt"]
    for line in nap["source"]:
        assert line in nap["prompt"]


def wake_keys_ok(body: dict) -> None:
    assert {"T", "part", "parts", "lines", "awake", "nap"} <= set(body), body
    # Besides the design's fields a wake part may only say how to go on, and name the log's head.
    assert set(body) - {"T", "part", "parts", "lines", "awake", "nap"} <= {"next", "message", "head", "run"}, body
    head_ok(body["head"], body["T"] if body.get("T") is not None else None)


def head_ok(head: dict, count: int | None = None) -> None:
    """A log head as every write and wake answers it: the count, 64 hex
    digits of digest, the whole state's version, and the pin that joins them."""
    assert set(head) == {"count", "digest", "state", "pin"}, head
    assert len(head["digest"]) == 64 and int(head["digest"], 16) >= 0
    assert isinstance(head["state"], int) and head["state"] >= 1
    assert head["pin"] == f"{head['count']}:{head['digest']}:{head['state']}"
    if count is not None:
        assert head["count"] >= count


# ---------------------------------------------------------------- public routes


def test_health_names_version_and_ciphers(api: Api) -> None:
    resp = api.get("/health")
    assert resp.status_code == 200
    body = resp.json()
    assert body["content_cipher"] == "xchacha20-poly1305"
    assert body["file_cipher"] in ("sqlcipher", "none")
    assert isinstance(body["version"], str) and body["version"]
    assert body["file_cipher"] == api.app.state.vault.file_cipher


def test_init_answers_201_with_a_working_token_shown_once(api: Api) -> None:
    resp = api.post("/init", json={"url": "https://memory.example.org"})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert set(body) == {"user_id", "token", "content_cipher", "file_cipher", "note", "prompt"}
    assert re.fullmatch(r"[0-9a-f]{16}", body["user_id"])
    assert TOKEN_RE.fullmatch(body["token"])
    assert body["token"].split("_")[1] == body["user_id"]
    assert body["content_cipher"] == "xchacha20-poly1305"
    assert body["file_cipher"] == api.get("/health").json()["file_cipher"]
    assert isinstance(body["note"], str) and body["note"]
    # The AGENTS.md block has its placeholders filled from the body's url.
    assert "https://memory.example.org" in body["prompt"]
    assert "{url}" not in body["prompt"] and "{chars}" not in body["prompt"]
    assert body["token"] not in body["prompt"]
    assert api.get("/wake", body["token"]).status_code == 200
    other = api.post("/init")
    assert other.status_code == 201, other.text
    assert other.json()["user_id"] != body["user_id"]
    assert other.json()["token"] != body["token"]


def test_no_route_ends_in_a_slash() -> None:
    assert [r.path for r in ROUTES if r.path != "/" and r.path.endswith("/")] == []


def test_shape_is_cover_and_its_post_twin_agrees(api: Api) -> None:
    for T, lines in [(0, 96), (5, 96), (200, 96), (1000, 20), (97, 96)]:
        resp = api.get(f"/shape?T={T}&lines={lines}")
        assert resp.status_code == 200, resp.text
        expected = [[lo, hi - 1] for lo, hi in oracle_cover(T, lines)]
        assert resp.json()["blocks"] == expected
        twin = api.post("/shape", json={"T": T, "lines": lines})
        assert twin.status_code == 200 and twin.json() == resp.json()


def test_metrics_on_loopback_carry_no_user_memory_or_query(api: Api, mem: Mem) -> None:
    # The in-process client presents itself as loopback; the check below relies on it.
    assert cast(httpx.ASGITransport, api.client._transport).client[0] == "127.0.0.1"
    secret_text = "the vault code is hidden under the blue tile"
    mem.note(secret_text)
    api.get("/recall?q=blue%20tile", mem.token)
    resp = api.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert "stash_requests_total" in text
    assert "/note" in text  # counted by route template
    user_id = mem.token.split("_")[1]
    for leak in (secret_text, "blue", mem.token, user_id, "q="):
        assert leak not in text, leak


def test_metrics_refused_off_loopback(data_dir) -> None:
    from stash.web.app import create_app
    from tests.support.api import make_settings

    app = create_app(make_settings(data_dir))
    remote = Api(app)
    remote.loop.run_until_complete(remote.client.aclose())
    remote.client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("203.0.113.7", 4242)), base_url="http://stash.test"
    )
    try:
        assert_error(remote.get("/metrics"), 403)
    finally:
        remote.close()


def test_landing_page(api: Api) -> None:
    resp = api.get("/")
    landing = Path(__file__).resolve().parents[2] / "stash" / "web" / "landing.html"
    if resp.status_code == 200:
        assert resp.headers["content-type"].startswith("text/html")
        assert "<html" in resp.text.lower()
    else:
        # Only acceptable while the page is not yet in the tree, and then as the JSON error shape.
        assert not landing.exists(), resp.text
        assert_error(resp, resp.status_code)


def test_client_download(api: Api) -> None:
    resp = api.get("/client")
    source = Path(__file__).resolve().parents[2] / "stash" / "client.py"
    if resp.status_code == 200:
        compile(resp.text, "stash", "exec")
        assert resp.text == source.read_text(encoding="utf-8")
    else:
        assert not source.exists(), resp.text
        assert_error(resp, resp.status_code)


# ---------------------------------------------------------------- note and nap


def test_note_answers_id_and_the_due_nap(mem: Mem) -> None:
    first = mem.note("the user prefers tea to coffee")
    head_ok(first.pop("head"), 1)
    assert first == {"id": 0, "nap": None}
    second = mem.note("the user lives in Lisbon")
    assert set(second) == {"id", "nap", "head"}
    assert second["head"]["count"] == 2 and second["head"]["digest"] != mem.note("x")["head"]["digest"]
    assert second["id"] == 1
    check_nap(second["nap"], mem, (0, 2), remaining=0)
    # The date is the server's UTC day.
    assert mem.memory_line(1).split()[1] == today_utc().isoformat()


def test_note_that_completes_blocks_carries_the_first_pending(mem: Mem) -> None:
    mem.import_(texts(3))
    body = mem.note("the fourth memory")
    assert body["id"] == 3
    order = oracle_pending(4, set())
    check_nap(body["nap"], mem, order[0], remaining=len(order) - 1)


def test_nap_asks_settles_refuses_wrong_block_and_ignores_settled(api: Api, mem: Mem) -> None:
    mem.import_(texts(4))
    asked = mem.ok(api.post("/nap", mem.token, json={}))
    assert asked["saved"] is None
    check_nap(asked["nap"], mem, (0, 2), remaining=2)
    assert set(asked) - {"saved", "nap"} <= {"message"}

    before = state(api, mem.token)
    for wrong in ("2-3", "0-3"):
        body = assert_error(api.post("/nap", mem.token, json={"block": wrong, "text": "too early"}), 409)
        assert {"error", "message", "due", "nap"} <= set(body)
        assert body["due"] == "0-1"
        check_nap(body["nap"], mem, (0, 2), remaining=2)
    assert state(api, mem.token) == before

    saved = mem.nap("0-1", "the first two memories")
    assert saved["saved"] == "0-1"
    check_nap(saved["nap"], mem, (2, 4), remaining=1)

    before = state(api, mem.token)
    again = mem.ok(api.post("/nap", mem.token, json={"block": "0-1", "text": "a rewrite that must not land"}))
    assert again["saved"] is None
    check_nap(again["nap"], mem, (2, 4), remaining=1)
    assert state(api, mem.token) == before
    zoom = mem.ok(api.get("/zoom?block=0-3", mem.token))
    assert zoom["lines"][0] == "#0-1 the first two memories"

    assert mem.nap("2-3", "the next two")["saved"] == "2-3"
    last = mem.nap("0-3", "all four")
    assert last == {**last, "saved": "0-3", "nap": None}
    assert mem.ok(api.post("/nap", mem.token, json={}))["nap"] is None


def test_naps_come_in_spec_order_with_sources(mem: Mem) -> None:
    """32 memories: sizes 2 to 16 summarise raw memories, 32 its two halves."""
    mem.import_(texts(32))
    order = oracle_pending(32, set())
    nap = mem.ok(mem.api.post("/nap", mem.token, json={}))["nap"]
    for k, block in enumerate(order):
        check_nap(nap, mem, block, remaining=len(order) - k - 1)
        nap = mem.nap(nap["block"], f"gist of {bid(*block)} ü")["nap"]
    assert nap is None


# ---------------------------------------------------------------- wake


def test_wake_empty(api: Api, owner: str) -> None:
    body = api.get("/wake", owner).json()
    wake_keys_ok(body)
    assert (body["T"], body["part"], body["parts"], body["lines"], body["awake"], body["nap"]) == (
        0,
        1,
        1,
        [],
        True,
        None,
    )


def test_wake_hands_over_a_pending_nap_it_does_not_need(mem: Mem) -> None:
    mem.import_(texts(10))
    resp = mem.api.get("/wake", mem.token)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    wake_keys_ok(body)
    assert body["T"] == 10 and body["part"] == 1 and body["parts"] == 1 and body["awake"] is True
    assert body["lines"] == [mem.memory_line(i) for i in range(10)]
    order = oracle_pending(10, set())
    check_nap(body["nap"], mem, order[0], remaining=len(order) - 1)
    twin = mem.api.post("/wake", mem.token, json={})
    assert twin.status_code == 200 and twin.json() == body


def test_wake_refused_when_the_document_needs_a_missing_summary(api: Api, mem: Mem) -> None:
    mem.import_(texts(200))
    before = state(api, mem.token)
    body = assert_error(api.get("/wake", mem.token), 409)
    assert {"error", "message", "needs", "nap"} <= set(body)
    needed = [b for b in oracle_cover(200, SPEC_SIZES["WAKE_LINES"]) if b[1] - b[0] > 1]
    assert body["needs"] == bid(*needed[0])
    order = oracle_pending(200, set())
    check_nap(body["nap"], mem, order[0], remaining=len(order) - 1)
    assert_error(api.post("/wake", mem.token, json={}), 409)
    assert state(api, mem.token) == before


def test_wake_past_the_budget_after_every_nap(mem: Mem) -> None:
    mem.import_(texts(100))
    assert mem.settle_all() == len(oracle_pending(100, set()))
    parts = mem.wake_all()
    assert len(parts) == 1
    body = parts[0]
    wake_keys_ok(body)
    assert body["lines"] == mem.wake_lines(96)
    assert len(body["lines"]) == 96
    assert body["awake"] is True and body["nap"] is None
    # A note completes no block here (T = 101): nothing due, and a finer wake.
    assert mem.note("one more")["nap"] is None
    assert mem.wake_all()[0]["lines"] == mem.wake_lines(96)


def test_wake_parts_respect_part_lines_and_carry_next(mem: Mem) -> None:
    mem.import_(texts(10))
    conf = mem.set_config(PART_LINES=3)
    assert conf["sizes"]["PART_LINES"] == 3
    parts = mem.wake_all()
    assert len(parts) == 4
    assert [line for p in parts for line in p["lines"]] == [mem.memory_line(i) for i in range(10)]
    for k, body in enumerate(parts, start=1):
        wake_keys_ok(body)
        assert body["part"] == k and body["parts"] == 4 and body["T"] == 10
        assert len(body["lines"]) <= 3
        assert sum(cost(x) for x in body["lines"]) <= SPEC_SIZES["PART_CHARS"]
        last = k == 4
        assert body["awake"] is last
        if last:
            order = oracle_pending(10, set())
            check_nap(body["nap"], mem, order[0], remaining=len(order) - 1)
        else:
            assert body["nap"] is None
            assert isinstance(body["next"], str)
            # docs/DESIGN.md, "Next steps": the next step is the POST twin, no query string (a broker may refuse one).
            assert "?" not in body["next"]
            assert body["next"].endswith(f'"$STASH_URL/wake" -d \'{{"part": {k + 1}, "T": 10}}\''), body["next"]
            assert body["run"] == [
                {
                    "method": "POST",
                    "path": "/wake",
                    "fields": {"part": k + 1, "T": 10},
                    "plain": None,
                    "placeholders": [],
                }
            ]


def test_wake_parts_respect_part_chars_greedily(mem: Mem) -> None:
    # Mixed widths, with 2- and 4-byte characters, so bytes and characters differ.
    mem.import_([f"entry {k} " + "é" * (k % 7) + "🙂" * (k % 3) + "." for k in range(24)])
    mem.settle_all()
    mem.set_config(PART_CHARS=90)
    parts = mem.wake_all()
    expected = oracle_parts([mem.memory_line(i) for i in range(24)], SPEC_SIZES["PART_LINES"], 90)
    assert [p["lines"] for p in parts] == expected
    for p in parts:
        assert sum(cost(x) for x in p["lines"]) <= 90
    assert [p["awake"] for p in parts] == [False] * (len(parts) - 1) + [True]


def test_wake_part_from_a_snapshot_ignores_a_later_note(api: Api, mem: Mem) -> None:
    mem.import_(texts(10))
    mem.set_config(PART_LINES=3)
    first = mem.ok(api.get("/wake", mem.token))
    assert first["T"] == 10
    mem.note("arrived between two parts")
    rest = [mem.ok(api.get(f"/wake?part={k}&T=10", mem.token)) for k in (2, 3, 4)]
    got = first["lines"] + [line for p in rest for line in p["lines"]]
    assert got == [mem.memory_line(i) for i in range(10)]
    assert all(p["T"] == 10 for p in rest)
    assert rest[-1]["awake"] is True and rest[-1]["nap"]["block"] == "0-1"
    twin = api.post("/wake", mem.token, json={"part": 3, "T": 10})
    assert twin.status_code == 200 and twin.json() == rest[1]
    # Without T the wake is of the log as it is now.
    assert mem.ok(api.get("/wake", mem.token))["T"] == 11


def expected_wake(mem: Mem, wake_chars: int, nap_prompt: str | None = None) -> list[str]:
    """The byte budget (docs/DESIGN.md, "Wake"): lower the line budget one at a time until the
    lines, the closing words and the nap prompt fit (never below one line).
    As in OptMem's wake, the room left for lines is never less than one
    memory's worth (ENTRY_CHARS): a tight budget must not wake an agent with
    no past at all."""
    extra = len(AWAKE.encode())
    if nap_prompt is not None:
        extra += len(("\n" + nap_prompt + "\n").encode())
    room = max(wake_chars - extra, SPEC_SIZES["ENTRY_CHARS"])
    budget = SPEC_SIZES["WAKE_LINES"]
    while True:
        doc = mem.wake_lines(budget)
        if budget == 1 or sum(cost(x) for x in doc) <= room:
            return doc
        budget -= 1


def test_wake_chars_lowers_the_line_count_until_it_fits(mem: Mem) -> None:
    mem.import_(texts(20, "memory number {k:02d} about the garden shed"))
    mem.settle_all()
    full = sum(cost(mem.memory_line(i)) for i in range(20)) + len(AWAKE)
    for wake_chars in (full, full - 1, 600, 400, 300):
        mem.set_config(WAKE_CHARS=wake_chars)
        lines = [x for p in mem.wake_all() for x in p["lines"]]
        want = expected_wake(mem, wake_chars)
        assert lines == want, wake_chars
        assert sum(cost(x) for x in lines) + len(AWAKE) <= wake_chars
    assert len(expected_wake(mem, full - 1)) < 20


def test_wake_chars_counts_the_pending_nap_prompt(mem: Mem) -> None:
    mem.import_(texts(20, "memory number {k:02d} about the garden shed"))
    mem.settle_all()
    mem.import_(["twenty", "twenty-one"])
    prompt = mem.ok(mem.api.post("/nap", mem.token, json={}))["nap"]["prompt"]
    for wake_chars in (900, 700):
        want = expected_wake(mem, wake_chars, prompt)
        mem.set_config(WAKE_CHARS=wake_chars)
        parts = mem.wake_all()
        assert [x for p in parts for x in p["lines"]] == want, wake_chars
        assert parts[-1]["nap"]["prompt"] == prompt


def test_wake_chars_below_one_entry_keeps_one_entry_of_room(mem: Mem) -> None:
    mem.import_(texts(16, "memory number {k:02d} about the garden shed"))
    mem.settle_all()
    mem.set_config(WAKE_CHARS=40)
    lines = [x for p in mem.wake_all() for x in p["lines"]]
    # OptMem floors the room at ENTRY_CHARS (280 bytes), so 40 bytes behaves as
    # 280: the finest cover whose lines fit 280 bytes, not the single root line.
    assert lines == expected_wake(mem, 40)
    assert sum(cost(x) for x in lines) <= 280 < sum(cost(x) for x in expected_wake(mem, 10**6))
    assert len(lines) > 1


# ---------------------------------------------------------------- recall, zoom, forget


def recall_oracle(mem: Mem, pattern: str, part_chars: int) -> dict:
    hits = [mem.memory_line(i) for i in range(len(mem.log)) if re.search(pattern, mem.memory_line(i), re.IGNORECASE)]
    kept: list[str] = []
    size = 0
    for line in reversed(hits):
        if size + cost(line) > part_chars:
            break
        kept.insert(0, line)
        size += cost(line)
    more = int(kept[0].split()[0][1:]) if kept and len(kept) < len(hits) else None
    return {"matches": kept, "total": len(hits), "more": more}


def test_recall_newest_matches_within_part_chars_and_total(api: Api, mem: Mem) -> None:
    mem.import_(
        [f"apple pie number {k}" if k % 2 else f"banana bread {k}" for k in range(30)]
        + ["met Ayşe Yılmaz in İstanbul", "APPLE cider in Straße 9"]
    )
    mem.settle_all()
    mem.set_config(PART_CHARS=120)
    for pattern in ("apple", "YILMAZ", "istanbul", r"pie number \d+5", "2021-03", "summary", r"^#3\d "):
        got = mem.ok(api.get("/recall", mem.token, params={"q": pattern}))
        assert set(got) == {"matches", "total", "more", "message", "run"}
        assert {k: got[k] for k in ("matches", "total", "more")} == recall_oracle(mem, pattern, 120), pattern
        twin = api.post("/recall", mem.token, json={"q": pattern})
        assert twin.status_code == 200 and twin.json() == got
    assert mem.ok(api.get("/recall", mem.token, params={"q": "summary"}))["total"] == 0


def test_zoom_opens_halves_and_omits_what_lies_beyond(api: Api, mem: Mem) -> None:
    mem.import_(texts(5))
    mem.nap("0-1", "pair zero")
    mem.nap("2-3", "pair one")
    cases = {
        "0-3": ["#0-1 pair zero", "#2-3 pair one"],
        "0-1": [mem.memory_line(0), mem.memory_line(1)],
        "4-5": [mem.memory_line(4)],  # #5 lies beyond T = 5
        "0-7": ["#0-3 not compressed yet", "#4-7 not compressed yet"],
        "4-7": ["#4-5 not compressed yet"],  # 6-7 lies beyond T
    }
    for block, lines in cases.items():
        got = mem.ok(api.get(f"/zoom?block={block}", mem.token))
        assert got == {"block": block, "lines": lines}
        twin = api.post("/zoom", mem.token, json={"block": block})
        assert twin.status_code == 200 and twin.json() == got
    for beyond in ("6-7", "8-15", "8-9"):
        assert_error(api.get(f"/zoom?block={beyond}", mem.token), 422)


def test_forget_drops_smallest_first_and_naps_rebuild(api: Api, mem: Mem) -> None:
    mem.import_(texts(8))
    mem.settle_all()
    settled = set(mem.summaries)
    assert len(settled) == 7
    body = mem.ok(api.post("/forget", mem.token, json={"block": "2-3"}))
    assert set(body) == {"dropped", "nap"}
    # From docs/DESIGN.md, "Forget": at each size, the block holding #2 and every later one.
    want = [(2, 4), (4, 6), (6, 8), (0, 4), (4, 8), (0, 8)]
    assert body["dropped"] == [bid(*b) for b in want]
    remaining = settled - set(want)
    order = oracle_pending(8, remaining)
    assert order == [(2, 4), (4, 6), (6, 8), (0, 4), (4, 8), (0, 8)]
    assert mem.ok(api.post("/nap", mem.token, json={}))["nap"] == body["nap"]  # the answer carries the next nap
    assert body["nap"]["block"] == "2-3"
    assert_error(api.post("/forget", mem.token, json={"block": "2-3"}), 404)
    assert mem.ok(api.get("/zoom?block=0-3", mem.token))["lines"] == ["#0-1 summary of 0-1", "#2-3 not compressed yet"]
    for block in order:
        mem.summaries.pop(block, None)
    assert mem.settle_all() == len(order)
    mem.set_config(WAKE_LINES=2)
    assert (
        [x for p in mem.wake_all() for x in p["lines"]]
        == mem.wake_lines(2)
        == ["#0-3 summary of 0-3", "#4-7 summary of 4-7"]
    )
    assert len(mem.log) == 8 and mem.ok(api.get("/wake", mem.token))["T"] == 8


# ---------------------------------------------------------------- config, import, export


def test_config_changes_and_null_restores(api: Api, mem: Mem) -> None:
    got = mem.ok(api.get("/config", mem.token))
    assert got == {"sizes": SPEC_SIZES, "defaults": SPEC_SIZES}
    changed = mem.set_config(WAKE_LINES=64, PART_LINES=7)
    assert changed == {"sizes": {**SPEC_SIZES, "WAKE_LINES": 64, "PART_LINES": 7}, "defaults": SPEC_SIZES}
    assert mem.ok(api.get("/config", mem.token)) == changed
    restored = mem.ok(api.post("/config", mem.token, json={"WAKE_LINES": None}))
    assert restored == {"sizes": {**SPEC_SIZES, "PART_LINES": 7}, "defaults": SPEC_SIZES}
    mem.set_config(ENTRY_CHARS=20)
    assert_error(api.post("/note", mem.token, json={"text": "x" * 21}), 422)
    assert mem.note("x" * 20)["id"] == 0


def test_import_answers_first_last_pending(api: Api, mem: Mem) -> None:
    body = mem.import_(texts(3))
    assert body.pop("head")["count"] == 3
    assert body.pop("run") == [NAP_STATUS]
    assert body == {"first": 0, "last": 2, "pending": len(oracle_pending(3, set()))}
    body = mem.import_(texts(2), date="2021-03-05")
    assert body.pop("head")["count"] == 5
    assert body.pop("run") == [NAP_STATUS]
    assert body == {"first": 3, "last": 4, "pending": 3}
    mem.settle_all()
    mem.note("from today")
    today = today_utc().isoformat()
    body = mem.import_(["same day is fine", "still today"], date=today)
    assert body.pop("head")["count"] == 8
    assert body.pop("run") == ([NAP_STATUS] if body["pending"] else [])
    assert body == {"first": 6, "last": 7, "pending": len(oracle_pending(8, set(mem.summaries)))}
    lines = mem.ok(api.post("/recall", mem.token, json={"q": "."}))["matches"]
    assert lines == [mem.memory_line(i) for i in range(8)]


def test_export_is_an_optmem_directory(api: Api, mem: Mem) -> None:
    mem.import_(["plain", "naïve café ☕", "third", "fourth", "fifth"])
    mem.settle_all()
    resp = api.get("/export", mem.token)
    assert resp.status_code == 200
    assert resp.content[:2] == b"\x1f\x8b"
    members = export_members(api, mem.token)
    log = members["memory/LOG.txt"]
    assert len(log) == 5 * 320
    for i in range(5):
        rec = log[i * 320 : (i + 1) * 320]
        line = mem.memory_line(i).encode()
        assert rec == line + b" " * (319 - len(line)) + b"\n"
        assert MEMORY_LINE.fullmatch(rec.decode().rstrip())
    for size in (2, 4):
        tree = members[f"memory/TREE/{size}"]
        blocks = [(lo, lo + size) for lo in range(0, 5 - size + 1, size)]
        assert len(tree) == 288 * len(blocks)
        for k, block in enumerate(blocks):
            rec = tree[k * 288 : (k + 1) * 288]
            assert rec.endswith(b"\n") and len(rec) == 288
            assert rec.rstrip(b" \n").endswith(mem.summaries[block].encode())
    assert not any(name.startswith("memory/TREE/8") for name in members)


def test_dates_are_utc_days(mem: Mem) -> None:
    mem.note("dated by the server")
    line = mem.ok(mem.api.get("/wake", mem.token))["lines"][0]
    date = matched(MEMORY_LINE.fullmatch(line)).group(2)
    # The server's day is today's UTC date (or yesterday's, if midnight passed meanwhile).
    assert date in {today_utc().isoformat(), (today_utc() - dt.timedelta(days=1)).isoformat()}
    assert OLD_DATE < date
