"""A backup is whole or says so (service/ops/backup.py): ``stash backup`` killed
-9 at random instants while it copies, and ``stash verify`` of every partial
copy fails, naming the users it is missing."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stash.service.access import Vault
from tests.support.api import CHEAP_KDF
from tests.support.installed import OUTSIDE
from tests.support.server import CLI_TIMEOUT

pytestmark = pytest.mark.slow

USERS = 8
TRIALS = 3


def stash(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stash", *args], capture_output=True, text=True, cwd=OUTSIDE, timeout=CLI_TIMEOUT
    )


def test_a_backup_killed_mid_copy_never_passes_verify(tmp_path: Path):
    data = tmp_path / "data"
    vault = Vault(data, kdf=CHEAP_KDF, file_cipher="none")
    for _ in range(USERS):
        ident = vault.create_identity()
        with vault.session(ident.token, "full") as s:
            s.open_memory().note("a memory to back up")
    rng = random.Random()
    partial = 0
    for trial in range(TRIALS):
        dest = tmp_path / f"backup-{trial}"
        after = rng.randrange(0, USERS)  # users copied before the kill: a random instant of the copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "stash", "backup", str(dest), "--data", str(data)],
            cwd=OUTSIDE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + CLI_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            users = dest / "users"
            if (dest / "backup.json").exists() and users.is_dir() and len(list(users.iterdir())) > after:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=CLI_TIMEOUT)
        manifest = json.loads((dest / "backup.json").read_text())
        checked = stash("verify", str(dest))
        if manifest["complete"]:
            assert checked.returncode == 0, checked.stdout  # it finished before the kill landed
            continue
        partial += 1
        assert checked.returncode == 1, checked.stdout
        held = len(list((dest / "users").iterdir()))
        assert f"it holds {held} of the {USERS} users it was to copy" in checked.stdout, checked.stdout
    assert partial, "every backup finished before its kill: the trials tested nothing"
