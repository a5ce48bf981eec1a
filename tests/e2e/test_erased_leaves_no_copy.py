"""An erasure answered ``"flushed": true`` leaves nothing of what it erased
in any file of the memory's folder, at the instant the answer arrives, while
agents keep writing and reading (SECURITY.md, "Erasure").

The attack, for real: a real ``stash serve --workers 2``; an append
capability noting every 0.15 s and a read capability waking every 0.6 s
from other threads; a secret noted by an append or a full capability,
folded into the log by a read recall and indexed by a words search; the
owner erases it by ids, across memories or by undo. The moment the answer
arrives the folder's files are copied, and every state the copies hold
(tests/support/files/wal_states.py: each commit a WAL still holds, older generations
too) is opened offline with the project's own key code and the read token:

* ``memory.db``: the erased memory's key, read from any state, opens its row;
* ``keyring.db``: the inbox rows, where an append capability's notes wait
  sealed to the epoch's inbox key (``inbox_seal.private_key``), open;
* ``recall.db``: the word index's segments, bound only to the erased ids of
  their range, open under the rows key with the erased ids as they were
  before the erasure. (The recall cache's pieces are bound to the nonces of
  the key chunks too, which a state of ``memory.db`` from before the
  erasure would give; the first point covers those. Each search closes the
  cache, and a close with no reader in it folds its WAL, so this point
  guards the flush rather than finding what the others found before it.)

and the raw bytes of every file are searched for the text as written (a
guard: every value is sealed, under either cipher). The same offline read
of a copy taken just before the erasure finds the secret in each place it
was (the attack works on these files). For ``main`` and a
second memory, under both file ciphers."""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from stash.core.errors import StashError
from stash.crypto import aead, inbox_seal, keys, tokens
from stash.crypto.epochs import KeyChain
from stash.storage import memories
from stash.storage.keyring import open_keyring
from stash.storage.memfile import KEYS_PER_CHUNK, MemoryFile
from stash.storage.recallcache import rendered_log
from stash.storage.recallcache.word_index import WordCache, WordTail
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.files.wal_states import copy_now, states
from tests.support.server import Http, start_server

pytestmark = pytest.mark.slow

SECRET = "zebracorn"
FILES = ("memory.db", "keyring.db", "recall.db")
# (who writes the secret, how the owner erases it).
WAYS = [
    ("append", "ids"),
    ("full", "ids"),
    ("append", "across"),
    ("full", "across"),
    ("append", "undo"),
    ("full", "undo"),
]


@pytest.fixture(params=["main", "alpha"])
def memory(request) -> str:
    return request.param


