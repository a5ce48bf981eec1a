"""Which ``stash`` the tests run: the package installed in this interpreter's
environment, as a user runs it, never the checkout's ``stash/`` folder.

``python -m pytest`` puts the checkout first on ``sys.path`` (the tests import
``tests.*`` from it), where ``import stash`` would find the source folder: a
server started from the checkout, or a test importing from it, would read
files a wheel may not carry. So every process a test starts runs in
``OUTSIDE``, a working directory of its own outside the checkout, with no
``PYTHONPATH`` of the caller's (``child_env``), and the test process itself
imports the ``stash`` such a process imports (``pin``). Under the README's
``pip install '.[test]'`` (and CI's) that is the wheel built from this
checkout, in the venv's site-packages; under CONTRIBUTING's editable install
it is the checkout, by the contributor's choice.

Standard library only: tests/conftest.py calls ``pin`` before anything
imports ``stash``."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "stash-agent-memory"  # pyproject.toml's name
OUTSIDE = Path(tempfile.mkdtemp(prefix="stash-tests-cwd-"))
"""The working directory of every process a test starts (and of the test
process, tests/conftest.py): empty, so nothing in it can be imported."""


@atexit.register
def _remove_outside() -> None:
    with contextlib.suppress(OSError):
        os.rmdir(OUTSIDE)  # only if empty: a test that left a file there shows it


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) without ``PYTHONPATH``,
    which would put another copy of the package before the installed one."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}


PROBE = "import stash, sys; sys.stdout.write(stash.__file__)"


def imported_by(argv0: list[str], cwd: Path, env: dict[str, str]) -> Path:
    """The package folder ``import stash`` finds for the interpreter
    ``argv0`` started in ``cwd`` with ``env``."""
    done = subprocess.run([*argv0, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(
            "stash is not installed for this interpreter; install it as README.md says "
            "(pip install '.[test]') or as CONTRIBUTING.md says (pip install -e '.[test]'):\n" + done.stderr[-2000:]
        )
    return Path(done.stdout).resolve().parent


def pin() -> Path:
    """Import, in this process, the ``stash`` a process started by a test
    imports, and return its folder. After this, every ``stash.*`` module
    comes from that folder, whatever ``sys.path`` holds."""
    folder = imported_by([sys.executable], OUTSIDE, child_env())
    if "stash" not in sys.modules:
        sys.path.insert(0, str(folder.parent))
        try:
            import stash  # noqa: F401 - cached in sys.modules: the pin itself
        finally:
            sys.path.remove(str(folder.parent))
    got = Path(sys.modules["stash"].__file__ or "").resolve().parent
    if got != folder:
        raise RuntimeError(f"the tests imported stash from {got} before it could be pinned to {folder}")
    return folder


def is_editable() -> bool:
    """Whether this environment's install is CONTRIBUTING's ``pip install -e``
    (its record says so: PEP 610's direct_url.json)."""
    record = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    return bool(record and json.loads(record).get("dir_info", {}).get("editable"))


def installed_folder() -> Path:
    """Where the package under test must come from: this environment's
    site-packages, for the README's and CI's install; the checkout, for an
    editable one, whose whole point is to run it."""
    if is_editable():
        return CHECKOUT / "stash"
    return Path(sysconfig.get_paths()["purelib"]).resolve() / "stash"
