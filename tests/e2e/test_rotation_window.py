"""A leaked owner token in the window of a rotation (issue 40, finding 4), and
an old memory folder put back under the owner's listings (finding 10),
attacked with a real ``stash serve`` over real files, under both file ciphers.

The window is the time between ``POST /rotate`` and the new token's first
use, when the old token is still the owner. Whatever the old token makes in
it — a memory forked or created, capabilities minted in main or in that
memory — ends or passes to the new owner at that first use (docs/DESIGN.md,
"Key epochs" and "Memories"; SECURITY.md, "Rotation and many memories")."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash.crypto import tokens
from stash.storage import memories
from stash.storage.keyring import Keyring
from tests.support.api import CHEAP_KDF_FLAGS, assert_error, token_parts
from tests.support.files.epochs import epoch_keys_of, everything_readable, snapshot, text_in
from tests.support.server import Cli, Http, Server, cli_env, path_with, python_bin, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlcipher", "none"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server per file cipher for the module, each test its own identity."""
    with start_server(tmp_path_factory.mktemp("srv"), *CHEAP_KDF_FLAGS, "--file-cipher", request.param) as srv:
        yield srv


def _main_salt(server: Server, uid: str, name: str) -> bytes:
    """The salt main's key ring keeps for memory ``name`` (read from the file,
    as a thief of the disk would)."""
    ring = Keyring(server.data / "users" / uid / "keyring.db", uid)
    try:
        number = memories.numbered(ring.conn)[name]
        salt = memories.salt_of(ring.conn, number)
    finally:
        ring.close()
    assert salt is not None
    return salt


def _enrolment_live(server: Server, uid: str, name: str, owner_token: str) -> bool:
    """Whether ``owner_token`` is still enrolled (a live owner grant) in
    memory ``name``'s key ring, as the files say."""
    secret = memories.owner_secret(token_parts(owner_token).secret, _main_salt(server, uid, name))
    ring = Keyring(server.data / "users" / uid / "m" / name / "keyring.db", memories.store_id(uid, name))
    try:
        grant = ring.find(tokens.lookup_tag(uid, secret))
    finally:
        ring.close()
    return grant is not None and grant.wrapped is not None


@pytest.mark.parametrize("made", ["fork", "create"])
def test_a_memory_the_old_token_makes_in_the_window_passes_to_the_new_owner(
    served: Server, made: str, tmp_path: Path
) -> None:
    http = Http(served.url)
    old = http.init()["token"]
    uid = token_parts(old).user_id
    secret_line = f"main-secret-{os.urandom(4).hex()}"
    http.ok("POST", "/note", old, json={"text": secret_line})
    http.ok("POST", "/memories", old, json={"name": "kept"})
    kept_reader = http.ok("POST", "/grants", old, json={"scope": "read", "memory": "kept"})
    main_reader = http.ok("POST", "/grants", old, json={"scope": "read"})

    rotated = http.ok("POST", "/rotate", old)
    new = rotated["token"]  # not used yet: the window is open
    # The leaked old token, in the window: a memory of its own, a full capability on it, and
    # read, full and append capabilities on main.
    if made == "fork":
        http.ok("POST", "/memories/main/fork", old, json={"name": "shadow"})
    else:
        http.ok("POST", "/memories", old, json={"name": "shadow"})
    tx = http.ok("POST", "/grants", old, json={"scope": "full", "memory": "shadow"})
    in_window = [http.ok("POST", "/grants", old, json={"scope": scope}) for scope in ("read", "full", "append")]
    http.ok("POST", "/note", tx["token"], json={"text": "tx was here"})
    tx_view = "\n".join(http.ok("GET", "/wake", tx["token"])["lines"])
    assert "tx was here" in tx_view and (secret_line in tx_view) == (made == "fork")
    window_copy = snapshot(served, uid, tmp_path / "in-window")
    tx_keys = epoch_keys_of(window_copy / "m" / "shadow" / "keyring.db", tx["token"], memories.store_id(uid, "shadow"))
    assert tx_keys  # control: in the window, TX reaches shadow's keys

    # The owner starts using the new token: its listings answer, naming shadow as the identity's.
    listed = http.ok("GET", "/memories", new)
    assert {m["name"] for m in listed["memories"]} == {"main", "kept", "shadow"}
    assert listed.get("unopened", []) == []
    grants = {g["id"]: g for g in http.ok("GET", "/grants", new)["grants"]}
    assert grants[tx["id"]]["memory"] == "shadow" and not grants[tx["id"]]["live"]
    for g in in_window:
        assert not grants[g["id"]]["live"], g["scope"]
    assert grants[kept_reader["id"]]["live"] and grants[main_reader["id"]]["live"]
    # The audit marks the take-over, in shadow's trail and in main's.
    events = http.ok("GET", "/audit", new)["events"]
    marks = [e for e in events if e["event"] == "takeover"]
    assert {(e["memory"], e["detail"].get("memory", e["memory"])) for e in marks} >= {
        ("shadow", "shadow"),
        ("main", "shadow"),
    }
    assert any(e["memory"] == "main" and e["detail"].get("made_in_window") for e in marks)

    # Everything the old token made or handed out in the window is refused; what was there before stays.
    for path in ("/wake", "/m/shadow/wake"):
        assert_error(http.get(path, tx["token"]), 401, "auth.invalid")
    assert_error(http.post("/note", tx["token"], json={"text": "still here?"}), 401, "auth.invalid")
    for g in in_window:
        assert_error(http.post("/note", g["token"], json={"text": "x"}), 401, "auth.invalid")
    for method, path in (
        ("GET", "/memories"),
        ("GET", "/m/shadow/wake"),
        ("GET", "/wake"),
        ("POST", "/memories"),
        ("GET", "/grants"),
    ):
        body = {"json": {"name": "again"}} if method == "POST" else {}
        assert_error(http.request(method, path, old, **body), 401, "auth.invalid")
    assert secret_line in "\n".join(http.ok("GET", "/wake", main_reader["token"])["lines"])
    http.ok("GET", "/m/kept/wake", kept_reader["token"])

    # The new owner wakes and notes in shadow, which holds what was written in it.
    woke = "\n".join(http.ok("GET", "/m/shadow/wake", new)["lines"])
    assert "tx was here" in woke and (secret_line in woke) == (made == "fork")
    after = f"after-{os.urandom(4).hex()}"
    http.ok("POST", "/m/shadow/note", new, json={"text": after})
    assert after in "\n".join(http.ok("GET", "/m/shadow/wake", new)["lines"])

    # Offline, from copies of the files: neither TX nor the old token's enrolment opens anything written after.
    later = snapshot(served, uid, tmp_path / "after")
    assert epoch_keys_of(later / "m" / "shadow" / "keyring.db", tx["token"], memories.store_id(uid, "shadow")) == []
    assert not _enrolment_live(served, uid, "shadow", old)
    assert _enrolment_live(served, uid, "shadow", new)
    cipher = served.extra[served.extra.index("--file-cipher") + 1]
    readable = everything_readable(
        memories.store_id(uid, "shadow"), [window_copy / "m" / "shadow", later / "m" / "shadow"], tx_keys, cipher
    )
    assert text_in("tx was here", readable)  # control: the harness reads what TX could already read
    assert not text_in(after, readable)
    http.close()