class Traffic:
    """An append capability noting every 0.15 s, and a read capability waking
    every 0.6 s and searching words every 0.2 s, each from its own thread,
    until stopped."""

    def __init__(self, url: str, append: str, read: str) -> None:
        self.stop = threading.Event()
        self.answers: list[int | str] = []  # 200, or the error code of any other answer
        self.threads = [
            threading.Thread(target=self._run, args=(url, append, "POST", "/note", 0.15), daemon=True),
            threading.Thread(target=self._run, args=(url, read, "GET", "/wake", 0.6), daemon=True),
            threading.Thread(target=self._run, args=(url, read, "POST", "/recall", 0.2), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _run(self, url: str, token: str, method: str, path: str, every: float) -> None:
        with loopback.client(base_url=url, timeout=60) as http:
            k = 0
            while not self.stop.wait(every):
                kw: dict[str, Any] = {
                    "json": {"text": f"traffic note {k}"} if path == "/note" else {"words": "traffic"}
                }
                kw = {} if method == "GET" else kw
                resp = http.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)
                self.answers.append(resp.status_code if resp.status_code == 200 else resp.json()["error"])
                k += 1

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def read_keys(copied: dict[str, bytes], tmp: Path, token: str, store: str) -> tuple[KeyChain, int]:
    """The read token's epoch keys, opened from the copied key ring by the
    project's own code (open_keyring, open_grant), and the memory file's page size."""
    folder = tmp / "ring"
    folder.mkdir(exist_ok=True)
    for name in ("keyring.db", "keyring.db-wal"):
        (folder / name).write_bytes(copied[name])
    ring = open_keyring(folder / "keyring.db", store)
    try:
        tok = tokens.parse(token)
        assert tok is not None
        grant = ring.find(tok.tag)
        assert grant is not None
        return ring.open_grant(grant, tok.secret).chain, ring.memory_page_bytes()
    finally:
        ring.close()


def _rows(state: bytes, tmp: Path, sql: str) -> list[tuple]:
    path = tmp / "state.db"
    path.write_bytes(state)
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.DatabaseError:
        return []  # a state whose tables are elsewhere (an older generation's pages): nothing to read there
    finally:
        conn.close()


def inbox_notes(copied: dict[str, bytes], tmp: Path, chain: KeyChain, store: str) -> list[str]:
    """Every append note any state of the key ring holds, opened with the inbox key."""
    out = []
    for state in states(copied["keyring.db"], copied["keyring.db-wal"]):
        for grant_id, epoch, claim, sealed in _rows(state, tmp, "SELECT grant_id, epoch, claim, sealed FROM inbox"):
            try:
                out.append(inbox_seal.open_note(chain, epoch, bytes(sealed), store, grant_id, claim)[1])
            except aead.Unsealable:
                continue
    return out


def index_words(
    copied: dict[str, bytes], tmp: Path, rows_key: bytes, store: str, erased_sets: list[frozenset[int]]
) -> bytes:
    """Every word segment any state of the recall cache holds that opens
    under the rows key with one of ``erased_sets`` as its range's erased ids."""
    out = []
    probe = sqlite3.connect(":memory:")
    for state in states(copied["recall.db"], copied["recall.db-wal"]):
        for kind in (WordTail, WordCache):
            for piece, seg, sealed in _rows(state, tmp, f"SELECT piece, seg, sealed FROM {kind.table}"):
                for erased in erased_sets:
                    index = kind(probe, tmp, store, rows_key, KEYS_PER_CHUNK, erased)
                    aad = index._seg_aad(piece, seg, index._keys_digests(piece, piece + 1)[piece])
                    try:
                        out.append(rendered_log._unpad(aead.open_sealed(rows_key, bytes(sealed), aad)) or b"")
                    except aead.Unsealable:
                        continue
    probe.close()
    return b"\n".join(out)


def memory_texts(
    copied: dict[str, bytes], tmp: Path, ids: list[int], chain: KeyChain, store: str, cipher: str, page_bytes: int
) -> tuple[list[str], int]:
    """The texts of memories ``ids`` whose key any state of the memory file
    still holds, and how many states opened at all."""
    found, opened = [], 0
    folder = tmp / "memfile"
    folder.mkdir(exist_ok=True)
    for state in states(copied["memory.db"], copied["memory.db-wal"]):
        for suffix in ("-wal", "-shm"):
            (folder / f"memory.db{suffix}").unlink(missing_ok=True)
        (folder / "memory.db").write_bytes(state)
        try:
            mf = MemoryFile(folder / "memory.db", store, chain, cipher, page_bytes=page_bytes, reseal=False)
        except StashError:
            continue  # not a whole state (the main file was checkpointed past it)
        opened += 1
        try:
            for i in (i for i in ids if i < mf.count()):
                key = mf.log.memory_key(i)  # the key slot as the state holds it, whatever the erasure record says
                if key is not None:
                    row = mf.conn.execute("SELECT sealed FROM log WHERE id = ?", (i,)).fetchone()
                    found.append(mf.codec.decode(i, mf.log.open_row(i, key, row[0]))[1])
        finally:
            mf.close()
    return found, opened


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def raw_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


def test_nothing_of_an_erased_memory_is_left_in_its_files_when_the_answer_arrives(
    tmp_path: Path, memory: str, file_cipher: str
) -> None:
    server = start_server(
        tmp_path / "srv",
        *CHEAP_KDF_FLAGS,
        "--workers",
        "2",
        "--file-cipher",
        file_cipher,
        "--user-slow",
        "4",
        "--slow-slots",
        "8",
    )  # the agents' searches beside the test's own
    http = Http(server.url)
    try:
        ident = http.init()
        owner, user = ident["token"], ident["user_id"]
        if memory != memories.MAIN:
            http.ok("POST", "/memories", owner, json={"name": memory})
        folder = tmp_path / "srv" / "data" / "users" / user
        folder = folder if memory == memories.MAIN else folder / "m" / memory
        store = memories.store_id(user, memory)
        prefix = "" if memory == memories.MAIN else f"/m/{memory}"
        grant = {
            s: http.ok("POST", "/grants", owner, json={"scope": s, "memory": memory})["token"]
            for s in ("append", "read", "full")
        }
        traffic = Traffic(server.url, grant["append"], grant["read"])
        erased: dict[int, str] = {}
        try:
            for k, (writer, way) in enumerate(WAYS):
                tag = f"tag{k}zq"
                text = f"{SECRET} {tag} the merger closes friday"
                n = http.ok("POST", "/note", grant[writer], json={"text": text})["id"]
                # A read recall folds an append note into the log; the owner's import completes its block of
                # 512, and a words search keeps that block's word index in recall.db.
                assert text in "\n".join(http.ok("POST", "/recall", grant["read"], json={"q": tag})["matches"])
                http.ok(
                    "POST",
                    f"{prefix}/import",
                    owner,
                    json={"entries": [{"date": today(), "text": f"filler {j}"} for j in range(512)]},
                )
                http.ok("POST", "/recall", grant["read"], json={"words": SECRET})

                before = copy_now(folder, FILES)
                chain, page_bytes = read_keys(before, tmp_path, grant["read"], store)
                rows_key = keys.subkey(chain.current, b"rows")
                was = frozenset(erased)
                # The attack reads the secret from these files before the erasure: where it is, it is found.
                assert memory_texts(before, tmp_path, [n], chain, store, file_cipher, page_bytes)[0][-1:] == [text]
                assert tag.encode() in index_words(before, tmp_path, rows_key, store, [was])
                if writer == "append":
                    assert text in inbox_notes(before, tmp_path, chain, store)

                if way == "ids":
                    answer = http.ok("POST", f"{prefix}/erase", owner, json={"ids": [n]})
                elif way == "across":
                    answer = http.ok(
                        "POST", "/memories/erase", owner, json={"words": f"{SECRET} {tag}", "memories": [memory]}
                    )
                else:
                    answer = http.ok("POST", f"{prefix}/erase/undo", owner, json={"first": n, "last": n})
                after = copy_now(folder, FILES)  # the instant the answer arrived, the agents still at work
                left = raw_bytes(folder)
                erased[n] = text

                texts, opened = memory_texts(after, tmp_path, sorted(erased), chain, store, file_cipher, page_bytes)
                assert opened, "no state of the memory file opened: the attack read nothing"
                assert texts == [], (writer, way, "memory.db")
                assert not [t for t in inbox_notes(after, tmp_path, chain, store) if SECRET in t], (writer, way)
                assert SECRET.encode() not in index_words(after, tmp_path, rows_key, store, [was, frozenset(erased)]), (
                    writer,
                    way,
                    "recall.db",
                )
                assert SECRET.encode() not in left and SECRET.encode() not in b"".join(after.values())
                assert answer["flushed"] is True, (writer, way, answer)
        finally:
            traffic.end()
        # A wake of a memory with blocks not summarised yet is refused, after it has opened it (and folded).
        assert traffic.answers and set(traffic.answers) <= {200, "wake.needs_nap"}, set(traffic.answers)
    finally:
        http.close()
        server.stop()
