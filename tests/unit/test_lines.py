"""One-line texts, output parts and size changes (stash.core.lines, stash.core.sizes).

check_line follows docs/DESIGN.md, "Memory model" (one line, 1 to ENTRY_CHARS *bytes*, no line break
or other control character); paginate is checked against an oracle written
from "Wake" (its parts); validate_changes against the table of "Sizes".
"""

from __future__ import annotations

import itertools
import random

import pytest

from stash.core import lines, sizes
from stash.core.errors import Invalid

# ----------------------------------------------------------------- check_line


def refused(text: object, max_bytes: int = 280) -> str:
    with pytest.raises(Invalid) as info:
        lines.check_line(text, max_bytes)
    err = info.value
    assert err.status == 422
    assert err.message.strip()
    return err.code


def test_a_plain_line_is_kept():
    assert lines.check_line("shipped the parser", 280) == "shipped the parser"


@pytest.mark.parametrize(("given", "kept"), [("  x  ", "x"), (" a b ", "a b"), ("a  b", "a  b"), ("   lead", "lead")])
def test_surrounding_spaces_are_stripped_inner_ones_kept(given, kept):
    assert lines.check_line(given, 280) == kept


def test_the_byte_limit_applies_after_stripping():
    assert lines.check_line("   abc   ", 3) == "abc"


@pytest.mark.parametrize("text", ["", " ", "     ", "\u3000", " \u00a0 "])
def test_empty_or_blank_is_refused(text):
    assert refused(text) == "text.empty"


@pytest.mark.parametrize(
    "text",
    [
        "a\nb",
        "a\rb",
        "a\r\nb",
        "line\n",
        "\nline",
        "a\u2028b",
        "a\u2029b",
        "\n",
        "\r",
        "\u2028",
        "\u2029",
        "trailing\u2029",
    ],
)
def test_line_breaks_are_refused_as_multiline(text):
    assert refused(text) == "text.multiline"


@pytest.mark.parametrize("text", ["a\x00b", "\x00", "a\x1b[31mred", "\x1b", "a\tb", "\t", "tab\t", "del\x7f"])
def test_control_characters_are_refused(text):
    assert refused(text) == "text.control"


@pytest.mark.parametrize("ch", ["\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"])
def test_other_line_breaking_controls_are_refused(ch):
    # Python's own splitlines() breaks on these; either refusal code is honest.
    assert len(("a" + ch + "b").splitlines()) == 2
    assert refused("a" + ch + "b") in {"text.multiline", "text.control"}


def test_every_c0_and_c1_control_is_refused_anywhere():
    for cp in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0)):
        ch = chr(cp)
        for text in (ch, "x" + ch, ch + "x", "x" + ch + "y"):
            assert refused(text) in {"text.multiline", "text.control"}, hex(cp)


# The Trojan Source class (CVE-2021-42574): text that reads on screen otherwise than it is stored.
BIDI = [
    "\u202e",
    "\u202d",
    "\u202a",
    "\u202b",
    "\u202c",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
    "\u200e",
    "\u200f",
    "\u061c",
]
INVISIBLE = [
    "\u200b",
    "\ufeff",
    "\u2060",
    "\u00ad",
    "\u2061",
    "\u2064",
    "\u180e",
    "\U000e0041",
    "\U000e0001",
    "\U000e007f",
    "\u206a",
    "\ufff9",
]


@pytest.mark.parametrize("ch", BIDI)
def test_bidirectional_controls_are_refused_anywhere(ch):
    for text in (ch, "ok" + ch, ch + "ok", "access = 'user' " + ch + " # admin"):
        assert refused(text) == "text.bidi", hex(ord(ch))


@pytest.mark.parametrize("ch", INVISIBLE)
def test_invisible_format_characters_are_refused_anywhere(ch):
    for text in (ch, "pay" + ch + "pal", ch + "x", "x" + ch):
        assert refused(text) == "text.invisible", hex(ord(ch))


def test_every_format_character_but_the_joiners_is_refused():
    import sys
    import unicodedata

    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if unicodedata.category(ch) == "Cf" and ch not in "\u200c\u200d":
            assert refused("a" + ch + "b") in {"text.bidi", "text.invisible"}, hex(cp)


@pytest.mark.parametrize("text", ["👨\u200d👩\u200d👧 family", "می\u200cخواهم", "क्\u200dष", "café ✓ 日本語 😀️"])
def test_joiners_and_visible_unicode_are_kept(text):
    assert lines.check_line(text, 280) == text


