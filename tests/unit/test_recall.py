"""Recall matching: RE2 with Python re.IGNORECASE case rules, scanned in batches.

The reference throughout is Python's own ``re.search(p, line, re.IGNORECASE)``
on each original line. Where RE2's documented syntax differs from Python's
(ASCII ``\\b``/``\\s``/``\\d``, ``\\z``, ``\\C``), the oracle pattern spells out
the documented meaning in Python syntax instead.
"""

from __future__ import annotations

import functools
import random
import re
import sys
import time
import unicodedata
from collections import deque

import pytest

from stash.core import recall
from stash.core.recall import (
    MAX_PATTERN_BYTES,
    BadPattern,
    PatternTooSlow,
    compile_pattern,
)

# Word characters for RE2's \b: ASCII ones, plus İ and ı because they are read
# as "i". Case-sensitive so Python does not add the Kelvin sign or long s.
_W = "(?-i:[0-9A-Za-z_\u0130\u0131])"
_B = f"(?:(?<={_W})(?!{_W})|(?<!{_W})(?={_W}))"
_S = "[\t\n\f\r ]"

# (RE2 pattern, the same meaning in Python re syntax, or None if identical).
ORACLE_PATTERNS: list[tuple[str, str | None]] = [
    # literals, case folding
    ("yilmaz", None),
    ("YILMAZ", None),
    ("istanbul", None),
    ("İSTANBUL", None),
    ("ıi", None),
    ("DİYARBAKIR", None),
    ("straße", None),
    ("STRASSE", None),
    ("ẞ", None),
    ("ΣΟΦΟΣ", None),
    ("σ", None),
    ("ς", None),
    ("kelvin", None),
    ("\u212a", None),
    ("ǅ", None),
    ("µ", None),
    ("ſ", None),
    ("ϐ", None),
    ("日本", None),
    ("é+", None),
    ("ç|ğ|ş", None),
    # classes
    ("[a-z]+ [0-9]{4}", None),
    ("[^a-z0-9 #-]", None),
    ("[İı]", None),
    ("[α-ω]{3}", None),
    ("[^\\x00-\\x7f]", None),
    ("[ä-ö]", None),
    ("\\w+é", "[0-9A-Za-z_]+é"),
    ("\\d{4}-\\d\\d", "[0-9]{4}-[0-9][0-9]"),
    # anchors
    ("^#1", None),
    ("text$", None),
    ("^", None),
    ("$", None),
    ("^$", None),
    ("^#\\d+ \\d{4}-\\d\\d-\\d\\d ", "^#[0-9]+ [0-9]{4}-[0-9][0-9]-[0-9][0-9] "),
    ("\\A#2", None),
    ("end\\z", "end\\Z"),
    ("(?-m)^#3", "^#3"),
    ("(?i-m:a$)", "a$"),
    # alternation, repetition
    ("yilmaz|istanbul|kelvin", None),
    ("(a|b)c", None),
    ("a{2,}", None),
    ("(ab)+", None),
    ("x*", None),
    ("(?:)", None),
    ("e.?e", None),
    ("o.*o", None),
    ("a+?b", None),
    ("(?-i:ab)c", None),
    # \b and \s
    ("\\bist", f"{_B}ist"),
    ("an\\b", f"an{_B}"),
    ("\\bi\\b", f"{_B}i{_B}"),
    ("\\s+", f"{_S}+"),
    ("a\\sb", f"a{_S}b"),
    ("\\S+\\s\\S+", f"[^\t\n\f\r ]+{_S}[^\t\n\f\r ]+"),
    # patterns whose joined-text matches could run over a line end
    ("[^z]+", None),
    ("a.*b", None),
    ("(?s)a.*b", None),
    ("\\D{3,}", "[^0-9]{3,}"),
    ("[^x]", None),
    ("\\W\\W", "[^0-9A-Za-z_]{2}"),
    ("z\\s*$", f"z{_S}*$"),
    ("a\\n?b", None),
    ("\\n", None),
    ("t[\\s\\S]*#", None),
    # \C is one byte: only ASCII (or İ/ı, read as "i") fits in one
    ("x\\Cy", "x(?-i:[\\x00-\\x7f\\u0130\\u0131])y"),
]

