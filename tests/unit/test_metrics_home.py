"""Where several workers keep their metrics files: never on the data
folder's filesystem while another writable place exists, in a fresh 0700
folder, and the folders of servers that died without cleaning up are swept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stash.web.metrics import FOLDER_PREFIX, metrics_home, prepare_multiprocess, remove_multiprocess


def test_no_place_on_the_data_folders_filesystem_is_chosen(tmp_path: Path) -> None:
    data = tmp_path / "data"
    same = tmp_path / "same-disk"
    same.mkdir()
    assert metrics_home(data, (str(same),)) is None  # the only candidate shares the data folder's disk
    assert metrics_home(data, ("", str(tmp_path / "missing"), str(same))) is None
    if os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev:
        assert metrics_home(data, (str(same), "/dev/shm")) == Path("/dev/shm")


def test_a_new_private_folder_and_the_dead_servers_swept(tmp_path: Path) -> None:
    home = metrics_home(tmp_path / "data")
    if home is None:
        env, folder = prepare_multiprocess(tmp_path / "data")
        assert folder == tmp_path / "data" / ".run" / "prometheus"
        return
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = home / f"{FOLDER_PREFIX}{dead.pid}-x"  # what a server killed with SIGKILL leaves
    left.mkdir()
    env, folder = prepare_multiprocess(tmp_path / "data")
    try:
        assert folder.parent == home and folder.name.startswith(f"{FOLDER_PREFIX}{os.getpid()}-")
        assert env == {"PROMETHEUS_MULTIPROC_DIR": str(folder)}
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert not left.exists()
    finally:
        remove_multiprocess(folder)
        if left.exists():
            left.rmdir()
    assert not folder.exists()
