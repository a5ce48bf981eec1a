"""The first session works as printed (issue 19 item 5), in process: a read
capability is told what it is, a minted capability comes with the block for
its agent, rotate names STASH_TOKEN, forget's answer carries the next nap,
the landing page shows no query string, counts of one read as one, and
zoom's hint names a block that exists for the log as it is."""

from __future__ import annotations

import re

import pytest

from stash.core import blocks
from stash.service.onboarding import SHARED
from stash.web.routes import ROUTES
from tests.api.support import Mem, mint
from tests.support.api import Api, assert_error
from tests.support.docs.commands import SKILL_DIR, curl_calls, indented_commands
from tests.support.oracle import bid, spec_cover

READ_BLOCK = SKILL_DIR / "AGENTS-read.md"
FULL_BLOCK = SKILL_DIR / "AGENTS.md"


def texts(n: int) -> list[str]:
    return [f"memory {i}" for i in range(n)]


# ---------------------------------------------------------------- a read capability


@pytest.mark.parametrize("n", [0, 3])
def test_a_read_capabilitys_wake_says_it_is_read_only_and_what_to_do(mem: Mem, n: int) -> None:
    reader = mint(mem.api, mem.token, "read")
    if n:
        mem.import_(texts(n))  # 0-1 is due: the owner is handed it, the reader never
    woke = mem.ok(mem.api.post("/wake", reader, json={}))
    assert woke["awake"] and woke["nap"] is None
    said = woke["message"]
    assert "read-only" in said and "tell the user" in said and "recall" in said
    assert said.endswith("\nYou are awake.") and "curl" not in said  # nothing it could not run
    owner = mem.ok(mem.api.post("/wake", mem.token, json={}))
    assert "read-only" not in owner["message"]
    assert (owner["nap"] is not None) == bool(n)


def test_minting_answers_the_block_for_the_agent_it_is_meant_for(mem: Mem) -> None:
    url = "https://memory.example"
    read = mem.ok(mem.api.post("/grants", mem.token, json={"scope": "read", "url": url}), 201)
    full = mem.ok(mem.api.post("/grants", mem.token, json={"scope": "full", "url": url}), 201)
    assert read["prompt"] == READ_BLOCK.read_text(encoding="utf-8").replace("{url}", url)
    # A full agent's block is the owner's and a section on sharing the log (issue 30 item 15).
    owner_block = FULL_BLOCK.read_text(encoding="utf-8").replace("{url}", url)
    assert full["prompt"] == owner_block + SHARED
    assert owner_block == mem.ok(mem.api.post("/init", json={"url": url}), 201)["prompt"]
    # The read agent's block teaches only what a read capability can do, and says what it is.
    routes = {path for c in indented_commands(read["prompt"]) for _, path in curl_calls(c)}
    assert routes == {"/skill", "/reference", "/wake", "/recall", "/zoom"}
    assert "read-only" in read["prompt"] and "### While working: note" not in read["prompt"]
    assert "/note" in {path for c in indented_commands(full["prompt"]) for _, path in curl_calls(c)}
    assert "### While working: note" in full["prompt"] and "carries a nap" in full["prompt"]
    for answer in (read, full):
        assert "STASH_TOKEN" in answer["note"] and answer["token"] not in answer["prompt"]
    # Without a url: the address the request came in on, as /init does.
    plain = mem.ok(mem.api.post("/grants", mem.token, json={"scope": "read"}), 201)
    assert "Stash, at http://stash.test." in plain["prompt"]


@pytest.mark.parametrize("url", ["javascript:alert(1)", 'https://a.example/"$(touch x)"', 7])
def test_a_mint_refuses_an_address_that_could_break_the_block(mem: Mem, url: object) -> None:
    assert_error(mem.api.post("/grants", mem.token, json={"scope": "read", "url": url}), 422)
    assert [g["scope"] for g in mem.ok(mem.api.get("/grants", mem.token))["grants"]] == ["owner"]


