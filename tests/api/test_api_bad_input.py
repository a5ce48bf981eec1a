"""Bad input: every refusal has the status and error shape of
(docs/DESIGN.md, "HTTP surface") and error shape, and changes
nothing — the log, the tree, the config, what is due and the wake read the
same before and after."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.api.support import OLD_DATE, Mem, state, today_utc
from tests.support.api import Api, assert_error

BAD_LINES = [
    pytest.param("", id="empty"),
    pytest.param("   ", id="spaces"),
    pytest.param(" \u3000 ", id="ideographic-space"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a\r\nb", id="crlf"),
    pytest.param("a\rb", id="cr"),
    pytest.param("a\u2028b", id="line-separator"),
    pytest.param("a\u2029b", id="paragraph-separator"),
    pytest.param("a\x85b", id="next-line"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\x1bb", id="escape"),
    pytest.param("a\tb", id="tab"),
    pytest.param("a\x7fb", id="delete"),
    pytest.param("trailing break\n", id="trailing-newline"),
    pytest.param("x" * 281, id="281-ascii"),
    pytest.param("é" * 141, id="282-bytes-in-141-chars"),
    pytest.param("🙂" * 70 + "x", id="281-bytes-emoji"),
    pytest.param(12, id="number"),
    pytest.param(None, id="null"),
    pytest.param(["a"], id="list"),
]


class Seeded(Mem):
    pristine: dict[str, bytes] | None = None


@pytest.fixture(scope="module")
def seeded_once(module_api: Api) -> Seeded:
    """Five memories, one summary, one changed size: something to disturb.
    Shared by the module; every test starts by checking it is still pristine."""
    mem = Seeded(module_api, module_api.init()["token"])
    mem.import_([f"seed memory {k}" for k in range(5)])
    mem.nap("0-1", "the first pair")
    mem.set_config(PART_LINES=50)
    mem.pristine = state(module_api, mem.token)
    return mem


@pytest.fixture
def seeded(seeded_once: Seeded) -> Seeded:
    return seeded_once


def refused(mem: Mem, status: int, method: str, url: str, code: str | None = None, **kw) -> dict:
    before = state(mem.api, mem.token)
    if isinstance(mem, Seeded):
        assert before == mem.pristine, "an earlier refused request changed the shared memory"
    body = assert_error(mem.api.request(method, url, mem.token, **kw), status, code)
    assert state(mem.api, mem.token) == before, f"{method} {url} was refused but changed the memory"
    return body


# ---------------------------------------------------------------- memories and summaries


@pytest.mark.parametrize("text", BAD_LINES)
def test_bad_memory_is_422_and_writes_nothing(seeded: Mem, text) -> None:
    refused(seeded, 422, "POST", "/note", json={"text": text})


@pytest.mark.parametrize("text", BAD_LINES)
def test_bad_summary_is_422_and_writes_nothing(seeded: Mem, text) -> None:
    refused(seeded, 422, "POST", "/nap", json={"block": "2-3", "text": text})


def test_byte_limit_is_bytes_not_characters(mem: Mem) -> None:
    mem.import_(["a", "b"])
    for text in ("é" * 100, "x" * 280, "é" * 140, "🙂" * 70, "  " + "x" * 280 + "  "):
        assert mem.note(text)["id"] == len(mem.log) - 1
    assert mem.nap("0-1", "é" * 140)["saved"] == "0-1"
    assert mem.nap("2-3", "x" * 280)["saved"] == "2-3"


# ---------------------------------------------------------------- malformed requests


@pytest.mark.parametrize(
    ("url", "raw"),
    [
        ("/note", b'{"text": "unterminated'),
        ("/note", b"{text: 'single quotes'}"),
        ("/nap", b'{"block": "2-3",}'),
        ("/forget", b"not json at all"),
        ("/config", b"{"),
        ("/import", b'{"entries": [}'),
        ("/note", b'["text"]'),
        ("/note", b'"just a string"'),
        ("/nap", b"\xff\xfe{}"),
    ],
)
def test_malformed_json_is_400(seeded: Mem, url: str, raw: bytes) -> None:
    refused(seeded, 400, "POST", url, content=raw, headers={"Content-Type": "application/json"})


def test_body_over_the_cap_is_413(seeded: Mem) -> None:
    refused(seeded, 413, "POST", "/note", json={"text": "x" * 70_000})
    refused(seeded, 413, "POST", "/nap", json={"block": "2-3", "text": "y" * 300_000})


def test_streamed_body_over_the_cap_is_413(seeded: Mem) -> None:
    """Without a Content-Length the cap still holds while reading."""

    async def chunks():
        yield b'{"text": "'
        for _ in range(70):
            yield b"z" * 1024
        yield b'"}'

    refused(seeded, 413, "POST", "/note", content=chunks())


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("POST", "/note", {"txt": "a typo"}),
        ("POST", "/note", {"text": "fine", "tags": ["x"]}),
        ("POST", "/nap", {"blok": "2-3", "text": "a typo"}),
        ("POST", "/forget", {"block": "0-1", "cascade": True}),
        ("POST", "/import", {"entries": [{"date": OLD_DATE, "text": "x"}], "dry_run": True}),
        ("POST", "/wake", {"parts": 2}),
        ("POST", "/recall", {"query": "seed"}),
        ("POST", "/zoom", {"blocks": "0-1"}),
        ("GET", "/wake?prt=2", None),
        ("GET", "/recall?q=seed&limit=3", None),
        ("GET", "/zoom?block=0-3&depth=2", None),
        ("GET", "/config?verbose=1", None),
    ],
)
def test_unknown_field_is_400(seeded: Mem, method: str, url: str, body) -> None:
    kw = {} if body is None else {"json": body}
    refused(seeded, 400, method, url, "request.unknown_field", **kw)


@pytest.mark.parametrize(("url", "body"), [("/note", {}), ("/forget", {}), ("/import", {})])
def test_missing_field_is_400(seeded: Mem, url: str, body: dict) -> None:
    refused(seeded, 400, "POST", url, json=body)


def test_token_in_the_query_is_refused(seeded: Mem) -> None:
    refused(seeded, 400, "GET", f"/wake?token={seeded.token}", "auth.token_in_query")
    refused(seeded, 400, "GET", f"/config?access_token={seeded.token}", "auth.token_in_query")


# ---------------------------------------------------------------- blocks


@pytest.mark.parametrize(
    "block",
    ["5-6", "0-2", "1-2", "7-4", "3-3", "0-0", "2-5", "-1-0", "a-b", "0_1", "", " 0-1", "#0-1", 3, None, ["0-1"]],
)
@pytest.mark.parametrize("route", ["nap", "forget", "zoom"])
def test_block_that_is_not_a_block_is_422(seeded: Mem, route: str, block) -> None:
    body = {"block": block, "text": "a line"} if route == "nap" else {"block": block}
    if route == "nap" and block is None:
        body = {"block": None, "text": "a line"}  # a text without its block
    refused(seeded, 422, "POST", f"/{route}", json=body)


@pytest.mark.parametrize("block", ["4-7", "6-7", "8-15", "0-7"])
@pytest.mark.parametrize("route", ["nap", "forget"])
def test_block_beyond_the_log_is_422(seeded: Mem, route: str, block: str) -> None:
    body = {"block": block, "text": "a line"} if route == "nap" else {"block": block}
    refused(seeded, 422, "POST", f"/{route}", json=body)


@pytest.mark.parametrize("block", ["6-7", "8-15", "128-255"])
def test_zoom_starting_beyond_the_log_is_422(seeded: Mem, block: str) -> None:
    refused(seeded, 422, "GET", f"/zoom?block={block}")


def test_nap_for_the_wrong_block_is_409(seeded: Mem) -> None:
    body = refused(seeded, 409, "POST", "/nap", json={"block": "0-3", "text": "too early"})
    assert body["due"] == "2-3"


def test_forget_of_an_unwritten_summary_is_404(seeded: Mem) -> None:
    refused(seeded, 404, "POST", "/forget", json={"block": "2-3"})


# ---------------------------------------------------------------- wake, recall, shape parameters


@pytest.mark.parametrize(
    "query", ["part=0", "part=2", "part=x", "part=-1", "T=6", "T=99", "T=-1", "T=1.5", "part=2&T=5", "part=1&part=1"]
)
def test_bad_wake_parameters(seeded: Mem, query: str) -> None:
    status = 400 if query == "part=1&part=1" else 422
    code = seeded.api.get(f"/wake?{query}", seeded.token).json().get("error", "")
    assert code == code.lower(), (
        f"error codes are stable lowercase dotted names (tests/conftest.py ERROR_CODE); got {code!r} — "
        "stash/service/memory.py Memory.wake raised an uppercase code"
    )
    refused(seeded, status, "GET", f"/wake?{query}")


@pytest.mark.parametrize("q", ["(", "a)", "[z-a]", r"(a)\1", "(?=x)", "x{2000}", "a" * 5000, ""])
def test_bad_recall_pattern_is_422(seeded: Mem, q: str) -> None:
    refused(seeded, 422, "POST", "/recall", json={"q": q})


def test_recall_without_a_pattern_is_400(seeded: Mem) -> None:
    refused(seeded, 400, "GET", "/recall")


@pytest.mark.parametrize("query", ["T=-1", "lines=0", "lines=1001", "T=x", "T=10000000000000000"])
def test_bad_shape_parameters(api: Api, query: str) -> None:
    assert_error(api.get(f"/shape?{query}"), 422)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"WAKE_LINES": 0}, id="zero"),
        pytest.param({"ENTRY_CHARS": 281}, id="entry-chars-over-280"),
        pytest.param({"ENTRY_CHARS": 0}, id="entry-chars-zero"),
        pytest.param({"PART_CHARS": -1}, id="negative"),
        pytest.param({"WAKE_LINES": "ten"}, id="string"),
        pytest.param({"WAKE_LINES": "64"}, id="numeric-string"),
        pytest.param({"PART_LINES": True}, id="boolean"),
        pytest.param({"WAKE_CHARS": 1.5}, id="float"),
        pytest.param({"WAKE_CHARS": [5]}, id="list"),
        pytest.param({"WAKE_LINES": 64, "PART_LINES": 0}, id="one-good-one-bad"),
        pytest.param({}, id="nothing-to-change"),
    ],
)
def test_bad_config_value_is_422(seeded: Mem, change: dict) -> None:
    refused(seeded, 422, "POST", "/config", json=change)


@pytest.mark.parametrize("change", [{"WAKE_LINE": 64}, {"wake_lines": 64}, {"NOT_A_SIZE": None}])
def test_config_name_that_does_not_exist_is_422(seeded: Mem, change: dict) -> None:
    body = seeded.api.post("/config", seeded.token, json=change)
    assert body.status_code == 422, (
        "an unknown size name is a valid JSON object with an invalid value (the design's HTTP surface: 422); "
        f"got {body.status_code} {body.text}. Fix: stash/web/routes/agent.py config_set should read the body "
        "with any field names and let sizes.validate_changes refuse it (config.unknown_name)"
    )
    refused(seeded, 422, "POST", "/config", json=change)


# ---------------------------------------------------------------- import


def entries(*dates_texts) -> dict:
    return {"entries": [{"date": d, "text": t} for d, t in dates_texts]}


def future() -> str:
    return (today_utc() + dt.timedelta(days=2)).isoformat()


IMPORT_CASES = [
    pytest.param(lambda: entries((OLD_DATE, "ok"), ("2026-02-30", "no such day")), 1, id="feb-30"),
    pytest.param(lambda: entries(("2026-1-1", "not padded")), 0, id="unpadded"),
    pytest.param(lambda: entries((OLD_DATE, "ok"), (OLD_DATE, "ok"), ("yesterday", "words")), 2, id="words"),
    pytest.param(lambda: entries(("2021-13-01", "month 13")), 0, id="month-13"),
    pytest.param(lambda: entries(("2021-03-04T10:00:00", "a time")), 0, id="datetime"),
    pytest.param(lambda: entries(("2021-03-03", "before the newest memory")), 0, id="before-log"),
    pytest.param(lambda: entries(("2021-05-01", "later"), ("2021-04-01", "earlier")), 1, id="out-of-order"),
    pytest.param(lambda: entries((OLD_DATE, "ok"), (future(), "tomorrow's news")), 1, id="future"),
    pytest.param(lambda: entries((OLD_DATE, "ok"), (OLD_DATE, "x" * 281)), 1, id="oversized"),
    pytest.param(lambda: entries((OLD_DATE, "ok"), (OLD_DATE, "é" * 141)), 1, id="oversized-bytes"),
    pytest.param(lambda: entries((OLD_DATE, "two\nlines")), 0, id="multiline"),
    pytest.param(lambda: entries((OLD_DATE, "ok"), (OLD_DATE, "   ")), 1, id="blank"),
    pytest.param(lambda: entries((OLD_DATE, "ok"), (OLD_DATE, "a\x00b")), 1, id="control"),
    pytest.param(lambda: {"entries": [{"date": OLD_DATE, "text": "ok"}, {"date": OLD_DATE}]}, 1, id="no-text"),
    pytest.param(lambda: {"entries": [{"date": OLD_DATE, "text": "ok", "id": 4}]}, 0, id="extra-key"),
    pytest.param(lambda: {"entries": [{"date": 20210304, "text": "ok"}]}, 0, id="numeric-date"),
    pytest.param(lambda: {"entries": ["2021-03-04 a bare string"]}, 0, id="not-an-object"),
]


@pytest.mark.parametrize(("make", "index"), IMPORT_CASES)
def test_bad_import_refuses_the_whole_batch_naming_the_entry(seeded: Mem, make, index: int) -> None:
    body = refused(seeded, 422, "POST", "/import", json=make())
    assert body.get("index") == index, body


@pytest.mark.parametrize("payload", [{"entries": []}, {"entries": "2021-03-04 x"}, {"entries": None}])
def test_import_without_entries_is_422(seeded: Mem, payload: dict) -> None:
    refused(seeded, 422, "POST", "/import", json=payload)


def test_import_before_a_note_of_today_is_refused(mem: Mem) -> None:
    mem.note("noted today")
    body = refused(mem, 422, "POST", "/import", json=entries((OLD_DATE, "from the past")))
    assert body.get("index") == 0