@pytest.mark.parametrize("value", [None, 5, 1.5, b"bytes", ["a"], {"text": "a"}])
def test_non_strings_are_refused(value):
    refused(value)


@pytest.mark.parametrize(
    ("unit", "nbytes"),
    [("a", 1), ("\u00e9", 2), ("\u20ac", 3), ("\U0001f600", 4), ("\u4e2d", 3)],
)
def test_length_is_counted_in_utf8_bytes(unit, nbytes):
    assert len(unit.encode()) == nbytes
    fits = 280 // nbytes
    assert lines.check_line(unit * fits, 280) == unit * fits
    assert refused(unit * (fits + 1)) == "text.too_long"


def test_exactly_at_the_limit_is_accepted_one_byte_over_refused():
    for limit in (1, 2, 7, 100, 280):
        assert lines.check_line("x" * limit, limit) == "x" * limit
        assert refused("x" * (limit + 1), limit) == "text.too_long"
    # Four emoji are 16 bytes: 16 passes, 15 does not.
    assert lines.check_line("\U0001f600" * 4, 16)
    assert refused("\U0001f600" * 4, 15) == "text.too_long"


def test_the_message_does_not_echo_the_text():
    # Messages reach clients and logs; memory text must not.
    secret = "the combination is 1234 " * 20
    with pytest.raises(Invalid) as info:
        lines.check_line(secret, 280)
    assert "combination" not in info.value.message


# ----------------------------------------------------------------- rendering


def test_rendered_lines_have_the_spec_shape():
    assert lines.memory_line(147, "2024-05-01", "hello") == "#147 2024-05-01 hello"
    assert lines.summary_line(16, 32, "a block") == "#16-31 a block"
    assert lines.line_bytes("#0 2024-01-01 \u00e9") == len(b"#0 2024-01-01 ") + 2 + 1


# ----------------------------------------------------------------- paginate


def oracle_parts(items: list[str], max_lines: int, max_bytes: int) -> list[list[str]]:
    """docs/DESIGN.md, "Wake": fill each part greedily in order; a line costs its UTF-8
    bytes plus one. Each part takes the longest run that stays within both
    limits — or, when even one line is too large, that line alone."""
    cost = [len(s.encode("utf-8")) + 1 for s in items]
    parts = []
    start = 0
    while start < len(items):
        take = 0
        total = 0
        while start + take < len(items) and take < max_lines and total + cost[start + take] <= max_bytes:
            total += cost[start + take]
            take += 1
        take = max(take, 1)
        parts.append(items[start : start + take])
        start += take
    return parts


def random_line(rng: random.Random) -> str:
    alphabet = "abc xyz\u00e9\u20ac\U0001f600"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))


@pytest.mark.slow
def test_paginate_matches_the_oracle_on_random_inputs():
    rng = random.Random(2024)
    for _ in range(3000):
        items = [random_line(rng) for _ in range(rng.randrange(0, 60))]
        max_lines = rng.randrange(1, 12)
        max_bytes = rng.randrange(1, 300)
        got = lines.paginate(items, max_lines, max_bytes)
        assert got == oracle_parts(items, max_lines, max_bytes), (items, max_lines, max_bytes)


def test_paginate_properties():
    rng = random.Random(5)
    for _ in range(500):
        items = [random_line(rng) for _ in range(rng.randrange(1, 80))]
        max_lines, max_bytes = rng.randrange(1, 20), rng.randrange(20, 400)
        parts = lines.paginate(items, max_lines, max_bytes)
        assert [x for p in parts for x in p] == items  # nothing lost, reordered or repeated
        for p in parts:
            assert 1 <= len(p) <= max_lines
            size = sum(len(x.encode()) + 1 for x in p)
            assert size <= max_bytes or len(p) == 1
        # Greedy: no part could have taken the next part's first line.
        for a, b in itertools.pairwise(parts):
            grown = a + [b[0]]
            assert len(grown) > max_lines or sum(len(x.encode()) + 1 for x in grown) > max_bytes


def test_newline_counts_toward_the_byte_limit():
    # Two 4-byte lines cost 10 bytes with their newlines: 9 does not hold them.
    assert lines.paginate(["abcd", "efgh"], 10, 10) == [["abcd", "efgh"]]
    assert lines.paginate(["abcd", "efgh"], 10, 9) == [["abcd"], ["efgh"]]


def test_multibyte_lines_are_measured_in_bytes():
    e = "\U0001f600" * 2  # 8 bytes + newline = 9
    assert lines.paginate([e, e], 10, 18) == [[e, e]]
    assert lines.paginate([e, e], 10, 17) == [[e], [e]]


