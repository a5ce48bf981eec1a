"""A placeholder is never a memory (docs/DESIGN.md, "Next steps"): a command
the server printed, run as printed with its placeholder left in place, saves
nothing. A note or summary that is exactly a placeholder the server prints is
refused (`422 text.placeholder`) over HTTP, from the `stash` client and from
`stash mcp`, for every writer and in every memory; an imported line is data
and is kept whatever it says. Against a real `stash serve`."""

from __future__ import annotations

import pytest

from stash.core.lines import PLACEHOLDERS
from tests.support.api import assert_error
from tests.support.docs.printed import orders
from tests.support.mcp.session import Session, run_session
from tests.support.server import Cli, Http

pytestmark = pytest.mark.slow


def at(where: str, path: str) -> str:
    return path if where == "main" else f"/m/{where}{path}"


@pytest.mark.parametrize("where", ["main", "bravo"])
def test_no_writer_saves_a_placeholder(http: Http, token: str, where: str, cli: Cli) -> None:
    if where != "main":
        http.ok("POST", "/memories", token, json={"name": where})
    # An empty memory's wake ends with the order to note; run as printed, placeholder and all.
    plain = http.request("GET", at(where, "/wake"), token, headers={"Accept": "text/plain"}).text
    [note] = orders(plain)
    assert "<one line>" in note
    env = {**cli.env, "STASH_TOKEN": token, "STASH_URL": cli.env["STASH_URL"] + at(where, "")}
    done = Cli(cli.argv0, env).shell(note)
    assert "text.placeholder" in done.stdout or "placeholder" in done.stdout, done.stdout
    for text in sorted(PLACEHOLDERS):
        assert_error(http.post(at(where, "/note"), token, json={"text": text}), 422, "text.placeholder")
    appender = http.ok("POST", "/grants", token, json={"scope": "append", "memory": where})["token"]
    assert_error(http.post("/note", appender, json={"text": "<your line>"}), 422, "text.placeholder")
    # An imported line is the memory's own data, whatever it says.
    http.ok(
        "POST",
        at(where, "/import"),
        token,
        json={"entries": [{"date": "2026-01-02", "text": "<one line>"}, {"date": "2026-01-02", "text": "<your line>"}]},
    )
    assert http.ok("GET", at(where, "/wake"), token)["T"] == 2
    assert_error(
        http.post(at(where, "/nap"), token, json={"block": "0-1", "text": "<your line>"}), 422, "text.placeholder"
    )
    assert_error(
        http.post(at(where, "/nap"), token, json={"summaries": [{"block": "0-1", "text": "<your line for 0-1>"}]}),
        422,
        "text.placeholder",
    )
    assert_error(http.post(at(where, "/nap"), token, json={"block": "0-1"}), 422, "nap.missing_text")
    # The client, run as an agent would run the printed command with the placeholder kept.
    res = Cli(cli.argv0, env).run("note", "<one line>")
    assert res.returncode != 0 and "placeholder" in res.stderr, (res.stdout, res.stderr)
    # Nothing of it was saved: the log holds the two imported lines only.
    assert http.ok("GET", at(where, "/wake"), token)["T"] == 2
    http.ok("POST", at(where, "/nap"), token, json={"block": "0-1", "text": "two lines, imported as data"})


def test_stash_mcp_refuses_a_placeholder(base_url: str, http: Http, token: str, tmp_path) -> None:
    said: list[tuple[str, bool]] = []

    async def script(s: Session) -> None:
        said.append(await s.call("note", text="<one line>"))
        said.append(await s.call("note", text="a line of its own"))

    run_session(base_url, token, tmp_path / "mcp.stderr", script)
    (refused, error), (_, failed) = said
    assert error and "placeholder" in refused and not failed, said
    assert [line.split(" ", 2)[2] for line in http.ok("POST", "/recall", token, json={"q": "."})["matches"]] == [
        "a line of its own"
    ]
