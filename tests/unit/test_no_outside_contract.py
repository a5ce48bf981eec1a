"""The project cites its own design document, never a contract kept outside
the repository: no tracked file names that outside document or cites its
sections, and a section sign cites only a published document named beside it
(an RFC, an Internet-Draft). Where a docstring or comment needs the rule it
follows, it cites docs/DESIGN.md by section name."""

from __future__ import annotations

import re

from tests.support.docs.tracked import REPO, texts

DESIGN = REPO / "docs" / "DESIGN.md"

# Built from parts, so that this file does not cite what it forbids.
_WORD = "SP" + "EC"
OUTSIDE = re.compile(rf"\b{_WORD}(?:\.md|\s*\u00a7|(?![A-Za-z0-9_]))")
CITATION = re.compile(r'docs/DESIGN\.md,?\s+"([^"]+)"')
SECTION = re.compile("\u00a7")
PUBLISHED = re.compile(r"\b(?:RFC ?\d+|draft-[a-z0-9-]+)", re.I)  # named within NEAR characters before the sign
NEAR = 80


def unpublished_sections(text: str) -> list[int]:
    """The line of each section sign with no published document named just before it,
    in the same clause (no ``;`` or full stop between)."""

    def cited(at: int) -> bool:
        names = list(PUBLISHED.finditer(text, max(0, at - NEAR), at))
        return bool(names) and not re.search(r";|\.\s", text[names[-1].end() : at])

    return [text.count("\n", 0, m.start()) + 1 for m in SECTION.finditer(text) if not cited(m.start())]


def test_every_section_sign_cites_a_published_document() -> None:
    """A bare section number cites a document the reader cannot open: cite
    docs/DESIGN.md by section name instead."""
    hits = [f"{name}:{line}" for name, text in texts().items() for line in unpublished_sections(text)]
    assert hits == []


def test_every_design_citation_names_a_section_of_the_design_document() -> None:
    sections = set(re.findall(r"^## (.+?)\s*$", DESIGN.read_text(encoding="utf-8"), re.M))
    cited = {(name, m.group(1)) for name, text in texts().items() for m in CITATION.finditer(text)}
    assert len(cited) > 20  # the code does cite it
    assert sorted(c for c in cited if c[1] not in sections) == []


def test_the_checks_catch_what_they_must() -> None:
    """A needle that matches nothing proves nothing."""
    for cited in (f"see {_WORD} \u00a72.7", f"{_WORD}.md", f"the {_WORD}'s words", f"({_WORD} \u00a73)"):
        assert OUTSIDE.search(cited), cited
    for fine in (f"{_WORD}_SIZES", "SPECIAL", "spec", "inspect"):
        assert not OUTSIDE.search(fine), fine
    assert unpublished_sections("the cover (\u00a72.2: bisection)\nline two \u00a74") == [1, 2]
    assert unpublished_sections("(RFC 5869's reasoning; the contract's \u00a74)") == [1]
    assert unpublished_sections("draft-irtf-cfrg-xchacha\n(\u00a72.2.1, \u00a7A.3.1); RFC 8439 \u00a72.8") == []
    assert CITATION.findall('see (docs/DESIGN.md, "Forget") and docs/DESIGN.md "Wake"') == ["Forget", "Wake"]
