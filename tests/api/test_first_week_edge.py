"""The first week's stumbles at the HTTP edge (issue 30): a 404 for a
trailing slash says to drop it, a 404 answers plain text when asked, the
landing page says what the client says and fits its column."""

from __future__ import annotations

import html
import re

from tests.support.api import Api


def test_a_trailing_slash_is_told_to_drop_it(api: Api, owner: str) -> None:
    resp = api.post("/note/", owner, json={"text": "x"})
    assert resp.status_code == 404 and resp.json()["error"] == "route.unknown"
    assert "drop the trailing slash (/note)" in resp.json()["message"]
    other = api.post("/nothing/", owner, json={})
    assert other.status_code == 404 and "trailing slash" not in other.json()["message"]


def test_a_404_answers_plain_text_when_asked(api: Api) -> None:
    resp = api.get("/nothing", headers={"Accept": "text/plain"})
    assert resp.status_code == 404 and resp.headers["content-type"].startswith("text/plain")
    assert resp.headers["stash-error"] == "route.unknown"
    assert resp.text.startswith("No such route") and "{" not in resp.text


def landing(api: Api) -> str:
    resp = api.get("/")
    assert resp.status_code == 200
    return resp.text


def test_the_landing_sample_says_what_the_client_says(api: Api) -> None:
    from stash.web.plaintext import answer_text

    page = landing(api)
    sample = page.split("<pre><code>", 1)[1].split("</code></pre>", 1)[0]
    saved = answer_text("/note", {"id": 999, "nap": None}).strip()  # the client prints the same line
    assert sample.splitlines()[1] == saved == "Saved as #999."


def test_the_landing_route_table_names_each_route_as_the_docs_call_it(api: Api) -> None:
    # A read with a POST twin goes by its GET when that needs no parameter (GET /health, GET /wake, as every
    # document and the first printed command call them), else by the twin, which takes no query string.
    doc = api.get("/openapi.json").json()["paths"]
    page = landing(api)
    rows = re.findall(r"<tr><td>(GET|POST|DELETE) (/\w+)</td>", page)
    assert ("GET", "/wake") in rows and ("POST", "/recall") in rows
    for method, path in rows:
        ops = doc[path]
        assert method.lower() in ops
        # A search needs its q or words, though neither alone is required.
        params = ops["get"].get("parameters", []) if "get" in ops else []
        bare = "get" in ops and not any(q.get("required") or q["name"] == "q" for q in params)
        assert method == ("GET" if bare else method), (method, path)
    script = page.split("<script>", 1)[1]
    assert "bare" in script and '(m === "post") === !!bare' in script
    assert 'q.name === "q"' in script  # the live table follows the same rule


def test_the_landing_quickstart_fits_its_column(api: Api) -> None:
    # main is 860 px less 40 of padding, the pre 34 more: 786 px of 14 px monospace (0.6 em a character) is
    # 93 characters. Each line stays well inside that for an address as long as the one a local server has.
    page = landing(api).replace("http://stash.test", "http://127.0.0.1:8080")
    block = page.split("<h2>Quickstart</h2>", 1)[1].split("</pre>", 1)[0]
    text = html.unescape(re.sub(r"<[^>]+>", "", block))
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and max(map(len, lines)) <= 84, max(lines, key=len)


