"""Old copies of a user's files put back, page by page and file by file, with
the server stopped and started (issue 20): an erased memory is never served
again through the recall cache, and erasure leaves no byte of the erased
memory's key where a raw read of any file finds it.

A page is put back by copying the 4 KiB at its offset from the older copy of
the same file: the file key never changes, so a SQLCipher page from before is
a valid page at its position, as it would be for an attacker with a disk image.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.files.copies import SIDE, pages, put_back_page, verify
from tests.support.files.whole_state import base_key, raw, rows
from tests.support.server import Http, Server, start_server

REFUSED = ("store.damaged", "store.rolled_back")
FILES = ("memory.db", "keyring.db", "recall.db")


def put_back_files(folder: Path, older: Path, name: str) -> None:
    """File ``name`` and its WAL and SHM, as they were in ``older``."""
    for suffix in SIDE:
        (folder / (name + suffix)).unlink(missing_ok=True)
        if (older / (name + suffix)).exists():
            shutil.copy2(older / (name + suffix), folder / (name + suffix))


def served_or_refused(resp, *secrets: str, allowed: tuple[str, ...] = ()) -> bool:
    """Either an answer that holds none of ``secrets``, or a refusal with a
    code that says rollback or damage (or one of ``allowed``, an honest
    answer about the state) — never a bare 500. True when it was refused as
    rollback or damage."""
    for secret in secrets:
        assert secret not in resp.text, resp.text[:300]
    if resp.status_code == 200:
        return False
    err = assert_error(resp, resp.status_code)
    assert err["error"] in REFUSED + allowed, (resp.status_code, resp.text)
    return err["error"] in REFUSED


def words_miss(resp, secret: str) -> bool:
    """A words search for the erased secret's own word: served, it finds
    nothing (an old word index piece that opened would count it, even
    though its line now reads [erased]); else refused as ``served_or_refused``
    allows."""
    refused = served_or_refused(resp, secret)
    if resp.status_code == 200:
        assert resp.json()["total"] == 0 and resp.json()["matches"] == [], resp.text[:300]
    return refused


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with start_server(tmp_path_factory.mktemp("copies"), *CHEAP_KDF_FLAGS) as srv:
        yield srv


def import_with_secret(http: Http, token: str, secret: str, n: int = 4200, at: int = 5) -> None:
    entries = [{"date": "2024-01-02", "text": secret if i == at else f"plain memory {i}"} for i in range(n)]
    http.ok("POST", "/import", token, json={"entries": entries})


@pytest.mark.slow
def test_an_erased_memory_never_comes_back_through_an_old_recall_cache_and_key_page(server: Server, tmp_path: Path):
    """The trial of the issue: 4,200 memories, a recall builds the sealed
    cache, a copy; the secret erased; then the old ``recall.db`` put back
    with each page of ``memory.db`` that the erasure changed, alone and all
    together. No recall, wake or export serves the secret again."""
    http = Http(server.url)
    token = http.init()["token"]
    folder = server.data / "users" / token[7:23]
    secret = f"cache-secret-{os.urandom(6).hex()}"
    word = {"words": "SECRET " + secret.rsplit("-", 1)[1].upper()}  # its words, as a user would type them
    letter = {"words": "c"}  # one character: only the secret's words start with it
    import_with_secret(http, token, secret)
    assert http.ok("POST", "/recall", token, json={"q": secret})["total"] == 1
    assert http.ok("POST", "/recall", token, json=word)["total"] == 1  # builds the word index too
    assert http.ok("POST", "/recall", token, json=letter)["total"] == 1  # from the segment of first characters
    server.stop()
    before = tmp_path / "before"
    shutil.copytree(folder, before)
    assert (before / "recall.db").exists()
    with sqlite3.connect(before / "recall.db") as db:
        # piece 0 of 4,200 memories, in all its segments (0, 16 buckets, the first characters)
        assert db.execute("SELECT count(DISTINCT piece), count(*) FROM word_segs").fetchone() == (1, 18)
    server.start(same_port=True)
    http = Http(server.url)
    http.ok("POST", "/erase", token, json={"ids": [5]})
    assert http.ok("POST", "/recall", token, json={"q": secret})["total"] == 0
    assert http.ok("POST", "/recall", token, json=word)["total"] == 0
    assert http.ok("POST", "/recall", token, json=letter)["total"] == 0
    server.stop()
    after = tmp_path / "after"
    shutil.copytree(folder, after)
    old, new = pages(before / "memory.db"), pages(after / "memory.db")
    changed = [k for k in range(min(len(old), len(new))) if old[k] != new[k]]
    assert changed
    # Every changed page alone with STASH_COPIES_EVERY_PAGE=1; in the suite,
    # the last two (the rewritten key chunk's pages, where the trial
    # put one back) and all of them together.
    alone = changed if os.environ.get("STASH_COPIES_EVERY_PAGE") else changed[-2:]
    trials: list[list[int]] = [[k] for k in alone] + [changed]
    for trial in trials:
        shutil.rmtree(folder)
        shutil.copytree(after, folder)
        put_back_files(folder, before, "recall.db")
        for k in trial:
            put_back_page(folder / "memory.db", before / "memory.db", k)
        server.start(same_port=True)
        try:
            http = Http(server.url)
            refused = [
                served_or_refused(http.request("POST", "/recall", token, json={"q": secret}), secret),
                words_miss(http.request("POST", "/recall", token, json=word), secret),
                words_miss(http.request("POST", "/recall", token, json=letter), secret),
                served_or_refused(http.request("GET", "/wake", token), secret, allowed=("wake.needs_nap",)),
                served_or_refused(http.request("GET", "/zoom?block=0-7", token), secret),
                served_or_refused(http.request("GET", "/export", token), secret),
            ]
        finally:
            server.stop()
        if any(refused) or trial == changed:
            # What the server refuses to serve, `stash verify --token` reports.
            checked = verify(server, token)
            assert secret not in checked.stdout + checked.stderr
            assert checked.returncode != 0 or not any(refused), (trial, checked.stdout, checked.stderr)

    # The old key chunk put back whole (its row, as one holding the file key
    # would): not the chunk the authenticated state holds, so refused, with
    # the old recall.db or without, and reported by verify; the live row put
    # back, the memory is served again, the secret erased.
    shutil.rmtree(folder)
    shutil.copytree(after, folder)
    base = base_key(server, token)
    (chunk,) = rows(before, base, "SELECT sealed FROM memory_keys WHERE chunk = 0")[0]
    with raw(folder, base) as conn:
        conn.execute("UPDATE memory_keys SET sealed = ? WHERE chunk = 0", (chunk,))
    put_back_files(folder, before, "recall.db")
    server.start(same_port=True)
    http = Http(server.url)
    assert served_or_refused(http.request("POST", "/recall", token, json={"q": secret}), secret)
    assert words_miss(http.request("POST", "/recall", token, json=word), secret)
    assert served_or_refused(http.request("GET", "/zoom?block=4-5", token), secret)
    server.stop()
    checked = verify(server, token)
    assert checked.returncode != 0 and "memory key chunk (#0) is not the one" in checked.stdout, checked.stdout
    shutil.rmtree(folder)
    shutil.copytree(after, folder)
    server.start(same_port=True)
    assert http.ok("POST", "/recall", token, json={"q": secret})["total"] == 0
    server.stop()
    checked = verify(server, token)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    server.start(same_port=True)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory):
    """Files without the SQLCipher layer (as a replicated store keeps them):
    every byte a raw read finds is what the rows hold."""
    with start_server(tmp_path_factory.mktemp("plain"), *CHEAP_KDF_FLAGS, "--file-cipher", "none") as srv:
        yield srv


def blobs(folder: Path, sql: str) -> list[bytes]:
    conn = sqlite3.connect(f"file:{folder}?mode=ro", uri=True)
    try:
        return [bytes(r[0]) for r in conn.execute(sql)]
    except sqlite3.OperationalError:  # a table not made in this file
        return []
    finally:
        conn.close()


def fragments(blob: bytes, width: int = 48) -> list[bytes]:
    """Windows of ``blob`` at every ``width`` bytes: a row spread over
    overflow pages keeps whole windows on each page, so any surviving piece
    of it holds one of these."""
    return [blob[k : k + width] for k in range(0, len(blob) - width + 1, width)]


def every_byte(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


@pytest.mark.slow
def test_erasure_leaves_no_byte_of_the_erased_key_cache_piece_or_note_record_in_any_file(
    plain_server: Server, tmp_path: Path
):
    """After an erasure (which ends with a checkpoint), no page of any file
    of the user — free pages and WAL included — holds any piece of the
    sealed key chunk, recall cache piece or idempotency record from before,
    which the old key chain would open; neither once the server has stopped."""
    server = plain_server
    http = Http(server.url)
    token = http.init()["token"]
    folder = server.data / "users" / token[7:23]
    secret = f"shred-{os.urandom(6).hex()}"
    import_with_secret(http, token, f"{secret} imported")
    noted = http.request(
        "POST",
        "/note",
        token,
        json={"text": f"{secret} noted"},
        headers={"Idempotency-Key": f"k-{os.urandom(4).hex()}"},
    )
    assert noted.status_code == 200, noted.text
    assert http.ok("POST", "/recall", token, json={"q": secret})["total"] == 2
    server.stop()
    old = {
        "key chunks": blobs(folder / "memory.db", "SELECT sealed FROM memory_keys WHERE chunk IN (0, 32)"),
        "recall cache": blobs(folder / "recall.db", "SELECT sealed FROM scan_cache"),
        "idempotency records": blobs(folder / "memory.db", "SELECT sealed FROM idempotency")
        + blobs(folder / "memory.db", "SELECT fingerprint FROM idempotency"),
    }
    assert all(old.values()), {k: len(v) for k, v in old.items()}
    server.start(same_port=True)
    http = Http(server.url)
    http.ok("POST", "/erase", token, json={"ids": [5, 4200]})
    for moment in ("live", "stopped"):
        if moment == "stopped":
            server.stop()
        raw = every_byte(folder)
        assert secret.encode() not in raw
        for what, sealed in old.items():
            left = [f for blob in sealed for f in fragments(blob) if f in raw]
            assert not left, (moment, what, len(left))
    server.start(same_port=True)
    assert http.ok("POST", "/recall", token, json={"q": secret})["total"] == 0
