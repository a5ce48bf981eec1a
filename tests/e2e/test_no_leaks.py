"""At rest, nothing readable: after real use of a real server, no byte of any
file under its data folder, and nothing in its own output, carries a memory's
text, a summary's text, a recall query, a token or a token's secret (docs/DESIGN.md, "HTTP surface",
and "Sealing rows"). Checked for both file ciphers: with ``--file-cipher none`` the SQLite
file is plain, so only the row sealing stands between the disk and the text;
and for main and a second memory, used alike on one server, one scan."""

from __future__ import annotations

import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.api import assert_error
from tests.support.memories import MEMORIES, Memory
from tests.support.server import CLI_TIMEOUT, Http, Server, cli_env, path_with, python_bin, secret_parts, start_server

pytestmark = pytest.mark.slow


def marker() -> str:
    """24 random letters: nothing the code writes can contain them by chance."""
    return "".join(secrets.choice(string.ascii_letters) for _ in range(24))


def needles(named: dict[str, str], tokens: list[str]) -> dict[str, bytes]:
    out = {name: text.encode() for name, text in named.items()}
    for k, tok in enumerate(tokens):
        with_check, digits, raw = secret_parts(tok)
        out[f"token {k}"] = tok.encode()
        out[f"secret {k}"] = with_check.encode()
        out[f"secret digits {k}"] = digits.encode()
        out[f"raw secret {k}"] = raw
        out[f"hex secret {k}"] = raw.hex().encode()
    return out


def scan(folder: Path, wanted: dict[str, bytes]) -> list[tuple[str, str]]:
    """Every (needle, file) pair where a needle's bytes occur in a file."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files, folder
    hits = []
    for path in files:
        data = path.read_bytes()
        hits += [(name, str(path)) for name, needle in wanted.items() if needle in data]
    return hits


def use(
    http: Http, owner: str, where: Memory, memory: str, summary: str, query: str, server: Server, tmp_path: Path
) -> list[str]:
    """Real use of one memory with its own markers: imports, notes, naps, a
    config, recalls by query string and body, zoom, wake, export, refusals,
    and the client as a subprocess. Returns the tokens minted for it."""
    full = http.ok("POST", "/grants", owner, json=where.grant("full"))["token"]
    reader = http.ok("POST", "/grants", owner, json=where.grant("read"))["token"]
    revoked = http.ok("POST", "/grants", owner, json=where.grant("read"))
    http.ok("DELETE", f"/grants/{revoked['id']}", owner)

    http.ok("POST", "/import", full, json={"entries": [{"date": "2020-02-02", "text": f"imported {memory}"}]})
    http.ok("POST", "/note", full, json={"text": f"the launch code word is {memory}"})
    http.ok("POST", "/note", full, json={"text": f"{memory} was said twice"})
    nap = http.ok("POST", "/nap", full, json={})["nap"]
    while nap:
        text = f"code word {summary} settled for {nap['block']}"
        nap = http.ok("POST", "/nap", full, json={"block": nap["block"], "text": text})["nap"]
    http.ok("POST", where.at("/config"), owner, json={"WAKE_LINES": 50})

    # A recall query is memory text too; through the query string and the body.
    assert http.ok("GET", "/recall", reader, params={"q": f"{memory}|{query}"})["total"] == 3
    assert http.ok("POST", "/recall", reader, json={"q": f"({query})?{summary}"})["total"] == 0
    assert http.ok("GET", "/zoom", reader, params={"block": "0-1"})["lines"]
    assert any(memory in line for line in http.ok("GET", "/wake", reader)["lines"])
    assert http.get(where.at("/export"), owner).status_code == 200

    # Refusals must not log what they refused either.
    assert_error(http.get(where.at("/wake"), params={"token": owner}), 400)
    assert_error(http.get("/wake", revoked["token"]), 401)
    assert_error(http.post("/note", reader, json={"text": f"{memory} refused"}), 403)
    assert_error(http.post("/note", full, json={"text": f"{memory}\nforged line"}), 422)

    # The client run as a subprocess, as an agent would.
    env = cli_env(server.url, full, path_with(python_bin(tmp_path / f"bin-{where}")))
    done = subprocess.run(
        [sys.executable, "-m", "stash", "recall", query], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    return [full, reader, revoked["token"]]


@pytest.mark.parametrize("file_cipher", [None, "none"], ids=["default-cipher", "no-file-cipher"])
def test_nothing_readable_on_disk_or_in_the_log(file_cipher: str | None, tmp_path: Path) -> None:
    extra = [] if file_cipher is None else ["--file-cipher", file_cipher]
    server: Server = start_server(tmp_path / "srv", *extra)
    http = Http(server.url)
    try:
        answer = http.init()
        owner = answer["token"]
        assert http.ok("GET", "/health")["file_cipher"] == (file_cipher or answer["file_cipher"])
        named: dict[str, str] = {}
        tokens = [owner]
        for where in map(Memory, MEMORIES):
            where.create(http, owner)
            memory, summary, query = marker(), marker(), marker()
            named |= {f"memory in {where}": memory, f"summary in {where}": summary, f"query in {where}": query}
            tokens += use(http, owner, where, memory, summary, query, server, tmp_path)
        wanted = needles(named, tokens)
        # While the server runs, its WAL and shared-memory files exist: scan them too.
        live = scan(server.data, wanted)
    finally:
        http.close()
        server.stop()
    assert not live, live
    if file_cipher == "none":
        # The control: the scan does read the files, which here are plain SQLite.
        assert scan(server.data, {"header": b"SQLite format 3\x00"})
    assert not scan(server.data, wanted), scan(server.data, wanted)

    log = server.log.read_bytes()
    assert str(server.data.resolve()).encode() in log  # the log was written, and is the one we think
    assert [name for name, needle in wanted.items() if needle in log] == []
    for fragment in (b"q=", b"?q", b"block=", b"token=", b"part="):
        assert fragment not in log, fragment  # access lines name the route, never its query string
    assert b"Traceback" not in log
