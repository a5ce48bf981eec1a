"""Every file of this repository that a comment, a docstring or a document
names by its path exists, and every section it names in quotes after a
document's path (``SECURITY.md, "Limits"``) is a heading or a bold lead of that
document: a file or section moved or renamed leaves no reader looking for it
under its old name (Markdown links are held by tests/api/test_doc_links.py).

A path is read where it starts at a top folder of the repository
(``tests/support/oracle.py``, ``stash/web/codes.py``, ``deploy/README.md``) or, ending
in a file's extension, at a folder inside one (``storage/pool.py``, found
wherever a folder of that name holds it). Not paths of this repository: a URL or
any path after a ``/`` (``~/.config/stash/pins.json``), a glob or a placeholder
(``bench/results/store-*``, ``users/<id>/``), a label (``stash/v1|…``), and
what a run makes under a folder .gitignore names (``bench/results/``).
bench/HISTORY.md and CHANGELOG.md's released sections are records of their
day, named as the tree then was; CHANGELOG's Unreleased is checked."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.docs.tracked import REPO, texts, tracked_files

# Records of their day (see the docstring); this file, whose probes name paths that do not exist.
RECORDS = {"bench/HISTORY.md", "tests/unit/test_named_paths.py"}
EXTENSION = r"\.(?:py|md|sql|json|toml|txt|js|css|html|sh|service|conf|ya?ml|cfg)"
NOT_A_PATH_AFTER = "*<{\\|"  # a glob, a placeholder, a regex's escaped dot, a label
NAMES = {"stash/role"}  # named like a path but no file: the key of an MCP content block's _meta (stash/tools/render.py)
CITED = re.compile(r'((?:[\w.-]+/)*[\w-]+\.md),?\s+\(?"([^"]+)"')  # README.md, "Where to read on"
HEADING = re.compile(r"^#{1,6}\s+(?:\d+\.\s+)?(.+?)\s*#*\s*$", re.M)  # "## 8. Replicated host" is "Replicated host"
BOLD_LEAD = re.compile(r"\*\*([^*]+?)\*\*")


def released(name: str, text: str) -> str:
    """The part of ``text`` the check reads: CHANGELOG.md up to its first released section."""
    if name != "CHANGELOG.md":
        return text
    unreleased = text.index("## [Unreleased]")
    end = text.find("\n## [", unreleased + 1)
    return text[:end] if end >= 0 else text


def finder(top: set[str], inner: set[str]) -> re.Pattern[str]:
    """Paths from a top folder (any) and from an inner folder (a file's, by its extension)."""
    alt = "|".join(re.escape(d) for d in sorted(top))
    nested = "|".join(re.escape(d) for d in sorted(inner - top))
    return re.compile(rf"(?<![\w./~$@-])(?>((?:{alt})/[\w./-]*)|((?:{nested})/[\w./-]*{EXTENSION}))(?![\w-]|\.\w)")


def made_by_runs(root: Path) -> list[str]:
    """Folders .gitignore names by a path (``bench/results/``): a run writes there."""
    ignore = root / ".gitignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.exists() else []
    return [line.strip().strip("/") for line in lines if "/" in line.strip().strip("/")]


def missing_paths(files: dict[str, str], tree: list[str], root: Path) -> list[str]:
    """``name:line path`` for each path named in ``files`` (name → text) that is
    not in ``tree`` (the repository's files, relative to ``root``)."""
    folders = {"/".join(Path(f).parts[:i]) for f in tree for i in range(1, len(Path(f).parts))}
    top = {f for f in folders if "/" not in f}
    inner = {Path(f).name for f in folders if "/" in f}
    # every tail of every path of the tree: where an inner folder's path may be found
    tails = {"/".join(Path(p).parts[i:]) for p in folders | set(tree) for i in range(len(Path(p).parts))}
    runs = made_by_runs(root)
    find = finder(top, inner)
    out = []
    for name, text in sorted(files.items()):
        for m in find.finditer(released(name, text)):
            path = (m.group(1) or m.group(2)).rstrip(".")
            after = text[m.end() : m.end() + 1]
            if (after and after in NOT_A_PATH_AFTER) or path in NAMES:
                continue
            if any(path == r or path.startswith(r + "/") for r in runs):
                continue
            here = (root / path).exists() if m.group(1) else path in tails
            if not here:
                out.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1} {path}")
    return out