_WORDS = [
    "Yılmaz",
    "YILMAZ",
    "yilmaz",
    "İstanbul",
    "istanbul",
    "ISTANBUL",
    "ıi",
    "Iİ",
    "Diyarbakır",
    "DİYARBAKIR",
    "straße",
    "STRASSE",
    "Straẞe",
    "ΣΟΦΟΣ",
    "σοφος",
    "σοφός",
    "ς",
    "\u212aelvin",
    "kelvin",
    "ǅ",
    "Ǆ",
    "ǆ",
    "µ",
    "μ",
    "Μ",
    "ſ",
    "s",
    "ϐ",
    "β",
    "日本語",
    "café",
    "CAFÉ",
    "ç",
    "Ğ",
    "ş",
    "text",
    "end",
    "an",
    "ab",
    "abab",
    "aab",
    "abC",
    "ABc",
    "b",
    "c",
    "x",
    "xy",
    "x\u212ay",
    "xİy",
    "xéy",
    "z",
    "z ",
    "a\u00a0b",
    "a b",
    "a\tb",
    "2024-05-06",
    "#1",
    "#3",
    "o",
    "oo",
    "eke",
    "ee",
    "ä",
    "Ö",
    "ü",
    "α",
    "ΩΜΕΓΑ",
    "-",
    "…",
    "🙂",
    "€",
    "_",
    "é",
    "i",
    "I",
    "ı",
    "İ",
]


def _lines() -> list[str]:
    rng = random.Random(20240506)
    lines = [
        "",
        "a",
        " ",
        "#1",
        "#3 x",
        "x",
        "z",
        "z ",
        "text",
        "end",
        "İ",
        "ı",
        "#0 2024-01-01 Yılmaz called from İstanbul",
        "#1 2024-01-02 the Kelvin sign \u212a and ſ and µ",
        "#2 2024-01-03 ΣΟΦΟΣ σοφός straße STRASSE",
        "#3 2024-01-04 text",
        "#4 2024-01-05 ends with a space ",
        # neighbours that only match across the line break ("x\ny", "a\nb")
        "#5 2024-01-06 ends in x",
        "y starts this line",
        "#6 2024-01-06 ends in a",
        "b starts this line",
    ]
    for i in range(5, 1400):
        words = rng.choices(_WORDS, k=rng.randint(0, 6))
        if i % 9 == 0:
            lines.append(" ".join(words))  # no "#i DATE" prefix
        else:
            lines.append(f"#{i} 2024-05-{i % 28 + 1:02d} " + " ".join(words))
    return lines


LINES = _lines()


def _kept_by_optmem_rule(matches: list[str], part_bytes: int) -> list[str]:
    kept: deque[str] = deque()
    size = 0
    for line in matches:
        kept.append(line)
        size += len(line.encode("utf-8")) + 1
        while size > part_bytes:
            size -= len(kept.popleft().encode("utf-8")) + 1
    return list(kept)


@pytest.mark.parametrize("batch_lines", [512, 7, 1])
@pytest.mark.parametrize(("pattern", "python_pattern"), ORACLE_PATTERNS)
def test_matches_python_ignorecase_line_by_line(
    pattern: str, python_pattern: str | None, batch_lines: int, monkeypatch
) -> None:
    monkeypatch.setattr(recall, "_BATCH_LINES", batch_lines)
    oracle = re.compile(python_pattern or pattern, re.IGNORECASE)
    expected = [line for line in LINES if oracle.search(line)]
    matcher = compile_pattern(pattern)

    if batch_lines == 512:
        assert [line for line in LINES if matcher.search(line)] == expected

    kept, total = matcher.scan(LINES, 10**9)
    assert kept == expected
    assert total == len(expected)

    # a generator (single pass) and a tight byte budget
    kept, total = matcher.scan(iter(LINES), 700)
    assert kept == _kept_by_optmem_rule(expected, 700)
    assert total == len(expected)


