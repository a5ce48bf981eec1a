"""The files the package reads at run time besides its modules, declared
once, and the one way it reads them.

Each lives inside the package folder, so a checkout, an editable install
and an installed wheel read the same paths: ``skill``, ``schema.sql`` and
``API-REFERENCE.md`` are links there to the checkout's top-level copies
(where readers of the repository find them), and the wheel's build follows
the links, so the wheel carries their text. ``pyproject.toml`` packs the
package folder whole. tests/unit/test_package_data.py checks that the
installed package under test (and its wheel's record) holds every file named
here and that no other module reads a file of the package;
tests/deploy/test_deploy_files.py builds the container image's wheel and
checks it against the same names."""

from __future__ import annotations

from functools import cache
from importlib import resources

_PACKAGE = __name__.rpartition(".")[0]

FILES = frozenset(
    {
        "schema.sql",  # storage/sqlite/schema.py: the one schema every user file is made with and checked against
        "skill/SKILL.md",  # GET /skill
        "skill/AGENTS.md",  # the AGENTS.md block of an owner and of a full capability
        "skill/AGENTS-read.md",  # ... of a read capability
        "skill/AGENTS-append.md",  # ... of an append capability
        "API-REFERENCE.md",  # GET /reference
        "client.py",  # GET /client: the client, served as its source
        "web/landing.html",  # GET /
        "web/console/console.html",  # GET /console
        "web/console/console.js",
        "web/console/console.css",
        "web/console/consent.html",  # GET /authorize: the owner's consent page for an MCP host
        "py.typed",  # read by type checkers, not by the server: the library's annotations are its users' too
    }
)


@cache
def read_text(name: str) -> str:
    """The text of the package's file ``name`` (one of FILES)."""
    if name not in FILES:
        raise KeyError(f"{name} is not one of the package's declared files (stash/package_data.py)")
    try:
        return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    except OSError as exc:
        # The installation is broken, not a user's file: an internal error, never one a memory's store answers.
        raise RuntimeError(f"{name} is missing from the installed package; reinstall it") from exc
