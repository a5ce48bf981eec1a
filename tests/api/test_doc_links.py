"""The documents are a front door and the rooms behind it (issue 14 item 6):
README.md stays short, and every relative Markdown link between the documents
reaches a file of this repository (and, into a Markdown file, one of its
headings); no link leaves the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stash.client import VERBS

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    "README.md",
    "SECURITY.md",
    "deploy/README.md",
    "stash/CLIENT.md",
    "bench/README.md",
    "API-REFERENCE.md",
    "docs/DESIGN.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "bench/HISTORY.md",
]
README_MAX_LINES = 150
BENCH_MAX_LINES = 300  # bench/README.md: how to run, today's numbers, how they are measured
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text with fenced blocks and code spans removed: a link is only a link outside code."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower-cased, punctuation dropped (letters,
    digits, ``_`` and ``-`` kept), each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return "".join(c for c in text if c.isalnum() or c in "_- ").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, with GitHub's ``-1``, ``-2`` for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    """Every link of ``doc`` that is not to the web and does not reach a file
    of the repository (or a heading of it), or that leaves the repository."""
    bad = []
    for target in LINK.findall(prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — not a file of ours
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc.resolve()
        if not dest.is_relative_to(root.resolve()):
            bad.append(f"{target} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no such heading)")
    return bad


@pytest.mark.parametrize("name", DOCS)
def test_every_relative_link_reaches_a_file_of_the_repository(name: str) -> None:
    doc = REPO / name
    assert doc.exists(), name
    assert broken_links(doc) == [], name


def test_the_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for room in DOCS[1:] + ["skill/SKILL.md"]:
        assert f"]({room}" in text, f"README.md does not link to {room}"


def test_the_bench_page_holds_current_numbers_not_a_log() -> None:
    """Runs, before-and-after figures and the commits they compared go to
    bench/HISTORY.md; bench/README.md keeps one current figure per row."""
    text = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= BENCH_MAX_LINES
    assert COMMIT.findall(text) == []
    assert re.findall(r"^#+ .*\bissue \d+", text, re.M | re.I) == []
    assert COMMIT.findall("before (c9cc522), after 10d5ed8; mode 0600, 2026-12-01, deadline") == ["c9cc522", "10d5ed8"]


def unreleased_entries(changelog: str) -> list[list[str]]:
    """Each entry of the Unreleased section: its lines, from its ``- `` on."""
    section = changelog.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    entries: list[list[str]] = []
    for line in section.splitlines():
        if line.startswith("- "):
            entries.append([line])
        elif line.startswith("  ") and entries:
            entries[-1].append(line)
    return entries


def test_each_unreleased_change_is_one_or_two_lines() -> None:
    """A change log entry is what a user or operator notices, not the run
    that measured it: one or two lines of at most 120 characters."""
    entries = unreleased_entries((REPO / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert len(entries) > 10
    assert [e[0] for e in entries if len(e) > 2 or any(len(line) > 120 for line in e)] == []
    probe = "## [Unreleased]\n### Added\n- one\n- two\n  lines\n- three\n  long\n  lines\n\n## [0.1.0]\n- old\n  x\n"
    assert [len(e) for e in unreleased_entries(probe)] == [1, 2, 3]


def test_the_client_manual_names_every_verb() -> None:
    text = (REPO / "stash" / "CLIENT.md").read_text(encoding="utf-8")
    missing = [v for v in VERBS if not re.search(rf"\bstash {re.escape(v)}\b", text)]
    assert missing == [], f"stash/CLIENT.md does not name {missing}"


def test_the_checker_catches_what_it_must(tmp_path: Path) -> None:
    """A checker that passes everything proves nothing: each kind of bad link is caught,
    and links inside code are not links."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# Stash\n\n## Where to read on\n", encoding="utf-8")
    (tmp_path / "OUTSIDE.md").write_text("# outside\n", encoding="utf-8")
    probe = root / "docs" / "probe.md"
    probe.write_text(
        "# A heading, with `code`\n\n"
        "[ok](../README.md#where-to-read-on) [ok too](#a-heading-with-code) [web](https://example.com)\n"
        "[gone](no-such-file.md) [out](../../OUTSIDE.md) [anchor](../README.md#no-such-heading)\n"
        "`[in code](nowhere.md)`\n\n```\n[in a fence](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(probe, root) == [
        "no-such-file.md (no such file)",
        "../../OUTSIDE.md (outside the repository)",
        "../README.md#no-such-heading (no such heading)",
    ]


SHOWN_BY = re.compile(r"\b((?:tests|bench)/[A-Za-z0-9_/]+\.py)\b")


@pytest.mark.parametrize("name", [*DOCS, "skill/SKILL.md"])
def test_every_test_or_bench_file_a_doc_names_exists(name: str) -> None:
    """A claim's "shown by" names the test that does the attack: that file
    must be there (a renamed or deleted test would leave the claim unproven)."""
    named = set(SHOWN_BY.findall((REPO / name).read_text(encoding="utf-8")))
    assert [path for path in sorted(named) if not (REPO / path).is_file()] == [], name
    if name == "SECURITY.md":
        assert len(named) >= 10  # the threat table cites its tests
