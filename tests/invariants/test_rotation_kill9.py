"""kill -9 in the middle of a rotation's take-over (docs/DESIGN.md,
"Key epochs"): the new owner token's first use retires the old one in main, then
takes every other memory over. A process that dies between the two (or
between one memory's move and main's record of it) leaves nothing the old
token or what it minted in the window opens, and the next owner request
finishes the work: every memory listed, the one the old token forked in the
window taken over and marked in the audit.

The first use runs in a real process (the vault, as a server worker runs
it) that SIGKILLs itself at the named point, with no handler run and nothing
flushed; a real ``stash serve`` then serves the files it left."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.server import REPO, Http, start_server

pytestmark = pytest.mark.slow

# The first use of the new token, in a process that kills itself at ``point``:
# "retired": main's retirement committed, no other memory taken over yet;
# "moved": the first other memory's key ring moved to the new owner, main not told yet.
FIRST_USE = """
import os, signal, sys
from pathlib import Path
from stash.service import handover
from stash.service.access import Vault
from tests.support.api import CHEAP_KDF

data, token, point = sys.argv[1:4]

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "retired":
    handover.take_over_all = die
else:
    moved = handover._move
    def move_then_die(*args, **kwargs):
        moved(*args, **kwargs)
        die()
    handover._move = move_then_die
with Vault(Path(data), kdf=CHEAP_KDF).session(token, "read"):
    pass
sys.exit(3)
"""


@pytest.mark.parametrize("point", ["retired", "moved"])
@pytest.mark.parametrize("cipher", ["sqlcipher", "none"])
def test_a_take_over_cut_by_kill9_is_finished_by_the_next_owner_request(
    tmp_path: Path, cipher: str, point: str
) -> None:
    server = start_server(tmp_path / "srv", *CHEAP_KDF_FLAGS, "--file-cipher", cipher)
    http = Http(server.url)
    try:
        old = http.init()["token"]
        http.ok("POST", "/note", old, json={"text": "main's line"})
        http.ok("POST", "/memories", old, json={"name": "kept"})
        reader = http.ok("POST", "/grants", old, json={"scope": "read", "memory": "kept"})["token"]
        new = http.ok("POST", "/rotate", old)["token"]
        http.ok("POST", "/memories/main/fork", old, json={"name": "shadow"})
        tx = http.ok("POST", "/grants", old, json={"scope": "full", "memory": "shadow"})
        in_kept = http.ok("POST", "/grants", old, json={"scope": "full", "memory": "kept"})
        server.stop()

        died = subprocess.run(
            [sys.executable, "-c", FIRST_USE, str(server.data), new, point],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-2000:])

        server.start(same_port=True)
        http.close()
        http = Http(server.url)
        # Main's retirement committed before the kill: the old token is refused everywhere at once.
        for path in ("/wake", "/m/kept/wake", "/m/shadow/wake", "/memories"):
            assert_error(http.get(path, old), 401, "auth.invalid")
        # The next owner request finishes the take-over.
        listed = http.ok("GET", "/memories", new)
        assert {m["name"] for m in listed["memories"]} == {"main", "kept", "shadow"}
        assert listed["unopened"] == []
        for token in (tx["token"], in_kept["token"]):
            assert_error(http.get("/wake", token), 401, "auth.invalid")
        http.ok("GET", "/m/kept/wake", reader)
        woke = "\n".join(http.ok("GET", "/m/shadow/wake", new)["lines"])
        assert "main's line" in woke
        http.ok("POST", "/m/shadow/note", new, json={"text": "the owner's, after"})
        http.ok("POST", "/m/kept/note", new, json={"text": "the owner's, after"})
        events = http.ok("GET", "/audit", new)["events"]
        marked = {(e["memory"], e["detail"].get("memory")) for e in events if e["event"] == "takeover"}
        assert ("main", "shadow") in marked and ("main", "kept") in marked
        assert {e["memory"] for e in events if e["event"] == "takeover"} >= {"main", "kept", "shadow"}
    finally:
        http.close()
        server.stop()
