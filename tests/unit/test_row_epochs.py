"""A new key epoch moves the memory file in constant work (docs/DESIGN.md,
"Key epochs"): rows keep the epoch that sealed them, recorded in their
``epoch`` column (meta ``sealed_base`` for rows from before the column), and
only the newest key chunk is re-sealed. Here: the upgrade of each earlier
release's fixture at its first new epoch, what the new epoch re-seals and
what it leaves, and byte-level tampering with the new pieces (an edited or
swapped epoch, an edited base), each refused as damage, never served."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stash.core.errors import Damaged, StashError, Unauthorized
from stash.crypto import aead, keys, tokens
from stash.service.access import Vault
from stash.storage import formats
from tests.fixtures import make_release1 as release1
from tests.fixtures import make_release2 as release2
from tests.support.api import CHEAP_KDF

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def release1_token(label: str) -> str:
    body = f"stash1_{release1.USER_ID}_{tokens._b62(int.from_bytes(release1.secret_of(label), 'big'), 43)}"
    return body + tokens._checksum(body)


# name: (user id, owner token, a reader that stays, the grant to revoke and its token)
CASES = {
    "release1": (release1.USER_ID, release1_token("owner"), release1_token("read"), 2, release1_token("full")),
    "release2": (
        release2.USER_ID,
        release2.token_of("owner"),
        release2.token_of("phone"),
        2,
        release2.token_of("laptop"),
    ),
}


def served(vault: Vault, token: str) -> dict:
    """Everything an owner is served from the memory file."""
    with vault.session(token, "owner") as s:
        mf = s.open_memory().mf
        T = mf.count()
        try:
            woke: object = s.open_memory().wake()["lines"]
        except StashError as refused:  # naps due after an erasure
            woke = refused.code
        return {
            "T": T,
            "log": [line for batch in mf.scan(T) for line in batch],
            "levels": {size: list(mf.level(size)) for size in mf.level_sizes()},
            "config": mf.config(),
            "receipts": mf.receipts(),
            "wake": woke,
        }


def file_rows(vault: Vault, token: str) -> tuple[dict[str, str], dict[str, list[int | None]]]:
    """The memory file's meta and each sealed table's epoch values."""
    with vault.session(token, "owner") as s:
        conn = s.open_memory().mf.conn
        meta = dict(conn.execute("SELECT name, value FROM meta"))
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        epochs = {}
        for t in ("memory_keys", "summaries", "config", "erased", "erasures"):
            if t in tables and any(c[1] == "epoch" for c in conn.execute(f"PRAGMA table_info({t})")):
                epochs[t] = [r[0] for r in conn.execute(f"SELECT epoch FROM {t}")]
        return meta, epochs


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_earlier_release_is_upgraded_by_its_first_new_epoch_and_loses_nothing(tmp_path: Path, name: str):
    _user_id, owner, reader, revoke_id, revoked = CASES[name]
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / name, data)
    vault = Vault(data, CHEAP_KDF)
    with vault.session(reader, "read"):
        pass  # a format-1 grant moves to key epochs at its first use
    before = served(vault, owner)
    meta, epochs = file_rows(vault, owner)
    assert "sealed_base" not in meta and epochs == {}  # untouched until its first new epoch
    old_epoch = int(meta.get("epoch", "0"))

    with vault.session(owner, "owner") as s:
        vault.revoke_grant(s, revoke_id)
        vault.finish_epoch(s)
    meta, epochs = file_rows(vault, owner)
    assert meta["epoch"] == str(old_epoch + 1) and meta["sealed_base"] == str(old_epoch)
    T = before["T"]
    # Only the newest key chunk moved (its unused slots redrawn); every other row is as it was.
    assert epochs["memory_keys"] == [None] * (T // 128) + [old_epoch + 1] * (1 if T % 128 else 0)
    assert set(epochs["summaries"]) == {None}
    assert served(vault, owner) == before

    # Written from now on: under the new epoch's key, recorded as such.
    with vault.session(owner, "owner") as s:
        s.open_memory().note("after the new epoch")
        s.open_memory().mf.set_config({"WAKE_LINES": 77})
        s.open_memory().erase([T - 1])
    again = Vault(data, CHEAP_KDF)  # another process, the files as they are on disk
    after = served(again, owner)
    assert after["T"] == T + 1 and after["log"][: T - 1] == before["log"][: T - 1]
    assert after["log"][T].endswith("after the new epoch") and after["config"]["WAKE_LINES"] == 77
    meta, epochs = file_rows(again, owner)
    assert epochs["config"] == [old_epoch + 1] * len(epochs["config"])
    assert epochs["erased"][-1] == old_epoch + 1 and epochs["erasures"][-1] == old_epoch + 1
    with again.session(reader, "read") as s:
        assert s.open_memory().mf.count() == T + 1
    with pytest.raises(Unauthorized):
        with again.session(revoked, "read"):
            pass
    # stash verify reads the new format from the registry.
    disk = formats.OnDisk({}, frozenset(), frozenset(), "sqlcipher", 0, memory_meta=meta)
    assert next(f for f in formats.MEMORY_FORMATS if f.name == "row epochs") in formats.formats_of(disk)


def settle(s) -> None:
    while items := s.open_memory().batch_for(s.open_memory().mf.count(), 256)["batch"]:
        s.open_memory().settle([{"block": it["block"], "text": f"summary {it['block']}"} for it in items])


@pytest.fixture(scope="module")
def two_epochs_on(tmp_path_factory):
    """A store (plain file) two epochs on: rows of three epochs side by side.
    Built once; each test gets its own copy of the folder."""
    data = tmp_path_factory.mktemp("epochs") / "data"
    vault = Vault(data, CHEAP_KDF, "none")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.open_memory().import_entries([{"date": "2026-11-01", "text": f"epoch-0 memory {i}"} for i in range(200)])
        settle(s)
    for _ in range(2):
        with vault.session(ident.token, "owner") as s:
            gid, _ = vault.mint_grant(s, "read")
            vault.revoke_grant(s, gid)
            vault.finish_epoch(s)
        with vault.session(ident.token, "owner") as s:
            s.open_memory().note("one more")
            settle(s)
    return data, ident


@pytest.fixture
def bumped(two_epochs_on, tmp_path: Path):
    data, ident = two_epochs_on
    shutil.copytree(data, tmp_path / "data")
    return Vault(tmp_path / "data", CHEAP_KDF), ident, tmp_path / "data" / "users" / ident.user_id / "memory.db"


def edit(path: Path, sql: str, *args: object) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute(sql, args)
        conn.commit()
    finally:
        conn.close()


def test_a_store_two_epochs_on_reads_rows_of_three_epochs(bumped):
    vault, ident, _path = bumped
    got = served(vault, ident.token)
    assert got["log"][0].endswith("epoch-0 memory 0") and got["log"][-1].endswith("one more")
    _, epochs = file_rows(vault, ident.token)
    assert set(epochs["summaries"]) == {None, 2}  # epoch 0 (the base) and epoch 2 (written after both)


@pytest.mark.parametrize(
    "attack",
    [
        "epoch edited",
        "epoch nulled",
        "summary swapped across epochs",
        "base edited",
        "chunk epoch edited",
        "epoch not a number",
        "epoch ahead",
    ],
)
def test_tampering_with_row_epochs_is_refused_as_damage(bumped, attack: str):
    vault, ident, path = bumped
    if attack == "epoch edited":
        edit(path, "UPDATE summaries SET epoch = 1 WHERE epoch = 2")
    elif attack == "epoch nulled":
        edit(path, "UPDATE summaries SET epoch = NULL WHERE epoch = 2")
    elif attack == "summary swapped across epochs":
        # A summary sealed in epoch 2 given the place of one from epoch 0, epoch column and all.
        import sqlite3

        conn = sqlite3.connect(path)
        ((_size, _idx, sealed),) = conn.execute("SELECT size, idx, sealed FROM summaries WHERE epoch = 2 LIMIT 1")
        conn.execute("UPDATE summaries SET sealed = ?, epoch = 2 WHERE size = 2 AND idx = 0", (sealed,))
        conn.commit()
        conn.close()
    elif attack == "epoch not a number":
        edit(path, "UPDATE summaries SET epoch = 'two' WHERE epoch = 2")
    elif attack == "epoch ahead":
        edit(path, "UPDATE memory_keys SET epoch = 9 WHERE epoch IS NOT NULL")
    elif attack == "base edited":
        edit(path, "UPDATE meta SET value = '1' WHERE name = 'sealed_base'")
    else:
        edit(path, "UPDATE memory_keys SET epoch = 0 WHERE epoch IS NOT NULL")
    with pytest.raises(StashError) as refused:
        served(vault, ident.token)
    assert isinstance(refused.value, Damaged), refused.value


def test_an_older_epochs_key_opens_nothing_written_after_it(bumped):
    """The revocation guarantee, on the bytes: every row sealed in epoch 2
    fails under epoch 0's and 1's rows keys; only epoch 2's opens it."""
    import sqlite3

    vault, ident, path = bumped
    with vault.session(ident.token, "owner") as s:
        chain = s.keys
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT size, idx, sealed FROM summaries WHERE epoch = 2").fetchall()
    chunks = conn.execute("SELECT chunk, sealed FROM memory_keys WHERE epoch = 2").fetchall()
    conn.close()
    assert rows and chunks
    sealed_rows = [(sealed, f"summaries|{size}|{idx}") for size, idx, sealed in rows]
    sealed_rows += [(sealed, f"memory_keys|{c}") for c, sealed in chunks]
    for e in range(3):
        key = keys.subkey(chain.key(e), b"rows")
        for sealed, where in sealed_rows:
            ad = f"stash/v1|{ident.user_id}|{where}".encode()
            if e == 2:
                aead.open_sealed(key, sealed, ad)
            else:
                with pytest.raises(aead.Unsealable):
                    aead.open_sealed(key, sealed, ad)