def test_a_form_body_is_told_about_text_plain(api: Api, owner: str) -> None:
    # curl -d 'text' sends the line as a form.
    resp = api.post(
        "/note", owner, content=b"chose jade", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert resp.status_code == 400 and resp.json()["error"] == "request.bad_json"
    assert "Content-Type: text/plain" in resp.json()["message"] and "form" in resp.json()["message"]


def test_a_batch_answer_fits_in_one_part_and_its_offer_sizes_itself(api: Api, owner: str) -> None:
    part = 4_000
    assert api.post("/config", owner, json={"PART_CHARS": part}).status_code == 200
    for i in range(64):
        assert api.post("/note", owner, json={"text": f"{i:03d} " + "é" * 130}).status_code == 200
    nap = api.post("/nap", owner, json={}).json()["nap"]
    offer = next(s["fields"]["batch"] for s in nap["run"] if "batch" in (s.get("fields") or {}))
    assert 1 < offer < nap["remaining"] + 1  # fewer than are due: the offer is what one part holds
    offered = api.post("/nap", owner, json={"batch": offer}).json()
    assert len(offered["batch"]) == offer and len(offered["prompt"].encode()) <= part
    # Asking for more than fits gets what fits, in text as in JSON, and says the rest remain.
    big = api.post("/nap", owner, json={"batch": 256}, headers={"Accept": "text/plain"})
    assert big.status_code == 200 and len(big.text.encode()) <= part
    assert "will remain after these" in big.text
    ans = api.post("/nap", owner, json={"batch": 256}).json()
    assert len(ans["prompt"].encode()) <= part and len(ans["batch"]) >= offer


def test_an_import_of_older_dates_says_to_use_a_new_memory(api: Api, owner: str) -> None:
    assert api.post("/note", owner, json={"text": "today"}).status_code == 200
    resp = api.post("/import", owner, json={"entries": [{"date": "2020-01-01", "text": "old"}]})
    assert resp.status_code == 422 and resp.json()["error"] == "import.before_log"
    assert "new, empty memory" in resp.json()["message"] and "init" in resp.json()["message"]


def test_an_empty_text_names_the_here_documents_end_line(api: Api, owner: str) -> None:
    # What a here-document sends when a pasted line equal to its end line closed it before the text.
    resp = api.post("/note", owner, content=b"\n", headers={"Content-Type": "text/plain"})
    assert resp.status_code == 422 and resp.json()["error"] == "text.empty"
    assert "STASH_END" in resp.json()["message"]


def test_a_read_capabilitys_refusal_says_what_its_block_says(api: Api, owner: str) -> None:
    reader = api.post("/grants", owner, json={"scope": "read"}).json()
    resp = api.post("/note", reader["token"], json={"text": "x"})
    assert resp.status_code == 403 and resp.json()["error"] == "auth.scope"
    assert "tell the user" in resp.json()["message"].lower() and "tell the user" in reader["prompt"].lower()


def test_a_full_grants_block_says_the_log_is_shared(api: Api, owner: str) -> None:
    full = api.post("/grants", owner, json={"scope": "full"}).json()
    init = api.init()
    assert full["prompt"] != init["prompt"]
    assert "other agents write to the same log" in full["prompt"]
    assert "same log" not in init["prompt"]


def test_a_refused_batch_says_how_to_go_on(api: Api, owner: str) -> None:
    for i in range(4):
        api.post("/note", owner, json={"text": f"n{i}"})
    resp = api.post("/nap", owner, json={"summaries": [{"block": "0-1", "text": "fine"}, {"block": "2-3", "text": ""}]})
    assert resp.status_code == 422
    assert "send all 2 again" in resp.json()["message"]


def test_a_zoom_past_the_end_hands_over_a_zoom_that_opens(api: Api, owner: str) -> None:
    for i in range(4):
        api.post("/note", owner, json={"text": f"z{i}"})
    resp = api.post("/zoom", owner, json={"block": "64-127"})
    assert resp.status_code == 422 and resp.json()["error"] == "block.beyond_log"
    (step,) = resp.json()["run"]
    assert step["path"] == "/zoom" and step["fields"] == {"block": "0-3"}
    assert api.post("/zoom", owner, json=step["fields"]).status_code == 200
    text = api.post("/zoom", owner, json={"block": "64-127"}, headers={"Accept": "text/plain"}).text
    assert "Run: curl" in text and "0-3" in text.split("Run:", 1)[1]


def test_a_500_logs_its_frames_and_never_a_value(api: Api, owner: str, monkeypatch, caplog) -> None:
    import logging

    from stash.service.memory import Memory

    secret = "the memory text that must never reach a log"

    def broken(self, text):
        raise KeyError(secret)

    monkeypatch.setattr(Memory, "note", broken)
    monkeypatch.delenv("STASH_DEBUG", raising=False)
    caplog.set_level(logging.ERROR, logger="stash.error")
    resp = api.post("/note", owner, json={"text": secret})
    assert resp.status_code == 500 and secret not in resp.text and "Traceback" not in resp.text
    (line,) = [r.getMessage() for r in caplog.records if r.name == "stash.error"]
    assert line.startswith("unhandled KeyError on /note: KeyError at ")
    assert "test_first_week_edge.py:" in line and " broken" in line and "stash/web/app.py:" in line
    assert secret not in line and "/work/" not in line and "/home/" not in line
    caplog.clear()
    monkeypatch.setenv("STASH_DEBUG", "1")  # a developer's machine: the whole trace, values and all
    api.post("/note", owner, json={"text": secret})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "stash.error"]
    assert "Traceback (most recent call last)" in line and secret in line
