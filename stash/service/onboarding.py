"""What ``POST /init`` hands a new user, and ``POST /grants`` the agent a
capability is minted for: the token once, and the AGENTS.md block that fits
its scope."""

from __future__ import annotations

from typing import Any

from .. import package_data
from .access import Identity

# A read capability's block has no note or nap section: it is never asked to write.
_TEMPLATES = {"full": "AGENTS.md", "owner": "AGENTS.md", "read": "AGENTS-read.md", "append": "AGENTS-append.md"}
BAD_URL = (
    "url must be the server's plain http(s) address, like https://stash.example (letters, digits and .-_~%/ "
    "in its path; no spaces, quotes or other characters)."
)


def agents_template(scope: str = "owner") -> str:
    return package_data.read_text(f"skill/{_TEMPLATES[scope]}")


def agents_block(url: str, scope: str = "owner") -> str:
    """The AGENTS.md block for an agent holding a capability of ``scope``
    (skill/AGENTS.md; skill/AGENTS-read.md for ``read``, skill/AGENTS-append.md
    for ``append``) with its one
    placeholder, ``{url}``, filled. A plain replace, not str.format, so the
    file's JSON braces are written as they are and the file reads exactly as
    the block it becomes."""
    block = agents_template(scope).replace("{url}", url)
    return block + SHARED if scope == "full" else block


# A full grant writes into a log it shares: the owner's block, and this.
SHARED = (
    "\n### This memory is shared\n\n"
    "Your capability is one of several: the owner and other agents write to the same log. A wake shows their\n"
    "notes beside yours, and a nap may ask you to summarise lines another writer noted: treat them as\n"
    "your own past. Note only what you did or learned; never note on another writer's behalf.\n"
)


def init_answer(ident: Identity, prompt: str, content_cipher: str) -> dict[str, Any]:
    """``POST /init``'s answer; ``prompt`` is the owner's block (agents_block), made before the identity was."""
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
        "prompt": prompt,
    }
