"""Who owns the files kept open between requests (storage/sqlite/pool.py): the
app's lifespan builds the pool with ``--keep-open`` seconds and hands it to
the vault, requests reuse the files it keeps, and the lifespan's end closes
every one whole. An app driven without its lifespan, like every tool that
opens stores itself, keeps nothing open."""

from __future__ import annotations

from pathlib import Path

import pytest

from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, make_settings, wal_folded


def leftovers(folder: Path) -> list[str]:
    """The WAL and shared-index files beside the user's two files: there
    while a connection is open, removed by the last close."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(("-wal", "-shm")))


def user_folder(data_dir: Path, token: str) -> Path:
    (folder,) = (data_dir / "users").iterdir()
    assert folder.name in token
    return folder


def test_the_lifespan_builds_the_pool_requests_reuse_it_and_its_end_closes_every_file(data_dir: Path):
    api = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF, keep_open=5.0)))
    vault = api.app.state.vault
    pool = vault.pool
    assert pool is not None and pool.enabled and vault.tags.pool is pool
    owner = api.init()["token"]
    assert api.post("/note", owner, json={"text": "kept"}).status_code == 200
    folder = user_folder(data_dir, owner)
    assert pool.idle_count() == 2  # the key ring and the memory file, for the next request
    # Once quiet, each file is whole on disk: the pool's thread folds its WAL in (storage/sqlite/pool.py).
    assert wal_folded(folder / "keyring.db", folder / "memory.db") and pool.idle_count() == 2
    assert api.get("/wake", owner).status_code == 200 and pool.idle_count() == 2
    api.close()
    assert vault.pool is None and vault.tags.pool is None
    assert not pool.enabled and pool.idle_count() == 0
    assert leftovers(folder) == []


@pytest.mark.parametrize("lifespan", [True, False], ids=["keep-open-0", "no-lifespan"])
def test_without_kept_open_files_every_request_closes_its_files(data_dir: Path, lifespan: bool):
    api = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF, keep_open=0.0 if lifespan else 5.0)), lifespan=lifespan)
    try:
        vault = api.app.state.vault
        assert (vault.pool is not None and not vault.pool.enabled) if lifespan else vault.pool is None
        owner = api.init()["token"]
        assert api.post("/note", owner, json={"text": "closed"}).status_code == 200
        assert api.get("/wake", owner).status_code == 200
        assert leftovers(user_folder(data_dir, owner)) == []
    finally:
        api.close()
