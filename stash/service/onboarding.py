"""What ``POST /init`` hands a new user: the token once, and the AGENTS.md block."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from .access import Identity

_HERE = Path(__file__).resolve().parent
_CANDIDATES = (_HERE.parent / "skill" / "AGENTS.md", _HERE.parent.parent / "skill" / "AGENTS.md")


@cache
def agents_template() -> str:
    for path in _CANDIDATES:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise RuntimeError("skill/AGENTS.md is missing from the installation")


def agents_block(url: str) -> str:
    """skill/AGENTS.md with its one placeholder, ``{url}``, filled. A plain
    replace, not str.format, so the file's JSON braces are written as they
    are and the file reads exactly as the block it becomes."""
    return agents_template().replace("{url}", url)


def init_answer(ident: Identity, url: str, content_cipher: str) -> dict:
    return {
        "user_id": ident.user_id,
        "token": ident.token,
        "content_cipher": content_cipher,
        "file_cipher": ident.file_cipher,
        "note": (
            "This token is shown once and never stored: it is the only key to this memory. "
            "Set it as STASH_TOKEN and the server address as STASH_URL in your agent's environment; "
            "lose every token and the memory is gone for good."
        ),
        "prompt": agents_block(url),
    }