def test_oracle_patterns_exercise_both_outcomes() -> None:
    # Guards the oracle itself: a pattern that matches nothing or everything
    # proves less. Only a few are allowed to be trivially total or empty.
    trivial = []
    for pattern, python_pattern in ORACLE_PATTERNS:
        oracle = re.compile(python_pattern or pattern, re.IGNORECASE)
        hits = sum(1 for line in LINES if oracle.search(line))
        if hits in (0, len(LINES)):
            trivial.append(pattern)
    assert sorted(trivial) == sorted(["^", "$", "x*", "(?:)", "\\n"])


def test_spec_examples() -> None:
    assert compile_pattern("YILMAZ").search("#5 2024-01-01 met Yılmaz today")
    assert compile_pattern("istanbul").search("#6 2024-01-01 flew to İstanbul")
    assert compile_pattern("İSTANBUL").search("#6 2024-01-01 flew to istanbul")
    assert compile_pattern("yılmaz").search("#6 2024-01-01 YILMAZ")
    assert not compile_pattern("yilmaz").search("#7 2024-01-01 yilmax")
    lines = ["#0 2024-01-01 Yılmaz", "#1 2024-01-01 nobody", "#2 2024-01-02 İstanbul"]
    assert compile_pattern("yilmaz|istanbul").scan(lines, 20000) == (
        ["#0 2024-01-01 Yılmaz", "#2 2024-01-02 İstanbul"],
        2,
    )


def test_turkish_i_is_one_letter_even_where_case_matters() -> None:
    # Documented exception to Python: inside (?-i:...) Python tells ı from i,
    # but here İ and ı are read as "i" everywhere.
    matcher = compile_pattern("(?-i:Yılmaz)")
    assert matcher.search("Yılmaz")
    assert matcher.search("Yilmaz")
    assert not matcher.search("YILMAZ")
    assert not compile_pattern("(?-i:I)").search("ı")


def test_fold_matches_its_translation_table() -> None:
    table = str.maketrans(recall.FOLD_TABLE)
    for text in ["", "İı", "xİyız", "abc", "ıİıİ🙂", "\u0130\u0131\u0307"]:
        assert recall.fold(text) == text.translate(table)


