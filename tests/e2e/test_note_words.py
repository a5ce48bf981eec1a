"""A memory is a named log; one line of it is a note (API-REFERENCE.md,
"Glossary"). What a person reads from the `stash` command — its listing of
memories, its counts, its `--help` — and from the owner console in a real
headless Chromium counts notes as notes and never calls a line a memory,
while "memory" still names the store: "memory main: 2 notes"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from stash import client
from tests.e2e.browser import BrowserError, Chromium, desktop_page
from tests.support.server import Cli

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("cli", ["file"], indirect=True)]

# The ways a sentence calls a line of a log a memory: a count of them, a memory id, and the phrases the client
# and console used for lines ("search every memory with a regex", "dated memories", "only memories before").
LINE_AS_MEMORY = re.compile(
    r"\b\d[\d,]* memor(y|ies)\b|\bmemory ids?\b|\b(dated|erased|matching|raw) memor(y|ies)\b|\bfirst memories\b"
    r"|\bmemor(y|ies) (before|whose|matching)\b|\bevery memory (with|whose|word)\b|\bshred memories\b",
    re.IGNORECASE,
)


def lines_called_memories(text: str) -> list[str]:
    return [m.group(0) for m in LINE_AS_MEMORY.finditer(text)]


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    with desktop_page(tmp_path_factory.mktemp("words-chromium") / "profile", network=False) as browser:
        yield browser


def until(page: Chromium, expression: str) -> None:
    try:
        page.wait_for(expression)
    except BrowserError as e:
        said = page.js("document.getElementById('status').textContent")
        raise AssertionError(f"{e}; the page said: {said}") from None


def press(page: Chromium, selector: str) -> None:
    until(
        page,
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        f" return !!e && !e.disabled && e.offsetParent !== null; }})()",
    )
    page.js(f"document.querySelector({json.dumps(selector)}).focus()")
    page.enter()


def fill(page: Chromium, selector: str, text: str) -> None:
    page.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = ''; e.focus(); }})()")
    page.type_text(text)


def test_notes_are_counted_as_notes_and_memories_named_as_memories(
    cli: Cli, base_url: str, token: str, chrome: Chromium
) -> None:
    for text in ("chose jade over chrome", "the harbor review moved to Friday"):
        cli.ok("note", text)
    said = []

    # The command's listing, its fork and its erasure count notes.
    listing = cli.ok("memories")
    assert listing.startswith("main: 2 notes, "), listing
    forked = cli.ok("memories", "fork", "main", "copy", "--at", "1")
    assert "memory main into memory copy with its first 1 note " in forked, forked
    erased = cli.ok("erase", "1")
    assert erased.startswith("Erased 1 of 1 note."), erased
    said += [listing, forked, erased]
    # Its help, of every verb: a line is a note there too.
    said.append(cli.ok("--help"))
    said += [cli.ok(verb, "--help") for verb in client.VERBS]
    assert any("note ids, as the wake prints them" in text for text in said)
    assert [found for text in said for found in lines_called_memories(text)] == []

    # The console: the Memories table counts each memory's notes, and a dry run names notes of a memory.
    page = chrome
    page.goto(base_url + "/console")
    fill(page, "#token", token)
    page.enter()
    until(page, "!document.getElementById('app').hidden")
    until(page, "!!document.querySelector('#memories tbody tr[data-memory=\"main\"]')")
    heads = page.js("[...document.querySelectorAll('#memories thead th')].map(th => th.textContent)")
    assert heads[:2] == ["Name", "Notes"], heads
    row = page.js(
        "[...document.querySelectorAll('#memories tbody tr[data-memory=\"main\"] td')].map(td => td.textContent)"
    )
    assert row[:2] == ["main", "2"], row
    until(
        page,
        "document.querySelector('svg[data-memory=\"copy\"]').getAttribute('aria-label') === "
        "'wake shape of memory copy: 1 note'",
    )
    page.js("(() => { const s = document.getElementById('erase-ids-memory'); s.value = 'main'; })()")
    fill(page, "#erase-ids", "0")
    press(page, "#erase-ids-form button")
    until(page, "!document.getElementById('erase-plan').hidden")
    assert page.js("document.getElementById('erase-plan-text').textContent") == "Erase 1 note of memory main: #0?"
    shown = page.js("document.body.innerText")
    assert lines_called_memories(shown) == [], shown
