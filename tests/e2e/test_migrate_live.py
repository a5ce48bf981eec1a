"""``stash migrate`` beside a real ``stash serve`` (another process) that keeps
taking notes: each memory moves under its lock, the requests meanwhile wait
instead of failing, every acknowledged note is there after, on plain files,
and the workers go on serving them without a restart."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stash.service.access import Vault
from stash.service.ops.migrate import migrate
from stash.storage.sqlite.connections import available_file_cipher
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import start_server

PLAIN_HEADER = b"SQLite format 3\x00"


@pytest.mark.slow
@pytest.mark.skipif(available_file_cipher() != "sqlcipher", reason="needs SQLCipher to make old stores")
def test_migrate_beside_a_running_server_loses_no_acknowledged_note(tmp_path: Path) -> None:
    server = start_server(
        tmp_path, "--workers", "1", "--keep-open", "0", "--file-cipher", "sqlcipher", *CHEAP_KDF_FLAGS
    )
    http = loopback.client(base_url=server.url, timeout=30)
    stop = threading.Event()
    try:
        owner = http.post("/init", json={}).json()["token"]
        h = {"Authorization": f"Bearer {owner}"}
        assert http.post("/memories", headers=h, json={"name": "work"}).status_code == 201
        user = server.data / "users" / owner.split("_")[1]
        acked: dict[str, list[str]] = {"": [], "/m/work": []}
        failures: list[str] = []

        def writer(prefix: str) -> None:
            with loopback.client(base_url=server.url, timeout=30) as c:
                k = 0
                while not stop.is_set():
                    text = f"tern {prefix or 'main'} {k}"
                    resp = c.post(f"{prefix}/note", headers=h, json={"text": text})
                    if resp.status_code == 200:
                        acked[prefix].append(text)
                    else:
                        failures.append(f"{resp.status_code} {resp.text[:200]}")
                    k += 1

        threads = [threading.Thread(target=writer, args=(p,)) for p in acked]
        for t in threads:
            t.start()
        while min(len(v) for v in acked.values()) < 3:
            threading.Event().wait(0.02)
        (result,) = migrate(server.data, [owner], wait=10.0)
        while min(len(v) for v in acked.values()) < 6:  # writes go on after the move, on the new files
            threading.Event().wait(0.02)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert [(m.memory, m.outcome) for m in result.memories] == [("main", "converted"), ("work", "converted")]
        assert result.report is not None and result.report.ok, result.report
        assert failures == []
        for folder in (user, user / "m" / "work"):
            with open(folder / "memory.db", "rb") as f:
                assert f.read(16) == PLAIN_HEADER
        assert http.get("/wake", headers=h).status_code == 200
    finally:
        stop.set()
        http.close()
        server.stop()
    vault = Vault(server.data)
    for prefix, texts in acked.items():
        with vault.session(owner, "read", memory=prefix.removeprefix("/m/") or "main") as s:
            assert s.cipher == "none"
            mf = s.open_memory().mf
            held = [line.split(" ", 2)[2] for batch in mf.scan(mf.head.count) for line in batch]
        assert [t for t in texts if t not in held] == [], prefix