@functools.cache
def _case_classes() -> tuple[dict[str, set[str]], list[str]]:
    """Candidate IGNORECASE classes: unions over the case mappings Python's re
    builds on (lower, upper, title, casefold, and sharing a multi-character
    uppercase, which is how re pairs e.g. U+0390 with U+1FD3)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    cased = []
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        upper = c.upper()
        related = {c.lower()[:1], upper, c.title(), c.casefold()}
        related = {r for r in related if len(r) == 1 and r != c}
        if len(upper) > 1:
            related.add(upper)  # a key, not a character: groups same-uppercase
        if related or unicodedata.category(c) in ("Lu", "Ll", "Lt"):
            cased.append(c)
            for r in related:
                union(c, r)
    classes: dict[str, set[str]] = {}
    for c in cased:  # multi-character keys are left out of every class
        classes.setdefault(find(c), set()).add(c)
    return {c: classes[find(c)] for c in cased}, cased


@pytest.mark.slow
def test_single_character_sweep_agrees_with_python() -> None:
    """For every cased code point c: the matcher for c matches exactly what
    Python's re.IGNORECASE matches. Each candidate in c's case class is checked
    one by one, and one long line of every other BMP character (plus every cased
    astral one) must not match at all, which catches any extra fold RE2 makes."""
    classes, cased = _case_classes()
    universe = [chr(cp) for cp in range(0x10000) if not (0xD800 <= cp < 0xE000) and cp != 10] + [
        c for c in cased if ord(c) > 0xFFFF
    ]
    index = {ch: i for i, ch in enumerate(universe)}
    everything = "".join(universe)
    disagreements = []
    for c in cased:
        matcher = compile_pattern(re.escape(c))
        python = re.compile(re.escape(c), re.IGNORECASE)
        same = {d for d in classes[c] if python.search(d)}
        for d in classes[c]:
            if matcher.search(d) != bool(python.search(d)):
                disagreements.append((c, d))
        cut = sorted(index[d] for d in same)
        pieces, start = [], 0
        for i in cut:
            pieces.append(everything[start:i])
            start = i + 1
        pieces.append(everything[start:])
        if matcher.search("".join(pieces)):
            disagreements.append((c, "something outside Python's class"))
    assert disagreements == [], [(f"U+{ord(c):04X}", d if len(d) > 1 else f"U+{ord(d):04X}") for c, d in disagreements]


@pytest.mark.slow
def test_sweep_classes_are_what_python_matches() -> None:
    """Spot-check the sweep's class computation against Python directly, so the
    sweep cannot pass by leaving a Python match out of the class."""
    classes, cased = _case_classes()
    rng = random.Random(7)
    sample = rng.sample(cased, 300) + ["i", "I", "İ", "ı", "s", "ſ", "k", "σ", "β", "ι"]
    others = "".join(chr(cp) for cp in range(0x10000) if not (0xD800 <= cp < 0xE000) and cp != 10)
    for c in sample:
        python = re.compile(re.escape(c), re.IGNORECASE)
        assert set(python.findall(others)) <= classes[c]


def test_scan_keeps_newest_matches_that_fit_oldest_first() -> None:
    lines = [f"#{i} 2024-01-01 {'é' * (i % 5)}hit" for i in range(30)]
    lines[7] = "#7 2024-01-01 miss"
    matcher = compile_pattern("hit")
    matches = [line for line in lines if "hit" in line]
    costs = [len(line.encode("utf-8")) + 1 for line in matches]
    # budget for exactly the last three matches
    budget = sum(costs[-3:])
    kept, total = matcher.scan(lines, budget)
    assert kept == matches[-3:]
    assert total == 29
    # one byte less: only two fit
    kept, total = matcher.scan(lines, budget - 1)
    assert kept == matches[-2:]
    assert total == 29
    assert matcher.scan(lines, 0) == ([], 29)
    assert matcher.scan([], 100) == ([], 0)


def test_scan_drops_a_newest_match_bigger_than_the_budget() -> None:
    lines = ["#0 2024-01-01 hit", "#1 2024-01-01 hit " + "x" * 200]
    kept, total = compile_pattern("hit").scan(lines, 100)
    assert (kept, total) == ([], 2)


@pytest.mark.parametrize("batch_lines", [512, 5, 1])
def test_scan_budget_across_batches(batch_lines: int, monkeypatch) -> None:
    monkeypatch.setattr(recall, "_BATCH_LINES", batch_lines)
    rng = random.Random(3)
    lines = [
        f"#{i} 2024-02-02 " + ("hit " if rng.random() < 0.4 else "") + "ü" * rng.randint(0, 40) for i in range(600)
    ]
    matches = [line for line in lines if "hit" in line]
    matcher = compile_pattern("HIT")
    for budget in [0, 1, 20, 21, 22, 57, 300, 1000, 5000, 10**6]:
        assert matcher.scan(lines, budget) == (
            _kept_by_optmem_rule(matches, budget),
            len(matches),
        )


def test_dense_runs_and_gaps() -> None:
    # long runs of consecutive matches broken by single misses, at every offset
    lines = [f"#{i} 2024-01-01 " + ("miss" if i % 17 in (0, 5) else "hit") for i in range(3000)]
    kept, total = compile_pattern("hit").scan(lines, 10**9)
    assert kept == [line for line in lines if line.endswith("hit")]
    assert total == len(kept)


def test_negative_budget_is_rejected() -> None:
    with pytest.raises(ValueError):
        compile_pattern("a").scan(["a"], -1)


def test_line_with_a_newline_is_not_misattributed() -> None:
    # Outside the contract (lines have no newline), but it must not shift which
    # line is reported.
    lines = ["#0 2024-01-01 one", "#1 2024-01-01 two\nthree", "#2 2024-01-01 four"]
    matcher = compile_pattern("four|three")
    assert matcher.scan(lines, 10**6) == ([lines[1], lines[2]], 2)


@pytest.mark.parametrize(
    "pattern",
    [
        "zqxj" + "a" * (MAX_PATTERN_BYTES - 4 + 1),  # 513 ASCII bytes
        "zqxj" + "中" * 200,  # 204 characters, 604 bytes
        "zqxj" + "é" * 255,  # 259 characters, 514 bytes
        "zqxj(",
        "zqxj)",
        "zqxj[a",
        "zqxj{2,1}a",
        "zqxja{2,1}",
        "zqxj(a)\\1",
        "zqxj(?=a)",
        "zqxj(?!a)",
        "zqxj(?<=a)b",
        "zqxj(?<!a)b",
        "zqxj\\Z",
        "zqxja**",
        "zqxja{1001}",
        "zqxj\\p{Nope}",
        "zqxj\\",
        "zqxj(?x)a",
        "zqxj(?>a)",
        "zqxja++",
        "zqxj\\pL{1000}",
        "zqxj\ud800",
    ],
)
def test_bad_patterns_are_rejected_without_echoing_them(pattern: str) -> None:
    with pytest.raises(BadPattern) as info:
        compile_pattern(pattern)
    message = str(info.value)
    assert "zqxj" not in message
    assert message.startswith("The pattern ")
    assert message.endswith(".")
    assert info.value.__cause__ is None


def test_empty_pattern_is_rejected() -> None:
    with pytest.raises(BadPattern, match="empty"):
        compile_pattern("")


def test_length_cap_counts_bytes() -> None:
    compile_pattern("a" * MAX_PATTERN_BYTES)
    compile_pattern("é" * (MAX_PATTERN_BYTES // 2))
    with pytest.raises(BadPattern, match="604 bytes; the limit is 512"):
        compile_pattern("zqxj" + "中" * 200)


def test_syntax_error_names_the_problem() -> None:
    with pytest.raises(BadPattern, match="no matching \\)"):
        compile_pattern("(abc")
    with pytest.raises(BadPattern, match="lookahead"):
        compile_pattern("a(?=b)")
    with pytest.raises(BadPattern, match="backreferences"):
        compile_pattern("(a)\\1")


@pytest.mark.parametrize(
    ("pattern", "line", "hits"),
    [
        ("(a+)+$", "a" * 40, 200_000),
        ("(a|a)*b", "a" * 40, 0),
        ("(x+x+)+y", "x" * 40, 0),
        ("(a*)*$", "a" * 40, 200_000),
    ],
)
def test_pathological_patterns_complete(pattern: str, line: str, hits: int) -> None:
    # Catastrophic for a backtracking engine; RE2 is linear. No timing assert:
    # a stall would show in pytest's own run time.
    lines = [line] * 200_000
    kept, total = compile_pattern(pattern).scan(lines, 20_000)
    assert total == hits
    assert len(kept) == (20_000 // 41 if hits else 0)


def test_deadline_raises_pattern_too_slow() -> None:
    matcher = compile_pattern("a")
    with pytest.raises(PatternTooSlow) as info:
        matcher.scan(["a"] * 10, 100, deadline=time.monotonic() - 1)
    assert isinstance(info.value, BadPattern)
    # the per-line path checks too
    with pytest.raises(PatternTooSlow):
        compile_pattern("\\Aa").scan(["a"] * 10, 100, deadline=time.monotonic() - 1)
    # a generous deadline changes nothing
    assert matcher.scan(["a", "b"], 100, deadline=time.monotonic() + 60) == (["a"], 1)
