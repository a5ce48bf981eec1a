"""Stash: permanent, encrypted memory for AI agents, served over HTTP."""

# The one declaration of the version: pyproject.toml reads it (hatch's version source), /health and
# /openapi.json answer it, and CHANGELOG.md's newest release is it (tests/unit/test_version.py).
__version__ = "0.4.0"

# The Python library (stash/CLIENT.md, "The Python library"): ``from stash import Stash``. Its names are
# imported on first use (__getattr__ below), so the server and the operator verbs, which live in this
# package too, never load the HTTP client and what it imports.
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client import (
        Archive,
        BadRequest,
        Batch,
        Conflict,
        Destroyed,
        Forbidden,
        Forgot,
        Forked,
        Found,
        Grant,
        Health,
        Imported,
        Initialized,
        Invalid,
        Listed,
        Matched,
        MemoryInfo,
        Minted,
        Nap,
        NapNeeded,
        NotAllowed,
        Noted,
        NotFound,
        RateLimited,
        Receipt,
        Revoked,
        Rotated,
        Saved,
        ServerError,
        Sizes,
        Stash,
        StashError,
        TooLarge,
        Unauthorized,
        Undone,
        Unopened,
        Unreachable,
        Wake,
        WakePart,
        Zoomed,
        error_class,
    )

__all__ = [
    "Archive",
    "BadRequest",
    "Batch",
    "Conflict",
    "Destroyed",
    "Forbidden",
    "Forgot",
    "Forked",
    "Found",
    "Grant",
    "Health",
    "Imported",
    "Initialized",
    "Invalid",
    "Listed",
    "Matched",
    "MemoryInfo",
    "Minted",
    "Nap",
    "NapNeeded",
    "NotAllowed",
    "NotFound",
    "Noted",
    "RateLimited",
    "Receipt",
    "Revoked",
    "Rotated",
    "Saved",
    "ServerError",
    "Sizes",
    "Stash",
    "StashError",
    "TooLarge",
    "Unauthorized",
    "Undone",
    "Unopened",
    "Unreachable",
    "Wake",
    "WakePart",
    "Zoomed",
    "__version__",
    "error_class",
]


def __getattr__(name: str) -> object:
    """One of the library's names (``__all__``), imported from stash.client
    the first time it is asked for."""
    if name in __all__ and name != "__version__":
        from . import client

        value = getattr(client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stash' has no attribute {name!r}")
