"""The commands the service prints for an agent to run.

Every instruction must run exactly as printed in a shell that has the two
variables of the integration, ``STASH_URL`` and ``STASH_TOKEN``. The last line
of each always starts with ``Run: `` so the ``stash`` client can swap in its
own, shorter verb.

Whatever varies in a command (a block, a text, a body) goes through
``shell_word``, so a command stays data-safe whatever a memory or an agent's
line holds: the shell passes it on unchanged and runs nothing in it.
"""

from __future__ import annotations

import json
import shlex

_AUTH = '-H "Authorization: Bearer $STASH_TOKEN"'


def shell_word(text: str) -> str:
    """``text`` as one POSIX shell word that the shell passes on unchanged:
    single-quoted (nothing is special inside single quotes: not ``$``,
    backquote, backslash or ``!``), each single quote written ``'"'"'``."""
    return shlex.quote(text)


def _body(fields: dict) -> str:
    # The JSON text as one shell word; ensure_ascii=False keeps the text as the agent will read it.
    return shell_word(json.dumps(fields, ensure_ascii=False))


def nap(block: str, text: str = "<your line>") -> str:
    body = _body({"block": block, "text": text})
    return f"curl -s {_AUTH} -X POST \"$STASH_URL/nap\" -d {body}"


def nap_status() -> str:
    return f"curl -s {_AUTH} -X POST \"$STASH_URL/nap\" -d {_body({})}"


def wake(part: int | None = None, T: int | None = None) -> str:
    query = "" if part is None else f"?part={int(part)}&T={int(T)}"
    return f"curl -s {_AUTH} \"$STASH_URL/wake{query}\""


def note(text: str = "<one line>") -> str:
    return f"curl -s {_AUTH} -X POST \"$STASH_URL/note\" -d {_body({'text': text})}"