def test_rotate_says_to_update_stash_token(mem: Mem) -> None:
    ans = mem.ok(mem.api.post("/rotate", mem.token, json={}))
    assert ans["update"] == "STASH_TOKEN" and "STASH_TOKEN" in ans["message"]
    assert ans["token"] not in ans["message"]
    assert mem.api.post("/wake", ans["token"], json={}).status_code == 200


# ---------------------------------------------------------------- forget


def test_forget_drops_what_the_description_says_and_carries_the_next_nap(mem: Mem) -> None:
    mem.import_(texts(16))
    mem.settle_all()
    before = set(mem.summaries)
    ans = mem.ok(mem.api.post("/forget", mem.token, json={"block": "4-7"}))
    # "that summary, the summary containing it at each larger size, and every later summary of each of those sizes"
    want = [(lo, lo + size) for size in (4, 8, 16) for lo in range(0, 16, size) if lo + size > 4]
    assert ans["dropped"] == [bid(*b) for b in sorted(want, key=lambda b: (b[1] - b[0], b[0]))]
    assert (2, 4) in before and (8, 10) in before  # smaller sizes and other blocks stay
    assert ans["nap"] == mem.ok(mem.api.post("/nap", mem.token, json={}))["nap"]
    assert ans["nap"]["block"] == "4-7"
    # The route's own words say this, not "everything built on it".
    spec = next(r for r in ROUTES if r.path == "/forget")
    assert "every later summary of each of those sizes" in spec.description


# ---------------------------------------------------------------- plurals, landing, zoom


def test_a_batch_of_one_block_reads_as_one(mem: Mem) -> None:
    mem.import_(texts(2))
    ans = mem.ok(mem.api.post("/nap", mem.token, json={"batch": 5}))
    assert len(ans["batch"]) == 1
    assert ans["prompt"].startswith("Compress this block into one line")
    assert not re.search(r"\b1 (blocks|memories|summaries|compressions|matches)\b", ans["prompt"] + ans["message"])


def test_the_landing_page_shows_no_query_string(api: Api) -> None:
    page = api.get("/").text
    shown = re.sub(r"<script>.*?</script>", "", page, flags=re.S)
    assert not re.search(r"/[a-z.]+\?", shown), re.findall(r"\S*/[a-z.]+\?\S*", shown)
    assert not re.search(r"""fetch\(\s*["'][^"']*\?""", page)  # and the page itself asks with none
    rows = re.findall(r"<tr><td>([A-Z]+ /[^<]*)</td>", page)
    assert "POST /recall" in rows and "POST /zoom" in rows and all("?" not in r for r in rows)


@pytest.mark.parametrize(("T", "wake_lines"), [(0, 96), (1, 96), (5, 96), (20, 8)])
def test_zooms_hint_names_a_block_this_log_has(mem: Mem, T: int, wake_lines: int) -> None:
    mem.set_config(WAKE_LINES=wake_lines)
    if T:
        mem.import_(texts(T))
        mem.settle_all()
    refused = assert_error(mem.api.post("/zoom", mem.token, json={"block": "3-4"}), 422, "block.invalid")
    beyond = assert_error(mem.api.post("/zoom", mem.token, json={"block": "4096-8191"}), 422, "block.beyond_log")
    for said in (refused["message"], beyond["message"]):
        assert "16-31" not in said
        named = re.findall(r"like (\d+-\d+)", said)
        if T < 2:
            assert named == [] and "no blocks to zoom into yet" in said
            continue
        assert len(named) == 1
        lo, hi = blocks.parse_block(named[0])
        assert hi <= T
        assert mem.ok(mem.api.post("/zoom", mem.token, json={"block": named[0]}))["block"] == named[0]
        wake = [line for part in mem.wake_all() for line in part["lines"]]
        shown = [b for b in spec_cover(T, wake_lines) if b[1] - b[0] > 1]
        if shown:  # the wake prints #lo-hi lines: the hint names the first of them
            assert (lo, hi) == shown[0] and any(line.startswith(f"#{named[0]} ") for line in wake)
        else:  # every line of the wake is a memory, and the hint says so
            assert all(re.match(r"#\d+ \d{4}-", line) for line in wake) and "no #lo-hi line" in said