def words(text: str) -> str:
    return " ".join(text.replace("`", "").replace("*", "").split()).lower().rstrip(".")


def unknown_sections(files: dict[str, str], root: Path) -> list[str]:
    """``name:line document "section"`` for each section cited by name that
    starts no heading and no bold lead of that document."""
    known: dict[Path, list[str]] = {}
    out = []
    for name, text in sorted(files.items()):
        for m in CITED.finditer(released(name, text)):
            doc = next((d for d in (root / m.group(1), (root / name).parent / m.group(1)) if d.is_file()), None)
            if doc is None:  # not a document of the tree: the path check speaks of it
                continue
            if doc not in known:
                body = doc.read_text(encoding="utf-8")
                known[doc] = [words(h) for h in HEADING.findall(body) + BOLD_LEAD.findall(body)]
            if not any(h.startswith(words(m.group(2))) for h in known[doc]):
                out.append(f'{name}:{text.count(chr(10), 0, m.start()) + 1} {m.group(1)} "{words(m.group(2))}"')
    return out


def repository_texts() -> tuple[dict[str, str], list[str]]:
    tree = [p.relative_to(REPO).as_posix() for p in tracked_files()]
    read = {name: text for name, text in texts().items() if name.endswith((".md", ".py")) and name not in RECORDS}
    return read, tree


def test_every_path_a_comment_or_document_names_exists() -> None:
    texts, tree = repository_texts()
    assert len(texts) > 300  # the scan reads the tree
    assert missing_paths(texts, tree, REPO) == []


def test_every_section_a_comment_or_document_names_exists() -> None:
    texts, _ = repository_texts()
    assert unknown_sections(texts, REPO) == []


def test_the_check_catches_what_it_must(tmp_path: Path) -> None:
    """A check that passes everything proves nothing: a stale path is caught,
    from the root and from an inner folder; what is not a path of the tree is not."""
    tree = ["stash/storage/pool.py", "tests/support/oracle.py", "bench/README.md", ".gitignore"]
    for name in tree:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n", encoding="utf-8")
    (tmp_path / ".gitignore").write_text("__pycache__/\nbench/results/\n", encoding="utf-8")
    probe = (
        "see tests/support/oracle.py and tests/invariants/_oracle.py; storage/pool.py, storage/files.py.\n"
        "bench/README.md#current-numbers, `stash/storage/`, stash/gone/ and tests/support/oracle.py::digest\n"
        "not paths: https://example.com/tests/x.py ~/.config/stash/pins.json bench/results/store-1000000\n"
        "bench/results/x.md bench/x*.py users/<id>/ stash/v1|user docs/DESIGN\\.md web/CLI\n"
    )
    changelog = "# Changelog\n\n## [Unreleased]\n- moved to stash/new.py\n\n## [0.1.0]\n- in stash/old.py\n"
    assert missing_paths({"a.md": probe, "CHANGELOG.md": changelog}, tree, tmp_path) == [
        "CHANGELOG.md:4 stash/new.py",
        "a.md:1 tests/invariants/_oracle.py",
        "a.md:1 storage/files.py",
        "a.md:2 stash/gone/",
    ]
    (tmp_path / "bench" / "README.md").write_text(
        "# Bench\n\n## 8. Replicated host and failover\n\n**Limits.** none\n", encoding="utf-8"
    )
    cites = (
        'see bench/README.md, "Replicated host"; (README.md, "Limits"), `bench/README.md` "Bench"\n'
        'gone: bench/README.md, "Issue 27, item 3"; elsewhere: no/such.md "x"'
    )
    assert unknown_sections({"bench/a.py": cites}, tmp_path) == ['bench/a.py:2 bench/README.md "issue 27, item 3"']