def test_an_oversize_line_gets_a_part_of_its_own():
    big = "x" * 50
    assert lines.paginate(["a", big, "b"], 10, 20) == [["a"], [big], ["b"]]
    assert lines.paginate([big, big], 10, 20) == [[big], [big]]


def test_line_limit_cuts_parts():
    items = [str(i) for i in range(7)]
    assert lines.paginate(items, 3, 10_000) == [["0", "1", "2"], ["3", "4", "5"], ["6"]]


def test_no_lines_no_parts():
    assert lines.paginate([], 5, 100) == []


# ----------------------------------------------------------------- sizes


SPEC_DEFAULTS = {"WAKE_LINES": 96, "WAKE_CHARS": 1_000_000, "ENTRY_CHARS": 280, "PART_CHARS": 20_000, "PART_LINES": 500}


def test_defaults_are_the_spec_table():
    assert sizes.DEFAULTS == SPEC_DEFAULTS
    assert sizes.effective({}) == SPEC_DEFAULTS
    assert sizes.effective({"WAKE_LINES": 7}) == {**SPEC_DEFAULTS, "WAKE_LINES": 7}


def bad_change(changes: object) -> str:
    with pytest.raises(Invalid) as info:
        sizes.validate_changes(changes)
    assert info.value.status == 422
    return info.value.code


@pytest.mark.parametrize("name", ["WAKE_LINE", "wake_lines", "", "SECRET", "ENTRY_CHARS "])
def test_unknown_names_are_refused(name):
    assert bad_change({name: 10}) == "config.unknown_name"


def test_unknown_name_refuses_the_whole_change():
    assert bad_change({"WAKE_LINES": 10, "NOPE": 1}) == "config.unknown_name"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENTRY_CHARS", 281),
        ("ENTRY_CHARS", 0),
        ("WAKE_LINES", 0),
        ("WAKE_LINES", -1),
        ("PART_CHARS", 0),
        ("PART_LINES", -5),
        ("WAKE_CHARS", 0),
    ],
)
def test_out_of_range_values_are_refused(name, value):
    # docs/DESIGN.md, "Sizes": ENTRY_CHARS is at most 280; budgets below one line or byte read nothing.
    assert bad_change({name: value}) == "config.out_of_range"


@pytest.mark.parametrize("name", list(SPEC_DEFAULTS))
def test_declared_bounds_are_inclusive(name):
    s = sizes.SIZES[name]
    assert s.low <= SPEC_DEFAULTS[name] <= s.high
    assert sizes.validate_changes({name: s.low}) == {name: s.low}
    assert sizes.validate_changes({name: s.high}) == {name: s.high}
    assert bad_change({name: s.low - 1}) == "config.out_of_range"
    assert bad_change({name: s.high + 1}) == "config.out_of_range"


@pytest.mark.parametrize("value", [True, False, 5.0, "64", [64], {"v": 64}, 1e3])
def test_non_integers_and_booleans_are_refused(value):
    assert bad_change({"WAKE_LINES": value}) == "config.out_of_range"


def test_null_restores_a_default():
    assert sizes.validate_changes({"WAKE_LINES": None}) == {"WAKE_LINES": None}
    assert sizes.validate_changes({"WAKE_LINES": None, "PART_LINES": 50}) == {"WAKE_LINES": None, "PART_LINES": 50}


@pytest.mark.parametrize("changes", [{}, None, [], "WAKE_LINES", [["WAKE_LINES", 5]], 5])
def test_empty_or_non_object_changes_are_refused(changes):
    bad_change(changes)


def test_refusals_give_advice_that_fits_a_memory_or_a_summary() -> None:
    """A memory can be split into several notes; a summary cannot (issue 12 item 7)."""
    from stash.core.errors import Invalid

    check_line = lines.check_line
    with pytest.raises(Invalid) as memory:
        check_line("a\nb", 280)
    assert "note them separately" in memory.value.message
    with pytest.raises(Invalid) as summary:
        check_line("a\nb", 280, "summary")
    assert "separately" not in summary.value.message and "one line" in summary.value.message
    with pytest.raises(Invalid) as long_memory:
        check_line("x" * 281, 280)
    assert long_memory.value.message.endswith("Shorten it, or split it into separate notes.")
    with pytest.raises(Invalid) as long_summary:
        check_line("x" * 281, 280, "summary")
    assert long_summary.value.message.endswith("Compress it further.") and long_summary.value.code == "text.too_long"
