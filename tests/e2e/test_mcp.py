"""``stash mcp`` driven by the MCP SDK's own client over stdio, against a real
``stash serve``: each tool's answer is checked against what the server says
over plain HTTP, and each next step a tool names (``Call: nap(...)``) is
called exactly as named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHEAP_KDF_FLAGS, assert_error
from tests.live import CLI_TIMEOUT, REPO, Http, settle_all, start_server
from tests.mcp_session import Session, call_line, run_session

pytestmark = pytest.mark.slow

TOOLS = {"wake": {"part", "T"}, "note": {"text"}, "nap": {"block", "text", "batch", "summaries"},
         "recall": {"q", "before", "words"}, "zoom": {"block"}, "forget": {"block"}}
REQUIRED = {"wake": set(), "note": {"text"}, "nap": set(), "recall": set(), "zoom": {"block"}, "forget": {"block"}}
def prompt_body(prompt: str) -> list[str]:
    """A nap prompt up to its first order, the one that answers it."""
    lines = prompt.rstrip("\n").splitlines()
    return lines[:next(k for k, line in enumerate(lines) if line.startswith(("Run: ", "Call: ")))]


def test_every_tool_against_the_http_api(base_url: str, http: Http, token: str, tmp_path: Path) -> None:
    answers: list[str] = []

    async def script(s: Session) -> None:
        async def ok(tool: str, **args: object) -> str:
            text = await s.ok(tool, **args)
            answers.append(text)
            return text

        listed = await s.client.list_tools()
        assert {t.name: set(t.input_schema["properties"]) for t in listed.tools} == TOOLS
        assert {t.name: set(t.input_schema.get("required", [])) for t in listed.tools} == REQUIRED
        assert all(len(t.description or "") > 80 for t in listed.tools)
        assert all(t.annotations.read_only_hint for t in listed.tools if t.name in ("wake", "recall", "zoom"))
        assert not any(t.annotations.read_only_hint for t in listed.tools if t.name in ("note", "nap", "forget"))

        # An empty memory: awake at once, told how to note the first memory, as a tool call.
        empty = (await ok("wake")).splitlines()
        assert empty[1:] == ["You are awake.", 'Call: note(text="<one line>")'] and "curl" not in empty[0]

        # note answers the id; the second carries the due nap, its instruction a call of nap.
        http.ok("POST", "/config", token, json={"WAKE_LINES": 1})
        assert await ok("note", text="first") == "Saved as #0."
        second = await ok("note", text="second ünïcödé ✓")
        assert second.splitlines()[:2] == ["Saved as #1.", ""]
        due = http.ok("POST", "/nap", token, json={})["nap"]
        assert prompt_body(second)[2:] == prompt_body(due["prompt"])
        assert call_line(second) == ("nap", {"block": "0-1", "text": "<your line>"})
        assert http.ok("POST", "/recall", token, json={"q": "second"})["matches"][0].endswith(" second ünïcödé ✓")

        # A wake that needs that summary is a tool error: the server's message, then the nap.
        text, error = await s.call("wake")
        refusal = assert_error(http.get("/wake", token), 409)
        message, prompt = text.split("\n\n", 1)
        assert error and message == refusal["message"]
        assert prompt_body(prompt) == prompt_body(refusal["nap"]["prompt"]) and "curl" not in text
        assert text.splitlines()[-1] == "Call: wake()"

        saved = await s.follow(prompt, your_line="first and second")
        assert saved.splitlines() == ["0-1 saved.", "Nothing left to compress."]
        assert http.ok("GET", "/zoom", token, params={"block": "0-3"})["lines"] == ["#0-1 first and second"]
        assert (await ok("wake")).splitlines() == http.ok("GET", "/wake", token)["lines"] + ["You are awake."]
        http.ok("POST", "/config", token, json={"WAKE_LINES": None})

        # recall answers the server's matches, and says when it shows only the newest.
        for word in ("Teapot", "kettle", "TEAPOT again", "spoon", "teapot third"):
            await ok("note", text=word)
        settle_all(http, token)
        assert (await ok("recall", q="teapot")).splitlines() == http.ok(
            "POST", "/recall", token, json={"q": "teapot"})["matches"] + ["3 matches."]
        assert await ok("recall", q="no such word") == "No match."
        http.ok("POST", "/config", token, json={"PART_CHARS": 60})
        cut = http.ok("POST", "/recall", token, json={"q": "teapot"})
        assert cut["total"] == 3 and len(cut["matches"]) < 3
        shown = (await ok("recall", q="teapot")).splitlines()
        assert shown[:-2] == cut["matches"]
        assert shown[-2:] == [f"3 matches. The newest {len(cut['matches'])} are shown; the command below fetches "
                              "the older ones.", f'Call: recall(q="<the same regex>", before={cut["more"]})']
        # recall by words: best first, folded, and the call for the next page names the server's cursor.
        words = http.ok("POST", "/recall", token, json={"words": "TEAP"})
        assert words["total"] == 3 and words["more"] is not None
        shown = (await ok("recall", words="TEAP")).splitlines()
        assert shown[: len(words["matches"])] == words["matches"]
        assert shown[-1] == f'Call: recall(words="<the same words>", before="{words["more"]}")'
        assert (await ok("recall", words="TEAP", before=words["more"])).splitlines()[0] == http.ok(
            "POST", "/recall", token, json={"words": "teap", "before": words["more"]})["matches"][0]
        http.ok("POST", "/config", token, json={"PART_CHARS": None})

        # zoom answers the halves the server names.
        for block in ("0-3", "4-7", "0-1"):
            assert (await ok("zoom", block=block)).splitlines() == http.ok(
                "GET", "/zoom", token, params={"block": block})["lines"]

        # A wake in parts: each part names the call for the next, which reads it.
        whole = http.ok("GET", "/wake", token)["lines"]
        http.ok("POST", "/config", token, json={"PART_LINES": 2})
        got, text = [], await ok("wake")
        for _ in range(len(whole)):
            # Each part of several opens with the header curl's text/plain part has.
            lines = [line for line in text.splitlines() if not line.startswith("Your memory, part ")]
            if lines[-1] == "You are awake.":
                got += lines[:-1]
                break
            assert lines[-2] == "Not awake yet." and lines[-1].startswith("Call: wake(part=")
            got += lines[:-2]
            text = await s.follow(text)
        assert got == whole
        http.ok("POST", "/config", token, json={"PART_LINES": None})

        # forget drops the summary, the blocks containing it and every later summary of
        # their sizes (each size stays a dense prefix); the nap its answer carries starts
        # the rebuild, each answer naming the next.
        dropped = await ok("forget", block="2-3")
        assert dropped.splitlines()[:2] == [
            "Dropped 3 summaries: 2-3, 4-5, 0-3. The log is untouched; the next naps write them again.", ""]
        text = dropped
        rebuilt = []
        while "Call: nap(block=" in text:
            due = http.ok("POST", "/nap", token, json={})["nap"]
            assert call_line(text) == ("nap", {"block": due["block"], "text": "<your line>"})
            # The batch the prompt offers is named as a tool call too.
            assert prompt_body(text)[-len(prompt_body(due["prompt"])):] == prompt_body(due["prompt"])
            offers = [s["fields"]["batch"] for s in due["run"][1:]]
            assert [line for line in text.splitlines() if line.startswith("Call: nap(batch=")] == [
                f"Call: nap(batch={k})" for k in offers] and "curl" not in text
            rebuilt.append(due["block"])
            text = await s.follow(text, your_line=f"rebuilt {due['block']}")
        assert rebuilt == ["2-3", "4-5", "0-3"]
        assert text.splitlines() == ["0-3 saved.", "Nothing left to compress."]
        assert http.ok("GET", "/zoom", token, params={"block": "0-7"})["lines"] == ["#0-3 rebuilt 0-3",
                                                                                     "#4-7 not compressed yet"]
        assert await ok("nap") == "Nothing left to compress."

        # Refusals are tool errors carrying the server's message and nothing else.
        http.ok("POST", "/forget", token, json={"block": "4-5"})
        for tool, args, status, method, path, kw in (
            ("zoom", {"block": "64-127"}, 422, "GET", "/zoom", {"params": {"block": "64-127"}}),
            ("forget", {"block": "4-5"}, 404, "POST", "/forget", {"json": {"block": "4-5"}}),
            ("note", {"text": "two\nlines"}, 422, "POST", "/note", {"json": {"text": "two\nlines"}}),
            ("recall", {"q": "("}, 422, "POST", "/recall", {"json": {"q": "("}}),
            ("nap", {"text": "no block"}, 422, "POST", "/nap", {"json": {"text": "no block"}}),
        ):
            text, error = await s.call(tool, **args)
            message = assert_error(http.request(method, path, token, **kw), status)["message"]
            # A refusal that hands over a next step (a zoom past the end: the zoom that opens) names it as a call.
            assert error and (text == message or text.startswith(message + "\n\nCall: ")), (tool, text)
            answers.append(text)
        settle_all(http, token)
        # A block without its summary is refused before the server is asked, naming the call to make.
        assert await s.call("nap", block="4-5") == (
            'nap 4-5 needs text, the one-line summary:\nCall: nap(block="4-5", text="<your line>")', True)

    errlog = tmp_path / "mcp.stderr"
    run_session(base_url, token, errlog, script)
    everything = "\n".join(answers) + errlog.read_text(encoding="utf-8")
    assert token not in everything and token.split("_")[2] not in everything
    assert "Traceback" not in everything and "curl" not in everything


def test_a_bad_token_is_a_tool_error_with_the_servers_message(base_url: str, http: Http, tmp_path: Path) -> None:
    """Also over the initialize handshake that today's hosts use (mode legacy)."""
    bogus = "stash1_0123456789abcdef_" + "A" * 49
    expected = assert_error(http.get("/wake", bogus), 401)["message"]
    seen: list[str] = []

    async def script(s: Session) -> None:
        assert {t.name for t in (await s.client.list_tools()).tools} == set(TOOLS)
        for tool, args in (("wake", {}), ("note", {"text": "never stored"})):
            text, error = await s.call(tool, **args)
            # The server's 401 is curl's advice (an Authorization header); the tools' token is STASH_TOKEN.
            assert error and "refused STASH_TOKEN" in text and expected.startswith("Send a valid token"), (tool, text)
            seen.append(text)

    errlog = tmp_path / "mcp.stderr"
    run_session(base_url, bogus, errlog, script, mode="legacy")
    logged = errlog.read_text(encoding="utf-8")
    assert seen and all(bogus not in text and bogus[7:] not in text for text in seen + [logged])
    assert "Traceback" not in logged


