"""The byte quota sums a user's folder while other requests of the same
user close their files, which deletes WAL and shared-memory files: a file
gone between the listing and its size counts nothing, and never turns a
write into a 503 store.unreadable."""

from __future__ import annotations

import threading
from pathlib import Path

from stash.service.quotas import folder_bytes


def test_a_file_deleted_while_the_folder_is_summed_counts_nothing(tmp_path: Path) -> None:
    kept = tmp_path / "memory.db"
    kept.write_bytes(b"x" * 4096)
    for _ in range(40):
        doomed = [tmp_path / f"recall-{i}.db-shm" for i in range(400)]
        for path in doomed:
            path.write_bytes(b"y" * 32)
        start = threading.Barrier(2)

        def delete(paths: list[Path] = doomed, start: threading.Barrier = start) -> None:
            start.wait()
            for path in paths:
                path.unlink()

        deleter = threading.Thread(target=delete)
        deleter.start()
        start.wait()
        total = folder_bytes(tmp_path)
        deleter.join()
        assert 4096 <= total <= 4096 + 32 * 400 and (total - 4096) % 32 == 0
    assert folder_bytes(tmp_path) == 4096
