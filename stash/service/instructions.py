"""The commands the service prints for an agent to run.

Every instruction must run exactly as printed in a shell that has the two
variables of the integration, ``STASH_URL`` and ``STASH_TOKEN``. The last line
of each always starts with ``Run: `` so the ``stash`` client can swap in its
own, shorter verb.

Every command is built by :func:`command`, and none carries a query string or
a trailing slash: a read goes to its POST twin with a JSON body, so an agent
behind a broker that refuses query strings can run each one as printed
(docs/DESIGN.md, "HTTP surface").

Whatever varies in a command (a block, a text, a body) goes through
``shell_word``, so a command stays data-safe whatever a memory or an agent's
line holds: the shell passes it on unchanged and runs nothing in it.
"""

from __future__ import annotations

import json
import shlex

_AUTH = '-H "Authorization: Bearer $STASH_TOKEN"'


def command(path: str, body: dict | None = None) -> str:
    """``curl`` of ``POST $STASH_URL{path}`` with ``body`` as JSON (GET when
    there is no body). The JSON text is one shell word (:func:`shell_word`),
    so whatever a field holds reaches the server unchanged. ``ensure_ascii``
    is off so the text reads as the agent wrote it."""
    if body is None:
        return f'curl -s {_AUTH} "$STASH_URL{path}"'
    return f"curl -s {_AUTH} -X POST \"$STASH_URL{path}\" -d {shell_word(json.dumps(body, ensure_ascii=False))}"


def shell_word(text: str) -> str:
    """``text`` as one POSIX shell word that the shell passes on unchanged:
    single-quoted (nothing is special inside single quotes: not ``$``,
    backquote, backslash or ``!``), each single quote written ``'"'"'``."""
    return shlex.quote(text)


def nap(block: str, text: str = "<your line>") -> str:
    return command("/nap", {"block": block, "text": text})


def nap_batch(k: int) -> str:
    return command("/nap", {"batch": k})


def nap_summaries(block_ids: list[str]) -> str:
    return command("/nap", {"summaries": [{"block": b, "text": f"<your line for {b}>"} for b in block_ids]})


def wake(part: int | None = None, T: int | None = None) -> str:
    if part is None:
        return command("/wake")
    return command("/wake", {"part": part, "T": T})


def note(text: str = "<one line>") -> str:
    return command("/note", {"text": text})


def recall(before: int | None = None) -> str:
    body: dict = {"q": "<the same regex>"}
    if before is not None:
        body["before"] = before
    return command("/recall", body)


def zoom(block: str = "<lo-hi>") -> str:
    return command("/zoom", {"block": block})