def _client(server: Server, token: str, tmp_path: Path) -> Cli:
    return Cli([sys.executable, "-m", "stash"], cli_env(server.url, token, path_with(python_bin(tmp_path / "bin"))))


def test_an_old_memory_folder_put_back_is_named_and_the_rest_listed(served: Server, tmp_path: Path) -> None:
    http = Http(served.url)
    owner = http.init()["token"]
    uid = token_parts(owner).user_id
    for name in ("alpha", "bravo"):
        http.ok("POST", "/memories", owner, json={"name": name})
        http.ok("POST", f"/m/{name}/note", owner, json={"text": f"a line of {name}"})
    http.ok("POST", "/grants", owner, json={"scope": "read", "memory": "alpha", "label": "alpha reader"})
    folder = served.data / "users" / uid / "m" / "bravo"
    served.stop()
    shutil.copytree(folder, tmp_path / "old-bravo")
    served.start(same_port=True)
    http.close()
    http = Http(served.url)
    http.ok("DELETE", "/memories/bravo", owner)
    http.ok("POST", "/memories", owner, json={"name": "bravo"})
    served.stop()
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "old-bravo", folder)
    served.start(same_port=True)
    http.close()
    http = Http(served.url)

    listed = http.ok("GET", "/memories", owner)
    assert {m["name"] for m in listed["memories"]} == {"main", "alpha"}
    (named,) = listed["unopened"]
    assert named["name"] == "bravo" and named["error"] in ("store.damaged", "store.rolled_back")
    assert named["message"].strip()
    grants = http.ok("GET", "/grants", owner)
    assert "alpha reader" in [g["label"] for g in grants["grants"]]
    assert [(u["name"], u["error"]) for u in grants["unopened"]] == [("bravo", named["error"])]
    audit = http.ok("GET", "/audit", owner)
    assert {e["memory"] for e in audit["events"]} >= {"main", "alpha"}
    assert [(u["name"], u["error"]) for u in audit["unopened"]] == [("bravo", named["error"])]
    # The memory itself answers the same refusal, never 404 nor another memory's data.
    body = assert_error(http.get("/m/bravo/wake", owner), 500, named["error"])
    assert "a line of bravo" not in str(body)

    # The client prints the memory it could not open, and the rest.
    cli = _client(served, owner, tmp_path)
    out = cli.ok("memories")
    assert "alpha:" in out and "bravo" in out and named["error"] in out
    out = cli.ok("grants")
    assert "alpha reader" in out and "bravo" in out and named["error"] in out
    # Deleting it is the way out: the listings are whole again.
    http.ok("DELETE", "/memories/bravo", owner)
    assert http.ok("GET", "/memories", owner).get("unopened", []) == []
    http.close()
