"""The real server over real HTTP: a process started with ``stash serve``,
spoken to through a socket, storing on disk. Expectations come from docs/DESIGN.md
(its algorithms, "Blocks and the tree" to "Import"), from API-REFERENCE.md (the shapes)
or from the test's own record of what it wrote."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile

import pytest

from stash.service import instructions
from tests.support.api import assert_error, matched, member_bytes
from tests.support.docs.printed import orders
from tests.support.server import Http, Server, due_after, start_server, today_range

TOKEN_RE = re.compile(r"stash1_[0-9a-f]{16}_[0-9A-Za-z]{49}")
MEMORY_LINE = re.compile(r"#(\d+) (\d{4}-\d{2}-\d{2}) (.+)")
SUMMARY_LINE = re.compile(r"#(\d+)-(\d+) (.+)")
SPEC_DEFAULTS = {"WAKE_LINES": 96, "WAKE_CHARS": 1000000, "ENTRY_CHARS": 280, "PART_CHARS": 20000, "PART_LINES": 500}


class Life:
    """One identity driven over HTTP, answering every nap as soon as it is
    asked, and remembering what it wrote so the server can be checked."""

    def __init__(self, http: Http, tok: str) -> None:
        self.http = http
        self.tok = tok
        self.texts: list[str] = []
        self.summaries: dict[str, str] = {}

    def note(self, text: str) -> list[str]:
        ans = self.http.ok("POST", "/note", self.tok, json={"text": text})
        assert ans["id"] == len(self.texts)
        self.texts.append(text)
        asked = []
        nap = ans["nap"]
        while nap is not None:
            asked.append(nap["block"])
            summary = f"summary of {nap['block']}"
            res = self.http.ok("POST", "/nap", self.tok, json={"block": nap["block"], "text": summary})
            assert res["saved"] == nap["block"]
            self.summaries[nap["block"]] = summary
            nap = res["nap"]
        return asked

    def check_line(self, line: str) -> tuple[int, int]:
        """The line is a memory or a summary this life wrote; returns its range."""
        m = MEMORY_LINE.fullmatch(line)
        if m and int(m.group(1)) < len(self.texts) and m.group(3) == self.texts[int(m.group(1))]:
            assert m.group(2) in today_range()
            i = int(m.group(1))
            return i, i + 1
        m = SUMMARY_LINE.fullmatch(line)
        assert m, line
        lo, hi = int(m.group(1)), int(m.group(2))
        assert self.summaries[f"{lo}-{hi}"] == m.group(3), line
        return lo, hi + 1


def test_health_names_the_ciphers(http: Http) -> None:
    body = http.ok("GET", "/health")
    assert body["ok"] is True
    assert body["content_cipher"] == "xchacha20-poly1305"
    assert body["file_cipher"] in ("sqlcipher", "none")


def test_server_says_where_its_data_lives(server: Server) -> None:
    first = [line for line in server.log_text().splitlines() if "data" in line]
    assert any(str(server.data.resolve()) in line for line in first), server.log_text()[:2000]


def test_init_returns_a_token_once_and_the_agents_block(http: Http) -> None:
    a = http.init()
    b = http.init()
    assert TOKEN_RE.fullmatch(a["token"]) and TOKEN_RE.fullmatch(b["token"])
    assert a["token"] != b["token"] and a["user_id"] != b["user_id"]
    assert a["token"].split("_")[1] == a["user_id"]
    # The block names the address given in the body and holds no secret.
    c = http.ok("POST", "/init", json={"url": "https://memory.example"})
    assert "https://memory.example" in c["prompt"] and "{url}" not in c["prompt"]
    assert c["token"] not in c["prompt"] and "stash1_" not in c["prompt"]


def test_naps_come_due_in_spec_order(http: Http, token: str) -> None:
    life = Life(http, token)
    for i in range(20):
        assert life.note(f"memory number {i}") == due_after(i + 1), i
    # Nothing remains: every complete block was settled as it came due.
    assert http.ok("POST", "/nap", token, json={})["nap"] is None


def test_nap_object_carries_source_and_a_runnable_prompt(http: Http, token: str) -> None:
    for i in range(3):
        ans = http.ok("POST", "/note", token, json={"text": f"fact {i}"})
    # No block completes at T=3, but 0-1 is still due and every note answer carries it.
    assert ans["nap"]["block"] == "0-1"
    due = http.ok("POST", "/nap", token, json={})["nap"]
    assert due == ans["nap"]
    assert due["block"] == "0-1"
    assert due["max_bytes"] == SPEC_DEFAULTS["ENTRY_CHARS"]
    assert due["remaining"] == 0
    assert [matched(MEMORY_LINE.fullmatch(s)).group(3) for s in due["source"]] == ["fact 0", "fact 1"]
    assert orders(due["prompt"]) == [instructions.render(s) for s in due["run"]]
    assert orders(due["prompt"])[0].startswith("curl ")
    # A wrong block is a 409 naming the due one; nothing is written.
    http.ok("POST", "/note", token, json={"text": "fact 3"})
    body = assert_error(http.post("/nap", token, json={"block": "2-3", "text": "x"}), 409)
    assert "0-1" in body["message"]
    assert http.ok("POST", "/nap", token, json={})["nap"]["block"] == "0-1"


def test_server_prompt_command_runs_as_printed(http: Http, token: str, base_url: str, has_curl: bool) -> None:
    if not has_curl:
        pytest.skip("curl is not installed here")
    http.ok("POST", "/note", token, json={"text": "alpha"})
    nap = http.ok("POST", "/note", token, json={"text": "beta"})["nap"]
    command = orders(nap["prompt"])[0].replace("<your line>", "alpha then beta")
    env = {"PATH": "/usr/bin:/bin", "STASH_URL": base_url, "STASH_TOKEN": token}
    done = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0-1 saved.")
    assert http.ok("GET", "/zoom", token, params={"block": "0-3"})["lines"][0] == "#0-1 alpha then beta"


def test_wake_tiles_the_log_with_what_was_written(http: Http, token: str) -> None:
    life = Life(http, token)
    for i in range(37):
        life.note(f"event {i}")
    http.ok("POST", "/config", token, json={"WAKE_LINES": 7})
    wake = http.ok("GET", "/wake", token)
    assert wake["T"] == 37 and wake["awake"] is True and wake["parts"] == 1
    assert len(wake["lines"]) <= 7
    edge = 0
    sizes = []
    for line in wake["lines"]:
        lo, hi = life.check_line(line)
        assert lo == edge, (line, edge)
        size = hi - lo
        assert size & (size - 1) == 0 and lo % size == 0  # aligned power of two (the design, "Blocks and the tree")
        sizes.append(size)
        edge = hi
    assert edge == 37
    assert sizes == sorted(sizes, reverse=True)  # coarse in the past, fine near the present
    assert sizes[-1] == 1  # the newest memory is shown word for word


def test_wake_parts_fit_together_on_one_snapshot(http: Http, token: str) -> None:
    life = Life(http, token)
    for i in range(11):
        life.note(f"part test {i}")
    whole = http.ok("GET", "/wake", token)["lines"]
    http.ok("POST", "/config", token, json={"PART_LINES": 3})
    first = http.ok("GET", "/wake", token)
    assert first["parts"] == -(-len(whole) // 3) and first["awake"] is False and first["nap"] is None
    # A memory that arrives between parts must not shift a boundary.
    life.note("arrived between parts")
    got = list(first["lines"])
    for k in range(2, first["parts"] + 1):
        part = http.ok("GET", "/wake", token, params={"part": k, "T": first["T"]})
        assert part["T"] == first["T"] and part["part"] == k
        assert part["awake"] is (k == first["parts"])
        got += part["lines"]
    assert got == whole
    assert_error(http.get("/wake", token, params={"part": first["parts"] + 1, "T": first["T"]}), 422)


def test_wake_refuses_until_a_needed_summary_is_written(http: Http, token: str) -> None:
    http.ok("POST", "/config", token, json={"WAKE_LINES": 1})
    for i in range(2):
        http.ok("POST", "/note", token, json={"text": f"needs {i}"})
    body = assert_error(http.get("/wake", token), 409)
    assert body["needs"] == "0-1" and body["nap"]["block"] == "0-1"
    http.ok("POST", "/nap", token, json={"block": "0-1", "text": "both needs"})
    assert http.ok("GET", "/wake", token)["lines"] == ["#0-1 both needs"]


def test_zoom_opens_a_block_into_its_halves(http: Http, token: str) -> None:
    life = Life(http, token)
    for i in range(10):
        life.note(f"zoom {i}")
    assert http.ok("GET", "/zoom", token, params={"block": "0-7"}) == {
        "block": "0-7",
        "lines": [f"#0-3 {life.summaries['0-3']}", f"#4-7 {life.summaries['4-7']}"],
    }
    lines = http.ok("POST", "/zoom", token, json={"block": "8-9"})["lines"]
    assert [life.check_line(x) for x in lines] == [(8, 9), (9, 10)]
    # 8-15 is not complete: its first half is "not compressed yet", its second lies beyond T.
    assert http.ok("GET", "/zoom", token, params={"block": "8-15"})["lines"] == ["#8-11 not compressed yet"]
    assert_error(http.get("/zoom", token, params={"block": "16-31"}), 422)


def test_recall_searches_the_log_newest_first_within_a_part(http: Http, token: str) -> None:
    texts = [f"{'Kettle' if i % 3 == 0 else 'spoon'} story {i}" for i in range(12)]
    life = Life(http, token)
    for t in texts:
        life.note(t)
    ans = http.ok("GET", "/recall", token, params={"q": "kettLE"})
    expected = [i for i, t in enumerate(texts) if "kettle" in t.lower()]
    assert ans["total"] == len(expected)
    assert [matched(MEMORY_LINE.fullmatch(x)).group(1) for x in ans["matches"]] == [str(i) for i in expected]
    assert ans == http.ok("POST", "/recall", token, json={"q": "kettLE"})
    # Summaries are never searched: only the verbatim log.
    assert http.ok("POST", "/recall", token, json={"q": "summary of"})["total"] == 0
    full = http.ok("POST", "/recall", token, json={"q": "story"})
    assert [life.check_line(x) for x in full["matches"]] == [(i, i + 1) for i in range(12)]
    # A part of PART_CHARS bytes keeps only the newest matches that fit (each line costs its bytes + 1).
    http.ok("POST", "/config", token, json={"PART_CHARS": 100})
    fits: list[str] = []
    size = 0
    for line in reversed(full["matches"]):
        size += len(line.encode()) + 1
        if size > 100:
            break
        fits.insert(0, line)
    assert 0 < len(fits) < 12
    cut = http.ok("POST", "/recall", token, json={"q": "story"})
    assert {k: cut[k] for k in ("matches", "total")} == {"matches": fits, "total": 12}
    # It says it was cut, and where the next older page starts: the oldest match shown.
    assert cut["more"] == int(matched(MEMORY_LINE.fullmatch(fits[0])).group(1))
    assert cut["message"].startswith("12 matches.")
    assert_error(http.post("/recall", token, json={"q": "(unclosed"}), 422)


def test_forget_drops_the_summary_and_what_was_built_on_it(http: Http, token: str) -> None:
    life = Life(http, token)
    for i in range(16):
        life.note(f"forget {i}")
    dropped = http.ok("POST", "/forget", token, json={"block": "4-5"})["dropped"]
    # docs/DESIGN.md, "Forget": at each larger size, the containing block and every later block of that level.
    assert dropped == ["4-5", "6-7", "8-9", "10-11", "12-13", "14-15", "4-7", "8-11", "12-15", "0-7", "8-15", "0-15"]
    assert http.ok("POST", "/nap", token, json={})["nap"]["block"] == "4-5"
    assert http.ok("GET", "/zoom", token, params={"block": "0-7"})["lines"] == [
        f"#0-3 {life.summaries['0-3']}",
        "#4-7 not compressed yet",
    ]
    assert_error(http.post("/forget", token, json={"block": "4-5"}), 404)
    # The log is untouched.
    assert http.ok("POST", "/recall", token, json={"q": "forget"})["total"] == 16


def test_config_defaults_set_and_restore(http: Http, token: str) -> None:
    assert http.ok("GET", "/config", token) == {"sizes": SPEC_DEFAULTS, "defaults": SPEC_DEFAULTS}
    changed = http.ok("POST", "/config", token, json={"WAKE_LINES": 64, "PART_LINES": 9})
    assert changed["sizes"] == {**SPEC_DEFAULTS, "WAKE_LINES": 64, "PART_LINES": 9}
    assert http.ok("GET", "/config", token)["sizes"]["WAKE_LINES"] == 64
    restored = http.ok("POST", "/config", token, json={"WAKE_LINES": None})
    assert restored["sizes"] == {**SPEC_DEFAULTS, "PART_LINES": 9}
    assert_error(http.post("/config", token, json={"ENTRY_CHARS": 281}), 422)
    assert_error(http.post("/config", token, json={"NOT_A_SIZE": 1}), 422, "config.unknown_name")
    assert http.ok("GET", "/config", token)["sizes"] == {**SPEC_DEFAULTS, "PART_LINES": 9}


def test_import_appends_dated_memories_all_or_nothing(http: Http, token: str) -> None:
    entries = [{"date": f"2023-0{1 + i // 4}-1{i % 4}", "text": f"imported {i}"} for i in range(9)]
    bad = [*entries[:3], {"date": "2023-02-30", "text": "no such day"}, *entries[3:]]
    body = assert_error(http.post("/import", token, json={"entries": bad}), 422)
    assert body.get("index") == 3
    assert http.ok("GET", "/wake", token)["T"] == 0
    ans = http.ok("POST", "/import", token, json={"entries": entries})
    # 9 memories complete 0-1, 2-3, 4-5, 6-7, 0-3, 4-7, 0-7: seven blocks, none settled.
    assert ans.pop("head")["count"] == 9
    assert ans == {"first": 0, "last": 8, "pending": 7, "run": [instructions.nap_status()]}
    lines = http.ok("GET", "/wake", token)["lines"]
    assert lines == [f"#{i} {e['date']} {e['text']}" for i, e in enumerate(entries)]
    # Nothing older than the newest memory may follow it.
    assert_error(http.post("/import", token, json={"entries": [{"date": "2023-01-01", "text": "late"}]}), 422)


def test_export_is_an_optmem_directory(http: Http, token: str) -> None:
    life = Life(http, token)
    for i in range(5):
        life.note(f"exported {i}")
    resp = http.get("/export", token)
    assert resp.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        names = tar.getnames()
        log = member_bytes(tar, "memory/LOG.txt").decode()
        tree = {n: member_bytes(tar, n).decode() for n in names if n.startswith("memory/TREE/")}
    got = [line.rstrip() for line in log.splitlines()]
    assert [life.check_line(x) for x in got] == [(i, i + 1) for i in range(5)]
    written = {line.rstrip() for text in tree.values() for line in text.splitlines()}
    assert written == set(life.summaries.values())


def test_scopes_and_bad_tokens(http: Http, token: str) -> None:
    reader = http.ok("POST", "/grants", token, json={"scope": "read"})["token"]
    assert http.ok("GET", "/wake", reader)["T"] == 0
    assert_error(http.post("/note", reader, json={"text": "a reader may not write"}), 403)
    assert_error(http.get("/export", reader), 403)
    assert_error(http.get("/wake", "not-a-token"), 401)
    assert_error(http.get("/wake"), 401)
    # A token in a query string is refused and the request does nothing.
    assert_error(http.get("/wake", params={"token": token}), 400)


@pytest.fixture(scope="module")
def second_server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("e2e-restart"))
    yield srv
    srv.stop()


def test_memory_survives_a_restart(second_server: Server) -> None:
    http = Http(second_server.url)
    try:
        tok = http.init()["token"]
        life = Life(http, tok)
        for i in range(3):
            life.note(f"durable {i}")
        before = http.ok("GET", "/wake", tok)
    finally:
        http.close()
    second_server.stop()
    second_server.start()
    http = Http(second_server.url)
    try:
        assert http.ok("GET", "/wake", tok) == before
    finally:
        http.close()
