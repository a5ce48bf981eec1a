"""deploy/stash-backup.sh, the timer's job: a copy becomes a backup only once
`stash verify` has passed on it, a failed copy leaves nothing behind and
removes nothing, and only the newest STASH_BACKUP_KEEP backups are kept.

`stash backup` and `stash verify` themselves are tested with the data they
copy; here STASH_BIN is a stand-in whose outcome the test chooses, because
what is under test is the script's bookkeeping around them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.api import CHEAP_KDF, token_parts
from tests.support.ops.deploy import DEPLOY

OLD = ["20240101T031700Z", "20240102T031700Z", "20240103T031700Z"]


def stand_in(tmp: Path, backup_ok: bool = True, verify_ok: bool = True) -> Path:
    exe = tmp / "stash"
    exe.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = backup ]; then mkdir -p "$2/users/0123456789abcdef" && echo copy > "$2/users/f"; '
        f"{'exit 0' if backup_ok else 'exit 1'}; fi\n"
        f'if [ "$1" = verify ]; then [ -f "$2/users/f" ] || exit 3; {"exit 0" if verify_ok else "exit 1"}; fi\n'
        "exit 2\n",
        encoding="utf-8",
    )
    exe.chmod(0o755)
    return exe


def run(tmp: Path, backups: Path, exe: Path, keep: int = 2) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "STASH_BACKUP_DIR": str(backups),
        "STASH_BACKUP_KEEP": str(keep),
        "STASH_BIN": str(exe),
    }
    return subprocess.run(
        ["sh", str(DEPLOY / "stash-backup.sh")], env=env, capture_output=True, text=True, timeout=60, cwd=tmp
    )


def with_old_backups(tmp: Path) -> Path:
    backups = tmp / "backups"
    for name in OLD:
        (backups / name / "users").mkdir(parents=True)
    return backups


def test_a_verified_copy_is_kept_and_the_oldest_are_rotated_out(tmp_path: Path) -> None:
    backups = with_old_backups(tmp_path)
    res = run(tmp_path, backups, stand_in(tmp_path), keep=2)
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in backups.iterdir())
    assert len(names) == 2 and names[0] == OLD[-1], names
    assert (backups / names[1] / "users" / "f").read_text() == "copy\n"
    assert names[1] in res.stdout


def test_a_failed_copy_leaves_nothing_and_removes_nothing(tmp_path: Path) -> None:
    for case, outcome in {"backup fails": {"backup_ok": False}, "verify fails": {"verify_ok": False}}.items():
        folder = tmp_path / case.replace(" ", "_")
        folder.mkdir()
        backups = with_old_backups(folder)
        res = run(folder, backups, stand_in(folder, **outcome), keep=1)
        assert res.returncode != 0, case
        assert sorted(p.name for p in backups.iterdir()) == OLD, case  # no partial copy, no rotation


def test_the_script_runs_the_real_backup_and_verify(tmp_path: Path) -> None:
    """The same script with the installed `stash`: the verbs and arguments it
    calls are the ones `stash backup` and `stash verify` take."""
    import shutil
    import sys

    from stash.service.access import Vault

    data = tmp_path / "data"
    vault = Vault(data, kdf=CHEAP_KDF)
    token = vault.create_identity().token
    with vault.session(token, "full") as s:
        s.open_memory().note("kept by the nightly backup")
    exe = shutil.which("stash", path=str(Path(sys.executable).parent))
    assert exe, "the stash command is not installed beside this Python"
    backups = tmp_path / "backups"
    backups.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "STASH_BACKUP_DIR": str(backups),
        "STASH_BACKUP_KEEP": "2",
        "STASH_BIN": exe,
        "STASH_DATA": str(data),
    }
    res = subprocess.run(
        ["sh", str(DEPLOY / "stash-backup.sh")], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    (copy,) = list(backups.iterdir())
    assert copy.name.startswith("2") and (copy / "users" / vault_user(token) / "memory.db").is_file()
    with Vault(copy, kdf=CHEAP_KDF).session(token, "read") as s:
        assert s.open_memory().mf.memory(0)[2] == "kept by the nightly backup"


def vault_user(token: str) -> str:

    return token_parts(token).user_id
