"""The command line's edges: a reader that stops reading (``stash … | head``)
ends any verb quietly, with no traceback and the status a shell gives
SIGPIPE; Ctrl-C stops the client with 130 even when whatever started it
ignores SIGINT (a non-interactive shell's ``&``, a CI runner), as
``test_client_surface.py::test_interrupted_is_130`` needs whichever way the
suite was launched; a backup, and so a data folder restored from it with
``cp -a``, is 0700 at its top."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stash.service.access import Vault
from stash.service.ops.backup import backup
from tests.support.api import CHEAP_KDF
from tests.support.server import CLI_TIMEOUT, REPO, interrupted_while_waiting

CLOSED_PIPE = 141


def stash_env(base_url: str, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASH_")}
    env.update({"STASH_URL": base_url, "STASH_TOKEN": token or "", "HOME": env.get("HOME", "/tmp")})
    return env


def into_a_closed_pipe(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``stash ARGS`` with standard output a pipe whose reader has gone
    before the command writes anything."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stash", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both piped
    proc.stdout.close()  # the interpreter takes far longer to start than this
    try:
        err = proc.stderr.read().decode(errors="replace")
        return proc.wait(timeout=CLI_TIMEOUT), err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pipes") / "data"
    vault = Vault(folder, kdf=CHEAP_KDF)
    for _ in range(2):
        ident = vault.create_identity()
        with vault.session(ident.token, "full") as s:
            s.open_memory().note("a whimbrel on the mudflat")
    return folder


@pytest.mark.slow
def test_a_closed_pipe_ends_every_kind_of_verb_quietly(base_url: str, token: str, data: Path) -> None:
    env = stash_env(base_url, token)
    for args in (
        ["--help"],
        ["wake"],
        ["recall", "whimbrel"],
        ["health"],
        ["verify", str(data)],
        ["backup", str(data.parent / "backup-into-a-closed-pipe"), "--data", str(data)],
    ):
        code, err = into_a_closed_pipe(args, env)
        assert code == CLOSED_PIPE, (args, code, err)
        assert err == "", (args, err)  # no traceback, no "Exception ignored" from the interpreter's last flush


def test_ctrl_c_stops_the_client_even_when_its_parent_ignores_sigint(token: str) -> None:
    """The launch the issue found: the child inherits SIGINT ignored."""
    code, err = interrupted_while_waiting(
        [sys.executable, "-m", "stash", "wake"],
        lambda url: stash_env(url, token),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert code == 130
    assert "Traceback" not in err


def test_a_backup_and_a_folder_restored_from_it_are_0700_at_the_top(data: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)  # an operator's usual umask: a folder made without care would be 0755
    try:
        dest = tmp_path / "backups" / "stash-today"
        backup(data, dest)
        restored = tmp_path / "restored"
        subprocess.run(["cp", "-a", str(dest), str(restored)], check=True, timeout=CLI_TIMEOUT)
    finally:
        os.umask(old)
    for folder in (dest, restored):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        assert stat.S_IMODE((folder / "users").stat().st_mode) == 0o700