def stash_mcp(env: dict[str, str], *prelude: str) -> subprocess.CompletedProcess:
    code = "; ".join([*prelude, "from stash.cli.main import main", "raise SystemExit(main(['mcp']))"])
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)


def test_it_refuses_to_start_without_its_variables_or_the_extra(base_url: str, token: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "STASH_URL": base_url, "STASH_TOKEN": token}
    for missing in ("STASH_URL", "STASH_TOKEN"):
        done = stash_mcp({k: v for k, v in env.items() if k != missing})
        assert (done.returncode, done.stdout) == (2, ""), done
        assert done.stderr.startswith(f"stash: {missing} is not set."), done.stderr
    # Without the mcp package (an import of it fails), one line that says how to install it.
    done = stash_mcp(env, "import sys", "sys.modules['mcp'] = None")
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.splitlines() == [
        "stash mcp: the mcp package is not installed; install it with: pip install 'mcp>=2.3,<3'"]
    assert token not in done.stderr


def test_stash_mcp_pins_by_default_and_reports_a_memory_put_back_whole(tmp_path: Path) -> None:
    server = start_server(tmp_path / "srv", *CHEAP_KDF_FLAGS)
    pins = str(tmp_path / "pins.json")
    try:
        token = Http(server.url).init()["token"]
        folder = server.data / "users" / token[7:23]

        async def two_notes(s: Session) -> None:
            for text in ("one", "two"):
                await s.ok("note", text=text)

        run_session(server.url, token, tmp_path / "a.stderr", two_notes, pins=pins)
        server.stop()
        shutil.copytree(folder, tmp_path / "old")
        server.start(same_port=True)

        async def third(s: Session) -> None:
            await s.ok("note", text="three")

        run_session(server.url, token, tmp_path / "b.stderr", third, pins=pins)
        server.stop()
        shutil.rmtree(folder)
        shutil.copytree(tmp_path / "old", folder)
        server.start(same_port=True)
        seen: list[str] = []

        async def refused(s: Session) -> None:
            text, error = await s.call("wake")
            assert error, text
            seen.append(text)

        run_session(server.url, token, tmp_path / "c.stderr", refused, pins=pins)
        assert "pinned" in seen[0] and "unpin" in seen[0]
        assert token not in Path(pins).read_text()
    finally:
        server.stop()


def test_one_memory_per_process_chosen_by_its_url(base_url: str, http: Http, token: str, tmp_path: Path) -> None:
    """``stash mcp`` with STASH_URL ending in /m/{name} serves that memory: its
    note lands there and nowhere else, its wake reads it."""
    assert http.post("/memories", token, json={"name": "by-mcp"}).status_code == 201

    async def script(s: Session) -> None:
        assert "Saved as #0." in await s.ok("note", text="noted through mcp")
        assert "noted through mcp" in await s.ok("wake")

    run_session(f"{base_url}/m/by-mcp", token, tmp_path / "mcp.stderr", script)
    assert "noted through mcp" in http.get("/m/by-mcp/wake", token).text
    assert "noted through mcp" not in http.get("/wake", token).text
