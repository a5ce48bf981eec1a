r"""Recall: a case-insensitive regular-expression search over rendered log lines.

A recall pattern is matched against each rendered memory line (``#i DATE
TEXT``) on its own; a line is reported when the pattern matches anywhere in it.

Accepted syntax (for API-REFERENCE.md)
--------------------------------------
* RE2 syntax (https://github.com/google/re2/wiki/Syntax). RE2 runs in time
  linear in the text, so no pattern can backtrack for ever. Literals, ``.``,
  bracket classes, ``\pL`` / ``\p{Greek}`` Unicode classes, ``[[:alpha:]]``,
  ``\d \s \w \b`` and their negations, ``^ $ \A \z``, alternation,
  ``* + ? {n} {n,} {n,m}`` (counts up to 1000) and their lazy ``?`` forms,
  ``(...)``, ``(?:...)``, ``(?P<name>...)``, ``\Q...\E``, and the flags
  ``(?s)``, ``(?U)``, ``(?m)``, ``(?i)``.
* Rejected with an error: backreferences (``\1``), lookahead and lookbehind
  (``(?=`` ``(?!`` ``(?<=`` ``(?<!``), atomic groups, possessive quantifiers,
  ``\Z`` (write ``\z``), ``\G``, ``(?x)``, counts above 1000.
* Always case-insensitive, as Python's ``re.IGNORECASE`` is for Unicode text:
  ``YILMAZ`` finds ``Yılmaz``, ``istanbul`` finds ``İstanbul``, ``σ`` finds
  ``Σ`` and ``ς``, ``k`` finds the Kelvin sign. A ``(?-i:...)`` group turns it
  off inside the group, as in Python (İ and ı are still read as ``i`` there).
* At most ``MAX_PATTERN_BYTES`` (512) bytes of UTF-8; the empty pattern is an
  error. A pattern whose compiled program would be too large (e.g.
  ``\pL{1000}``) is rejected.

Semantics to know (where this differs from Python's ``re``)
-----------------------------------------------------------
* ``\d``, ``\s`` and ``\b`` are ASCII: ``\d`` is ``[0-9]``, ``\s`` is
  ``[\t\n\f\r ]`` (no NBSP or other Unicode space), and ``\b`` counts only
  ``[0-9A-Za-z_]`` as word characters. ``\w`` is ``[0-9A-Za-z_]`` and its case
  variants (Kelvin sign, long s). Use ``\pL``, ``\pN``, ``\p{Z}`` for Unicode
  letters, numbers and spaces.
* The four Turkish i's (i, I, İ, ı) are one letter: İ (U+0130) and ı (U+0131)
  are read as ``i`` in both the pattern and the line (the original lines are
  returned). So ``[^\x00-\x7f]`` does not match İ or ı (nor does it in Python
  with IGNORECASE), and a numeric escape or range naming U+0130/U+0131 (such as
  ``\x{130}``) never matches them: write the letter itself.
* Each line is matched alone: ``^``/``\A`` are its start, ``$``/``\z`` its
  end, nothing matches a newline, and no match reaches into another line. A
  line counts once however often the pattern matches in it. A pattern that can
  match the empty string (``x*``) matches every line.
* ``\C`` (any single byte) is accepted, as RE2 has it, but matches a byte, not
  a character.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import re2

from .lines import DELIMITER

# The pybind class behind re2.compile(). Used directly because re2.compile()
# keeps the last 128 compiled patterns (the pattern text, which is private
# memory text, and up to max_mem of DFA state each) in a module-level cache
# after the request is gone, and because its Match() costs half the per-call
# overhead of the wrapper's search().
_RE2 = re2._re2.RE2
# google-re2 ships no type information: a compiled program and its bound
# Match method are opaque to the checker.
_Program = Any
_Match = Callable[..., Any]
_UNANCHORED = _RE2.Anchor.UNANCHORED
_ANCHOR_START = _RE2.Anchor.ANCHOR_START

MAX_PATTERN_BYTES = 512

# Lines per joined batch. One RE2 call never scans more than one batch (at
# most ~160 KB of 310-byte lines), which bounds how far a slow pattern can run
# past the deadline, and costs nothing measurable against larger batches.
_BATCH_LINES = 512
# In the per-line path, lines between two deadline checks.
_DEADLINE_EVERY = 128
# In scan_joined, the most bytes one RE2 call may cover (rounded up to the end
# of a line): the same bound as a batch of 512 of the longest lines.
_SEGMENT_BYTES = _BATCH_LINES * 310
# The UTF-8 of U+0130 and U+0131, the letters FOLD_TABLE maps, share their
# first byte: text without that byte (memchr-fast to rule out) is its own fold.
_FOLD_LEAD = 0xC4
_FOLDED_BYTES = ("\u0130".encode(), "\u0131".encode())
assert all(b[0] == _FOLD_LEAD for b in _FOLDED_BYTES)

# Python's re.IGNORECASE treats i, I, İ (U+0130) and ı (U+0131) as one letter;
# RE2's (?i) only pairs i with I (its Unicode simple case folding leaves İ and ı
# alone). The sweep in tests/unit/test_recall.py over every cased code point
# finds no other single-character disagreement, so this is the whole table.
# Mapping both to "i" is sound for the letters written in the pattern, in or
# out of a class; escapes that name them by number are the documented exception.
FOLD_TABLE = {"\u0130": "i", "\u0131": "i"}

# Patterns that cannot go inside the run wrapper below: \A and \z would see the
# batch's ends, a flag group clearing m makes ^ and $ the batch's ends, and \C
# can match the "\n" between lines even with never_nl. These run one line at a
# time. The test is textual and errs towards the per-line path (an escaped
# backslash before A triggers it too), which is always right, only slower.
_NEEDS_PER_LINE = re.compile(r"\\[ACz]|\(\?[imsU]*-[imsU]*m")

# One match of this, against a batch of lines joined and ended by "\n", is a
# maximal run of consecutive lines that each contain a match of P: each
# iteration starts at a line start (^), finds P inside the line, and consumes
# the rest of the line and its "\n" (\C is the only construct that can, because
# the program is compiled with never_nl, which stops P and everything else from
# matching a newline). So whether an iteration succeeds depends on its line
# alone, the greedy + takes the run as far as it goes, and a dense pattern
# costs one RE2 call per run instead of one per line. P stays inside (?:...):
# it compiled alone, so its parentheses balance, flags set inside it end with
# the group, and an unterminated \Q swallows the tail and fails to compile
# (then the per-line path is used).
_RUN = r"(?m)(?:^[^\n]*?(?:{})[^\n]*\C)+"


class BadPattern(ValueError):
    """A recall pattern that cannot be used. The message is one user-facing
    sentence that says what to do; it never contains the pattern."""


class PatternTooSlow(BadPattern):
    """scan() ran past its deadline (only raised when one is given)."""


def _options(*, never_nl: bool) -> re2.Options:
    options = re2.Options()
    # RE2 logs parse errors to stderr with the pattern in them; a recall query
    # is memory text and must never reach a log.
    options.log_errors = False
    # RE2's default (8 MiB for the program and the lazily built DFA), set
    # explicitly: less makes the DFA give up and fall back to the much slower
    # NFA sooner, more helps no slow case and raises the per-request memory
    # ceiling. It also caps program size ("pattern too large").
    options.max_mem = 8 << 20
    # Only the span of the whole match is used; without capture groups RE2
    # answers from its DFAs and never runs a submatch engine.
    options.never_capture = True
    options.case_sensitive = False
    options.never_nl = never_nl
    return options


_LINE_OPTIONS = _options(never_nl=False)
_RUN_OPTIONS = _options(never_nl=True)

# RE2's error text is "<description>: <pattern fragment>". Only these fixed
# descriptions are shown, reworded; the fragment never is (it is memory text).
_RE2_ERRORS = {
    "missing )": "a ( has no matching )",
    "unexpected )": "a ) has no matching (",
    "missing ]": "a [ has no matching ]",
    "trailing \\": "it ends with a lone backslash",
    "invalid escape sequence": (
        "it has an unknown escape (backreferences such as \\1 and \\Z are not supported; write \\z for the end)"
    ),
    "invalid character class": "it has an invalid character class",
    "invalid character class range": "it has an invalid class range or class name",
    "no argument for repetition operator": "a repetition has nothing to repeat",
    "invalid repetition size": "a repetition count is invalid or above 1000",
    "bad repetition operator": "it repeats a repetition, such as ** or +*",
    "invalid perl operator": ("it uses an unsupported (? group (lookahead, lookbehind and (?x) are not supported)"),
    "invalid UTF-8": "it is not valid UTF-8",
    "invalid named capture group": "it has an invalid group name",
}


def fold(text: str) -> str:
    """Apply FOLD_TABLE. Same result as ``text.translate(str.maketrans(FOLD_TABLE))``
    (every target is plain "i"), but str.replace is ~50x faster on non-ASCII text."""
    for src, dst in FOLD_TABLE.items():
        text = text.replace(src, dst)
    return text


def compile_pattern(q: str) -> Matcher:
    """Validate and compile a recall pattern; raise BadPattern if it is unusable."""
    if not q:
        raise BadPattern("The pattern is empty. Send at least one character to search for.")
    if q == DELIMITER:
        raise BadPattern(
            f"{DELIMITER} alone is reserved: it closes the here-documents of printed commands; "
            f"search for {DELIMITER[:-1]}[{DELIMITER[-1]}] instead."
        )
    try:
        size = len(q.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadPattern("The pattern is not valid Unicode text. Send it as UTF-8.") from None
    if size > MAX_PATTERN_BYTES:
        raise BadPattern(f"The pattern is {size} bytes; the limit is {MAX_PATTERN_BYTES}. Shorten it.")
    folded = fold(q)
    # (?m) changes nothing on a lone line; it is there so this program and the
    # run wrapper read ^ and $ alike.
    line_prog = _RE2(("(?m)" + folded).encode("utf-8"), _LINE_OPTIONS)
    if not line_prog.ok():
        raise BadPattern(_error_message(line_prog.error()))
    run_prog = find_prog = None
    if _NEEDS_PER_LINE.search(q) is None:
        run_prog = _RE2(_RUN.format(folded).encode("utf-8"), _RUN_OPTIONS)
        # The pattern alone, unable to match a newline: over joined lines its
        # leftmost match lies inside the first matching line, which RE2 finds
        # far faster than the run wrapper does when matches are sparse.
        find_prog = _RE2(("(?m)" + folded).encode("utf-8"), _RUN_OPTIONS)
        if not run_prog.ok() or not find_prog.ok():  # e.g. "pattern too large" with the wrapper added
            run_prog = find_prog = None
    return Matcher(line_prog, run_prog, find_prog)


def _error_message(error: bytes) -> str:
    description = error.decode("utf-8", "replace").split(": ", 1)[0]
    if description.startswith("pattern too large"):
        return (
            "The pattern is too large once compiled. Simplify it, for example with "
            "smaller repetition counts or fewer \\p classes."
        )
    reason = _RE2_ERRORS.get(description)
    if reason is None:
        return (
            "The pattern is not valid RE2 syntax. Fix it; $STASH_URL/reference#recall-syntax lists the accepted syntax."
        )
    return (
        f"The pattern is not valid RE2 syntax: {reason}. Fix it; $STASH_URL/reference#recall-syntax "
        "lists the accepted syntax."
    )


class Matcher:
    """A compiled recall pattern; build it with ``compile_pattern``."""

    __slots__ = ("_find", "_line", "_run")
    _line: _Match
    _run: _Match | None
    _find: _Match | None

    def __init__(self, line_prog: _Program, run_prog: _Program | None, find_prog: _Program | None = None) -> None:
        self._line = line_prog.Match
        self._run = None if run_prog is None else run_prog.Match
        self._find = None if find_prog is None else find_prog.Match

    def search(self, line: str) -> bool:
        """Does the pattern match this one rendered line?"""
        data = fold(line).encode("utf-8")
        return bool(self._line(_UNANCHORED, data, 0, len(data))[0][0] >= 0)

    def scan(
        self,
        lines: Iterable[str],
        part_bytes: int,
        *,
        deadline: float | None = None,
    ) -> tuple[list[str], int]:
        """One pass over ``lines`` (rendered lines, oldest first, no newlines).

        Returns ``(kept, total)``. ``total`` counts the matching lines. ``kept``
        holds the newest matching lines whose costs (UTF-8 bytes + 1 each) fit
        in ``part_bytes``, oldest first: OptMem's rule (append each match; while
        the kept cost exceeds ``part_bytes`` drop the oldest kept), so a single
        match that costs more than ``part_bytes`` leaves nothing kept.

        ``deadline`` is a ``time.monotonic()`` instant; once past it, scan
        raises PatternTooSlow (checked between RE2 calls, each of which covers
        at most one batch of lines). RE2 is linear, but a pattern that defeats
        its DFA (e.g. ``e.{200}``) runs on its NFA at ~75 s per million lines.
        """
        if part_bytes < 0:
            raise ValueError("part_bytes must be >= 0")
        kept: deque[tuple[str, int]] = deque()
        kept_bytes = 0
        total = 0
        it = iter(lines)
        while batch := list(islice(it, _BATCH_LINES)):
            runs = self._batch_runs(batch, deadline)
            # Only this batch's newest hits that fit can be kept, so costs are
            # computed newest first and only until the budget is spent; if it
            # is spent inside the batch, nothing older survives either.
            tail: list[tuple[str, int]] = []
            tail_bytes = 0
            spent = False
            for first, count in reversed(runs):
                total += count
                if spent:
                    continue
                for k in range(first + count - 1, first - 1, -1):
                    line = batch[k]
                    cost = len(line.encode("utf-8")) + 1
                    if tail_bytes + cost > part_bytes:
                        spent = True
                        break
                    tail.append((line, cost))
                    tail_bytes += cost
            if spent:
                kept.clear()
                kept_bytes = 0
            kept.extend(reversed(tail))
            kept_bytes += tail_bytes
            while kept_bytes > part_bytes:
                kept_bytes -= kept.popleft()[1]
        return [line for line, _ in kept], total

    def scan_joined(
        self, data: bytes, room: int, *, deadline: float | None = None, first_id: int | None = None
    ) -> tuple[list[str], int, bool]:
        """Match the lines of ``data`` (UTF-8 rendered lines, each ended by
        ``\n``, not folded) for a caller that walks the log newest first.

        Returns ``(kept, total, whole)``: ``total`` counts the matching lines;
        ``kept`` holds, oldest first, the newest of them whose costs (UTF-8
        bytes + 1 each) fit in ``room``, stopping at the first that does not
        fit (so older parts of the log may add nothing once ``whole`` is
        False); ``whole`` says whether every match was kept. ``deadline`` as
        for :meth:`scan`: each RE2 call covers at most ~160 KB of lines.
        ``first_id``: the lines are rendered memories ``#first_id ...``,
        ``#first_id+1 ...``, so a match's line is read from its ``#i`` instead
        of counting the newlines before it."""
        folded = data
        if data.find(_FOLD_LEAD) >= 0 and (_FOLDED_BYTES[0] in data or _FOLDED_BYTES[1] in data):
            folded = fold(data.decode("utf-8")).encode("utf-8")
        if self._run is None or self._find is None:
            runs = self._per_line_runs(folded, deadline)
        else:
            runs = self._segment_runs(folded, deadline, first_id)
        if deadline is not None:
            _check(deadline)
        total = sum(count for _, count in runs)
        kept: list[str] = []
        used = 0
        lines: list[bytes] | None = None
        if room <= 0 and runs:  # every line costs at least 1
            return [], total, False
        for first, count in reversed(runs):
            if lines is None:
                lines = data.split(b"\n")
            for k in range(first + count - 1, first - 1, -1):
                cost = len(lines[k]) + 1
                if used + cost > room:
                    kept.reverse()
                    return kept, total, False
                kept.append(lines[k].decode("utf-8"))
                used += cost
        kept.reverse()
        return kept, total, True

    def _segment_runs(self, data: bytes, deadline: float | None, first_id: int | None = None) -> list[tuple[int, int]]:
        """The matching lines of a long buffer of joined lines, as runs, at
        most one segment of whole lines (about ``_SEGMENT_BYTES``) per RE2
        call: the bare pattern finds the next matching line, then the run
        wrapper, anchored at that line's start, takes the whole run of
        matching lines that begins there (see ``_RUN``)."""
        find, run = self._find, self._run
        assert find is not None and run is not None, "a joined scan needs the find and run programs"
        count = data.count
        n = len(data)
        runs = []
        pos = 0  # always the start of line k
        k = 0
        while pos < n:
            end = data.find(b"\n", pos + _SEGMENT_BYTES)
            end = n if end < 0 else end + 1
            while pos < end:
                if deadline is not None:
                    _check(deadline)
                s = find(_UNANCHORED, data, pos, end)[0][0]
                if s < 0:
                    break
                nl = data.rfind(b"\n", pos, s)
                start = pos if nl < 0 else nl + 1
                rs, e = run(_ANCHOR_START, data, start, end)[0]
                if rs != start or e <= rs or data[e - 1] != 0x0A:
                    # Cannot happen by construction (the line matches, so the
                    # run starting at it does); never guess.
                    return self._per_line_runs(data, deadline)
                if first_id is None:
                    k += count(b"\n", pos, start)
                else:
                    k = int(data[start + 1 : data.index(b" ", start)]) - first_id
                lines = count(b"\n", start, e)
                runs.append((k, lines))
                k += lines
                pos = e
            if first_id is None:
                k += count(b"\n", pos, end)
            pos = end
        return runs

    def _batch_runs(self, batch: list[str], deadline: float | None) -> list[tuple[int, int]]:
        """The matching lines of ``batch`` as (first index, count) runs, in order."""
        data = fold("\n".join(batch)).encode("utf-8") + b"\n"
        if data.count(b"\n") != len(batch):
            # A line with a newline in it (outside the contract) would shift
            # every later line; match each original line by itself instead.
            runs = [(k, 1) for k, line in enumerate(batch) if self.search(line)]
        elif self._run is None:
            runs = self._per_line_runs(data, deadline)
        else:
            runs = self._joined_runs(data, deadline)
        if deadline is not None:
            _check(deadline)
        return runs

    def _per_line_runs(self, data: bytes, deadline: float | None) -> list[tuple[int, int]]:
        match = self._line
        runs = []
        for k, line in enumerate(data[:-1].split(b"\n")):
            if match(_UNANCHORED, line, 0, len(line))[0][0] >= 0:
                runs.append((k, 1))
            if deadline is not None and k % _DEADLINE_EVERY == 0:
                _check(deadline)
        return runs

    def _joined_runs(self, data: bytes, deadline: float | None) -> list[tuple[int, int]]:
        match = self._run
        assert match is not None, "a joined scan needs the run program"
        count = data.count
        n = len(data)
        runs = []
        pos = 0  # always the start of line k
        k = 0
        while pos < n:
            if deadline is not None:
                _check(deadline)
            s, e = match(_UNANCHORED, data, pos, n)[0]
            if s < 0:
                break
            if e <= s or data[e - 1] != 0x0A:
                # Cannot happen by construction (see _RUN); never guess.
                return self._per_line_runs(data, deadline)
            k += count(b"\n", pos, s)
            lines = count(b"\n", s, e)
            runs.append((k, lines))
            k += lines
            pos = e
        return runs


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise PatternTooSlow(
            "The pattern took too long to run over this memory. Make it simpler, "
            "for example without long counted repetitions such as .{200}."
        )
