"""Writing a piece of the word index (docs/DESIGN.md, "Word search"): the
bytes of a piece built from its memories' texts (:func:`build`), and a
piece cut into its segments (:func:`split`). The format, and reading it,
are :mod:`stash.core.word_piece`'s."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Sequence

from . import stems
from .word_piece import (
    _HEAD,
    MAGIC,
    MAX_MEMORIES,
    OWN,
    Ints,
    PieceIndex,
    _char_end,
    _le,
    _units_of,
    bitmap_units,
    head,
    tally,
)
from .words import forms, stems_of, words


def _bitmap(ids: Sequence[int], units: int) -> array[int]:
    bits = bytearray(2 * units)
    for k in ids:
        bits[k >> 3] |= 1 << (k & 7)
    return _units_of(bytes(bits))


def build(texts: Sequence[str | None]) -> bytes:
    """The piece of memories ``texts`` (offset k holds memory k's text, or
    None for one that is erased)."""
    if len(texts) > MAX_MEMORIES:
        raise ValueError("a word piece holds at most 65,536 memories")
    postings: dict[str, list[int]] = {}
    plain: set[str] = set()  # words written as they fold (all of ASCII text's)
    written: dict[str, set[str]] = {}  # a word of other text: its forms, lowered
    lengths = array("H")
    for k, text in enumerate(texts):
        if text is None:
            lengths.append(0)
            continue
        if text.isascii():
            ws = words(text)
            plain.update(ws)
        else:
            pairs = forms(text)
            ws = [w for w, _ in pairs]
            for w, low in pairs:
                written.setdefault(w, set()).add(low)
        lengths.append(min(len(ws), 0xFFFF))
        for w in dict.fromkeys(ws):
            postings.setdefault(w, []).append(k)
    encoded = sorted((w.encode("utf-8"), w, ids) for w, ids in postings.items())
    starts = array("I", [0])
    flat = array("H")
    units = bitmap_units(len(texts))
    for _, _, ids in encoded:
        flat.extend(ids if len(ids) < units else _bitmap(ids, units))
        starts.append(len(flat))
    held = len(lengths) - lengths.count(0)
    flags, others = _stems([w for _, w, _ in encoded], plain, written)
    return _encode([key for key, _, _ in encoded], starts, flat, lengths, held, sum(lengths), len(texts), flags, others)


def _stems(
    ordered: Sequence[str], plain: set[str], written: dict[str, set[str]]
) -> tuple[bytes, list[tuple[bytes, list[int]]]]:
    """The flags of the words ``ordered`` (as the piece orders them) and the
    piece's other stems with the words that have them, sorted by key. Each
    distinct form is stemmed once (:func:`stash.core.words.stems_of`): a
    word of ASCII text alone is its only form."""
    if written:
        lows = list(dict.fromkeys(itertools.chain(plain, itertools.chain.from_iterable(written.values()))))
        of = dict(zip(lows, stems_of(lows)))
        per_word = [[of[low] for low in _forms_of(w, plain, written)] for w in ordered]
    else:
        per_word = [[pair] for pair in stems_of(ordered)]
    codes = list(stems.LANGUAGES)
    flags = bytearray(len(ordered))
    others: dict[bytes, list[int]] = {}
    for k, (w, pairs) in enumerate(zip(ordered, per_word)):
        for pair in pairs:
            for code, st in zip(codes, pair):
                if st == w:
                    flags[k] |= OWN[code]
                elif st:
                    mates = others.setdefault((code + st).encode("utf-8"), [])
                    if not mates or mates[-1] != k:
                        mates.append(k)
    return bytes(flags), sorted(others.items())


def _forms_of(w: str, plain: set[str], written: dict[str, set[str]]) -> Sequence[str]:
    """Word ``w``'s forms in a piece, lowered: itself where it is written as it folds."""
    got = written.get(w)
    if got is None:
        return (w,)
    return (*got, w) if w in plain else tuple(got)


def _joined(keys: Sequence[bytes]) -> tuple[bytes, array[int]]:
    joined = b"".join(b"\n" + w for w in keys)
    at = array("I")
    pos = 0
    for key in keys:
        at.append(pos)
        pos += len(key) + 1
    return joined, at


def _encode(
    keys: Sequence[bytes],
    starts: Ints,
    flat: Ints,
    lengths: Ints,
    held: int,
    total: int,
    memories: int,
    flags: bytes = b"",
    others: Sequence[tuple[bytes, Sequence[int]]] = (),
) -> bytes:
    joined, at = _joined(keys)
    stem_joined, stem_at = _joined([key for key, _ in others])
    stem_starts = array("I", [0])
    refs = array("I")
    for _, mates in others:
        refs.extend(mates)
        stem_starts.append(len(refs))
    flags = flags or bytes(len(keys))
    return (
        _HEAD.pack(
            MAGIC,
            stems.TAG,
            len(keys),
            len(joined),
            len(flat),
            held,
            total,
            memories,
            len(others),
            len(stem_joined),
            len(refs),
        )
        + joined
        + _le(at)
        + _le(starts)
        + _le(flat)
        + flags
        + stem_joined
        + _le(stem_at)
        + _le(stem_starts)
        + _le(refs)
        + _le(lengths)
    )


