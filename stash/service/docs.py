"""The documents the server serves about itself: the skill (``GET /skill``)
and the API reference (``GET /reference``), so an agent that has only the
AGENTS.md block can read the whole protocol from the server it talks to
(docs/DESIGN.md, "HTTP surface")."""

from __future__ import annotations

from functools import cache

from .. import package_data
from ..core import sizes
from ..core.errors import Invalid
from . import instructions


def skill() -> str:
    """skill/SKILL.md, as the server serves it at ``GET /skill``."""
    return package_data.read_text("skill/SKILL.md")


def reference() -> str:
    """API-REFERENCE.md, as the server serves it at ``GET /reference``."""
    return package_data.read_text("API-REFERENCE.md")


PART_BYTES = sizes.SIZES["PART_CHARS"].default
"""The most bytes one part of the reference holds, its header and the order
that fetches the next included: what a wake part may hold, since an agent's
harness cuts long output alike."""


def _sections(text: str) -> list[str]:
    """The reference cut before each heading, each piece whole lines."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("#") or not out:
            out.append(line)
        else:
            out[-1] += line
    return out


def _pieces(section: str, budget: int) -> list[str]:
    """A section, or, when it is longer than ``budget`` bytes, its lines in
    runs of at most ``budget`` bytes cut after blank lines where it can (a
    paragraph or a table kept whole when it fits, a longer one cut between
    lines). Joined, the runs are the section, byte for byte."""
    if len(section.encode()) <= budget:
        return [section]
    paragraphs = [""]
    for line in section.splitlines(keepends=True):
        paragraphs[-1] += line
        if not line.strip():
            paragraphs.append("")
    out = [""]
    for para in paragraphs:
        for piece in [para] if len(para.encode()) <= budget else para.splitlines(keepends=True):
            if out[-1] and len(out[-1].encode()) + len(piece.encode()) > budget:
                out.append("")
            out[-1] += piece
    return [p for p in out if p]


def _next_order(n: int) -> str:
    return f"Run: {instructions.render(instructions.reference(n))}"


def _place(sections: list[str], first: int, rest: int) -> list[str]:
    """The sections' pieces filled greedily in order into bodies of at most
    ``first`` bytes (the first) and ``rest`` bytes (the others)."""
    bodies = [""]
    for section in sections:
        for piece in _pieces(section, min(first, rest) if len(bodies) == 1 else rest):
            room = first if len(bodies) == 1 else rest
            if bodies[-1] and len(bodies[-1].encode()) + len(piece.encode()) > room:
                bodies.append("")
            bodies[-1] += piece
    return bodies


def _contents(bodies: list[str]) -> str:
    where: dict[str, int] = {}
    for k, body in enumerate(bodies, 1):
        for line in body.splitlines():
            if line.startswith(("## ", "### ")):
                where.setdefault(("  - " if line.startswith("### ") else "- ") + line.lstrip("#").strip(), k)
    return (
        "Contents (section: part; the order at the end of a part fetches the next, and any part N is the "
        'same order with {"part": N}):\n' + "".join(f"{name}: {k}\n" for name, k in where.items()) + "\n"
    )


@cache
def reference_parts(budget: int = PART_BYTES) -> tuple[str, ...]:
    """The reference cut into parts an agent reads one at a time, each at
    most ``budget`` bytes: whole sections filled greedily in order (a section
    longer than a part goes in runs of whole paragraphs), the first part led
    by the contents (which part holds each section), every part but the last
    ending with the order that fetches the next, as a wake part does. The
    bodies, joined, are the reference byte for byte."""
    frame = 300  # a part's first line and the order that ends it
    sections = _sections(reference())
    bodies = _place(sections, budget - frame, budget - frame)
    for _ in range(8):  # the contents take room in the first part, which moves what the contents say
        contents = _contents(bodies)
        again = _place(sections, budget - frame - len(contents.encode()), budget - frame)
        if again == bodies:
            break
        bodies = again
    contents = _contents(bodies)
    total = len(bodies)
    parts = []
    for k, body in enumerate(bodies, 1):
        lead = f"Part {k} of {total}.\n\n" + (contents if k == 1 else "")
        tail = f"\n{_next_order(k + 1)}\n" if k < total else "\nThat is the whole reference.\n"
        parts.append(lead + body + tail)  # every body ends with a line break: the reference's lines are whole
    return tuple(parts)


def reference_part(part: int) -> str:
    """Part ``part`` of :func:`reference_parts`, or the refusal that names how many there are."""
    parts = reference_parts()
    if not 1 <= part <= len(parts):
        raise Invalid(
            f"The reference has {len(parts)} parts; ask for part 1 to {len(parts)}.", code="reference.no_part"
        )
    return parts[part - 1]
