"""The commands the service prints for an agent to run.

Every instruction must run exactly as printed in a shell that has the two
variables of the integration, ``STASH_URL`` and ``STASH_TOKEN``. The last line
of each always starts with ``Run: `` so the ``stash`` client can swap in its
own, shorter verb.
"""

from __future__ import annotations

_AUTH = '-H "Authorization: Bearer $STASH_TOKEN"'


def nap(block: str) -> str:
    body = '{"block": "' + block + '", "text": "<your line>"}'
    return f"curl -s {_AUTH} -X POST \"$STASH_URL/nap\" -d '{body}'"


def nap_status() -> str:
    return f"curl -s {_AUTH} -X POST \"$STASH_URL/nap\" -d '{{}}'"


def wake(part: int | None = None, T: int | None = None) -> str:
    query = "" if part is None else f"?part={part}&T={T}"
    return f"curl -s {_AUTH} \"$STASH_URL/wake{query}\""


def note() -> str:
    return f"curl -s {_AUTH} -X POST \"$STASH_URL/note\" -d '{{\"text\": \"<one line>\"}}'"