def split(data: bytes, bucket: Callable[[bytes], int], count: int) -> list[bytes]:
    """A piece cut into ``2 + count`` pieces: first one of no words that
    keeps every memory's length (and the piece's ``held`` and ``words``);
    then for ``b`` in ``range(count)`` one holding exactly the words whose
    :func:`head` ``bucket`` maps to ``b``, their postings as in the whole
    piece (lists and bitmaps alike: each segment names the piece's
    memories), and no lengths; last one whose words are the first
    characters of the piece's words, each one's postings the
    :func:`~stash.core.words_top.layers` of how many words it prefixes in
    each memory (:meth:`PieceIndex.char_layers`), so that a query word of
    one character opens that one alone. Its ``held`` is 1; when the layers
    would outweigh the whole piece (one bitmap of the piece per layer:
    only memories crafted to hold many words of many first characters get
    there) it keeps none and ``held`` is 0, and a search rebuilds such a
    piece rather than read it. A query word's :meth:`PieceIndex.bits`
    in its head's bucket (or, for one of one character, in every bucket,
    the bits joined) is what it is in the whole piece.

    A word's flags go with it. A stem key goes to the bucket of the
    stem's head, the one a query word of that stem opens, with the words
    that have it; a word of another bucket that has it ("dying", whose
    English stem is "die") is copied there too, postings and all, with no
    flags: no prefix of it has this bucket's head, so a search by prefix
    never meets the copy, and :meth:`PieceIndex.mates` in that bucket
    is what it is in the whole piece."""
    idx = PieceIndex(data)
    n = len(idx.at)
    key_of = [idx.word(w) for w in range(n)]
    home = [bucket(head(key)) for key in key_of]
    members: list[list[int]] = [[] for _ in range(count)]
    for w, b in enumerate(home):
        members[b].append(w)
    stem_keys: list[list[tuple[bytes, list[int]]]] = [[] for _ in range(count)]
    stem_at, stem_starts, refs = idx.stem_arrays()
    for e in range(len(stem_at)):
        end = stem_at[e + 1] if e + 1 < len(stem_at) else len(idx.stem_joined)
        key = idx.stem_joined[stem_at[e] + 1 : end]
        mates = list(refs[stem_starts[e] : stem_starts[e + 1]])
        stem_keys[bucket(head(key[1:]))].append((key, mates))
    keys: list[list[bytes]] = [[] for _ in range(count)]
    starts = [array("I", [0]) for _ in range(count)]
    flats = [array("H") for _ in range(count)]
    flags = [bytearray() for _ in range(count)]
    others: list[list[tuple[bytes, list[int]]]] = [[] for _ in range(count)]
    for b in range(count):
        words_b = members[b]
        if stem_keys[b]:
            away = {w for _, mates in stem_keys[b] for w in mates if home[w] != b}
            if away:
                words_b = sorted([*words_b, *away])  # word indexes sort as the words do
            local = {w: k for k, w in enumerate(words_b)}
            others[b] = [(key, [local[w] for w in mates]) for key, mates in stem_keys[b]]
        for w in words_b:
            keys[b].append(key_of[w])
            flats[b].extend(idx.postings[idx.starts[w] : idx.starts[w + 1]])
            starts[b].append(len(flats[b]))
            flags[b].append(idx.flags[w] if home[w] == b else 0)
    firsts = dict.fromkeys(key[: _char_end(key, 0)] for key in key_of)
    char_starts = array("I", [0])
    char_flat = array("H")
    for first in firsts:  # in byte order, as the words are
        bitmaps: list[int] = []
        lists: list[Ints] = []
        idx.gather(first, bitmaps, lists)
        for lay in tally(idx.memories, bitmaps, lists)[2]:
            char_flat.extend(_units_of(lay.to_bytes(2 * idx.units, "little")))
        char_starts.append(len(char_flat))
    stats = _encode([], array("I", [0]), array("H"), idx.lengths, idx.held, idx.words, idx.memories)
    if 2 * len(char_flat) > len(data):  # only text built to defeat it: not kept (held 0), the piece read whole
        chars = _encode([], array("I", [0]), array("H"), array("H"), 0, 0, idx.memories)
    else:
        chars = _encode(list(firsts), char_starts, char_flat, array("H"), 1, 0, idx.memories)
    return (
        [stats]
        + [
            _encode(keys[b], starts[b], flats[b], array("H"), 0, 0, idx.memories, bytes(flags[b]), others[b])
            for b in range(count)
        ]
        + [chars]
    )
