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

from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.mcp.every_tool import TOOLS, every_tool
from tests.support.mcp.session import Session, run_session
from tests.support.server import CLI_TIMEOUT, REPO, Http, start_server

pytestmark = pytest.mark.slow


def test_every_tool_against_the_http_api(base_url: str, http: Http, token: str, tmp_path: Path) -> None:
    answers: list[str] = []

    async def script(s: Session) -> None:
        await every_tool(s, http, token, answers)

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
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )


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
        "stash mcp: the mcp package is not installed; install it with: pip install 'mcp>=2.3,<3'"
    ]
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
