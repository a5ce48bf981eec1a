"""The files git tracks in this checkout, and their text: what the tests that
read the whole tree (tests/unit/test_no_outside_contract.py,
tests/unit/test_named_paths.py) read."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def tracked_files() -> list[Path]:
    """Every file git tracks here (without git, the whole tree but .git, the venv and the tools' caches,
    which .gitignore keeps out of git: pytest's records node ids of tests that may be gone)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
        return [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO).parts)]
    # A link (stash/skill and the package's other links to top-level files) is read as its target is.
    return [REPO / name for name in out.decode().split("\0") if name and not (REPO / name).is_symlink()]


def texts() -> dict[str, str]:
    """Each tracked text file's path (relative, with ``/``) and its text."""
    out = {}
    for path in tracked_files():
        try:
            out[path.relative_to(REPO).as_posix()] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):  # binary fixtures; a file deleted but not yet staged
            continue
    return out
