"""What a note or summary line may be, and how lines are rendered."""

from __future__ import annotations

import re
import unicodedata

from .errors import Invalid

LINE_SEPARATORS = {"\u2028", "\u2029"}
# Characters that reorder what follows them on screen (Trojan Source, CVE-2021-42574): embeddings,
# overrides and isolates, and the marks that steer them.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Format characters (category Cf) a line may keep: the zero-width joiner and non-joiner, which shape
# emoji sequences and Persian, Indic and other scripts. Every other Cf is invisible and refused: zero-width
# space, word joiner, byte-order mark, soft hyphen, invisible operators, and the tag characters
# (U+E0000-E007F) that can carry hidden ASCII to a model reading the line.
VISIBLE_FORMAT = frozenset("\u200c\u200d")
# Closes the quoted here-documents of every printed command (service/instructions.py). No line a note,
# summary or recall accepts equals it, so no agent's line pasted into a command can close one early.
DELIMITER = "STASH_END"

# The placeholders the server prints in the commands it hands an agent (service/instructions.py renders
# them; the skill names them). A command run as printed, placeholder and all, would save it: a note or a
# summary that is exactly one of them is refused, and the agent told to put its own line in its place.
ONE_LINE = "<one line>"
YOUR_LINE = "<your line>"
SAME_REGEX = "<the same regex>"
REGEX = "<regex>"
WORDS = "<words>"
SAME_WORDS = "<the same words>"
BLOCK = "<lo-hi>"
PLACEHOLDERS = frozenset({ONE_LINE, YOUR_LINE, SAME_REGEX, REGEX, WORDS, SAME_WORDS, BLOCK, "<placeholder>"})
_SUMMARY_PLACEHOLDER = re.compile(r"<your line for \d+-\d+>")


def summary_placeholder(block: str) -> str:
    """The placeholder of one block's summary in a batch's command."""
    return f"<your line for {block}>"


def is_placeholder(text: str) -> bool:
    return text in PLACEHOLDERS or _SUMMARY_PLACEHOLDER.fullmatch(text) is not None


def check_line(text: object, max_bytes: int, what: str = "note") -> str:
    """One line of at most ``max_bytes`` UTF-8 bytes, surrounding spaces
    removed. Control characters and line separators are refused anywhere, even
    trailing: a stray break could forge a summary line or the awake marker in
    a rendered wake. So are bidirectional controls and invisible format
    characters: a line is read by people and by agents, and neither must see
    text that differs from what is stored."""
    if not isinstance(text, str):
        raise Invalid(f"The {what} must be a JSON string of one line.", code="text.type")
    for ch in text:
        category = unicodedata.category(ch)
        if ch in LINE_SEPARATORS or category == "Cc":
            if ch in "\r\n" or ch in LINE_SEPARATORS:
                # A note's lines can be noted one by one; a summary must stay one line of its block.
                advice = "merge them, or note them separately" if what == "note" else "merge them into one line"
                raise Invalid(f"The {what} spans several lines; a {what} is one line: {advice}.", code="text.multiline")
            raise Invalid(
                f"The {what} contains a control character (U+{ord(ch):04X}); remove it and send one plain line.",
                code="text.control",
            )
        if ch in BIDI_CONTROLS:
            raise Invalid(
                f"The {what} contains a bidirectional control (U+{ord(ch):04X}), which changes how the line "
                "reads on screen; remove it and send the text in reading order.",
                code="text.bidi",
            )
        if category == "Cf" and ch not in VISIBLE_FORMAT:
            raise Invalid(
                f"The {what} contains an invisible character (U+{ord(ch):04X}); remove it and send only visible text.",
                code="text.invisible",
            )
    text = text.strip()
    if not text:
        raise Invalid(
            f"The {what} is empty; send one line of text. (Sent from a printed here-document? A line "
            f"that is exactly {DELIMITER} ends it early: reword that line.)",
            code="text.empty",
        )
    if text == DELIMITER:
        raise Invalid(
            f"{DELIMITER} alone is reserved: it closes the here-documents of printed commands; "
            f"write the {what} with more words.",
            code="text.reserved",
        )
    n = len(text.encode())
    if n > max_bytes:
        raise Invalid(
            f"The {what} is {n} bytes; the limit is {max_bytes} (accented characters cost 2 bytes, emoji 4). "
            + ("Compress it further." if what == "summary" else "Shorten it, or split it into separate notes."),
            code="text.too_long",
        )
    return text


def check_written(text: object, max_bytes: int, what: str = "note") -> str:
    """:func:`check_line` for a line an agent writes (a note, a summary),
    which must not be a placeholder of a printed command left in place.
    Imported lines are data and are checked by :func:`check_line` alone."""
    line = check_line(text, max_bytes, what)
    if is_placeholder(line):
        raise Invalid(
            f"The {what} is {line}, the placeholder of the command it came from, not a line of yours; "
            f"nothing was written. Run the command again with your own line in place of {line}.",
            code="text.placeholder",
        )
    return line


def memory_line(i: int, date: str, text: str) -> str:
    return f"#{i} {date} {text}"


def summary_line(lo: int, hi: int, text: str) -> str:
    return f"#{lo}-{hi - 1} {text}"


def line_bytes(line: str) -> int:
    """What a line costs in output: its UTF-8 bytes plus its newline."""
    return len(line.encode()) + 1


def paginate(lines: list[str], part_lines: int, part_bytes: int) -> list[list[str]]:
    """Greedy parts of at most ``part_lines`` lines and ``part_bytes`` bytes
    (a single line larger than a part still gets a part of its own)."""
    parts: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for line in lines:
        n = line_bytes(line)
        if cur and (len(cur) >= part_lines or size + n > part_bytes):
            parts.append(cur)
            cur, size = [], 0
        cur.append(line)
        size += n
    if cur:
        parts.append(cur)
    return parts


def plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    if word.endswith("y"):
        word = word[:-1] + "ie"
    elif word.endswith(("s", "h", "x")):
        word += "e"
    return f"{n} {word}s"
