"""The next steps the service hands an agent: as data, and as curl commands.

A next step is a plain object (:func:`step`): the method, the path, the JSON
``fields`` a program sends, the ``plain`` text body a shell sends instead, and
the ``placeholders`` a caller replaces with its own text. Answers carry these
objects in ``run``; the curl text beside them is rendered from them here
(:func:`render`), and the ``stash`` client and ``stash mcp`` render their own
commands from the same objects, never from this text
(docs/DESIGN.md, "Next steps").

A rendered command runs exactly as printed in sh, dash or bash with the two
variables of the integration, ``STASH_URL`` and ``STASH_TOKEN``, and none
carries a query string or a trailing slash (an agent behind a broker that
refuses query strings runs each one as printed). A command whose body holds a
placeholder sends it as a quoted here-document (``<<'STASH_END'``): the shell
passes every byte of its lines on as they are, so an agent that replaces the
placeholder with any line a memory may hold (apostrophes, quotes, backslashes,
``$( )``, backquotes, ``!``, ``%``, any Unicode) sends exactly that line. No
accepted line can close the here-document early: every body line of a nap,
batch or import starts with a block id or a date, and a note, summary or
regex equal to the delimiter is refused (:data:`stash.core.lines.DELIMITER`).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..core.lines import (
    BLOCK,
    DELIMITER,
    ONE_LINE,
    REGEX,
    SAME_REGEX,
    SAME_WORDS,
    WORDS,
    YOUR_LINE,
    summary_placeholder,
)

__all__ = ["BLOCK", "ONE_LINE", "REGEX", "SAME_REGEX", "SAME_WORDS", "WORDS", "YOUR_LINE", "summary_placeholder"]

_HEAD = 'curl -sS -H "Authorization: Bearer $STASH_TOKEN" -H "Accept: text/plain"'

DATE = "YYYY-MM-DD"


def step(
    method: str,
    path: str,
    fields: dict[str, Any] | None = None,
    plain: str | None = None,
    placeholders: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """One next step as data. ``fields``: the JSON body a program sends
    (``{}`` for none); ``plain``: the same request as a ``text/plain`` body,
    one line per line, or None when the step has nothing to fill in;
    ``placeholders``: the strings of ``fields`` and ``plain`` the caller
    replaces with its own text, each exactly as it appears there."""
    return {"method": method, "path": path, "fields": fields or {}, "plain": plain, "placeholders": list(placeholders)}


def render(s: dict[str, Any]) -> str:
    """The curl command of step ``s``. A step with a plain body sends it as a
    quoted here-document, the last lines of the command; any other sends its
    fields as one single-quoted JSON word (:func:`shell_word`), or nothing
    for a GET."""
    url = f'"$STASH_URL{s["path"]}"'
    if s["plain"] is not None:
        return (
            f"{_HEAD} -H \"Content-Type: text/plain\" {url} --data-binary @- <<'{DELIMITER}'\n{s['plain']}\n{DELIMITER}"
        )
    if s["method"] == "GET":
        return f"{_HEAD} {url}"
    return f"{_HEAD} {url} -d {shell_word(json.dumps(s['fields'], ensure_ascii=False))}"


def run_lines(steps: list[dict[str, Any]]) -> str:
    """Each step as an order on its own line, ``Run: <command>``."""
    return "\n".join(f"Run: {render(s)}" for s in steps)


def shell_word(text: str) -> str:
    """``text`` as one POSIX shell word that the shell passes on unchanged:
    single-quoted (nothing is special inside single quotes: not ``$``,
    backquote, backslash or ``!``), each single quote written ``'"'"'``."""
    return shlex.quote(text)


def nap(block: str) -> dict[str, Any]:
    return step("POST", "/nap", {"block": block, "text": YOUR_LINE}, f"{block} {YOUR_LINE}", [YOUR_LINE])


def nap_status() -> dict[str, Any]:
    return step("POST", "/nap", {})


def nap_batch(k: int) -> dict[str, Any]:
    return step("POST", "/nap", {"batch": k})


def nap_summaries(block_ids: list[str]) -> dict[str, Any]:
    holes = [summary_placeholder(b) for b in block_ids]
    return step(
        "POST",
        "/nap",
        {"summaries": [{"block": b, "text": h} for b, h in zip(block_ids, holes)]},
        "\n".join(f"{b} {h}" for b, h in zip(block_ids, holes)),
        holes,
    )


def wake(part: int | None = None, T: int | None = None) -> dict[str, Any]:
    if part is None:
        return step("GET", "/wake")
    return step("POST", "/wake", {"part": part, "T": T})


def reference(part: int) -> dict[str, Any]:
    """The next part of the API reference (a public route: the token the
    command sends, as every rendered command does, is not needed)."""
    return step("POST", "/reference", {"part": part})


def note() -> dict[str, Any]:
    return step("POST", "/note", {"text": ONE_LINE}, ONE_LINE, [ONE_LINE])


def recall(before: int | None = None) -> dict[str, Any]:
    """A search; with ``before``, the next older page of the same one. The
    plain body is the pattern on its first line and ``before N`` on the
    second."""
    q = REGEX if before is None else SAME_REGEX
    if before is None:
        return step("POST", "/recall", {"q": q}, q, [q])
    return step("POST", "/recall", {"q": q, "before": before}, f"{q}\nbefore {before}", [q])


def recall_words(before: str | None = None) -> dict[str, Any]:
    """A words search; with ``before`` (a page's ``more``), its next page.
    The plain body is the words on its first line, then a line ``#words``
    (or ``#words before CURSOR``): the second line is what tells it from a
    regex, whose body is one line or a ``before N`` line, and it is a shell
    comment should a pasted line close the here-document early."""
    w = WORDS if before is None else SAME_WORDS
    if before is None:
        return step("POST", "/recall", {"words": w}, f"{w}\n#words", [w])
    return step("POST", "/recall", {"words": w, "before": before}, f"{w}\n#words before {before}", [w])


def zoom() -> dict[str, Any]:
    return step("POST", "/zoom", {"block": BLOCK}, BLOCK, [BLOCK])


def import_() -> dict[str, Any]:
    return step(
        "POST", "/import", {"entries": [{"date": DATE, "text": ONE_LINE}]}, f"{DATE} {ONE_LINE}", [DATE, ONE_LINE]
    )
