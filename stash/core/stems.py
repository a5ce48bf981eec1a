"""The stemmers of word search (docs/DESIGN.md, "Word search"): the English
and the Turkish Snowball stemmers, as the Snowball project compiles them
(PyStemmer), never rules written here. Nothing here folds: the caller folds
what a stemmer gives (:func:`stash.core.words.stems_of`).

A stemmer reads a word as written, not folded: folding first breaks Turkish
("ağaçlar" folded is "agaclar", whose stem is not that of "ağaç"). It reads
it composed (NFC: the same text, accented letters as one character, as the
stemmers' alphabets have them) and lowercased, with ``İ`` lowercased to
``i`` alone (``str.lower`` gives ``i`` and a combining dot above, which the
Turkish stemmer reads as a letter of no suffix: "EVLERİMİZDEN" would keep
its suffixes).

A stemmer object keeps state while it stems, so each thread has its own
pair (:func:`_stemmers`), made without PyStemmer's cache of stems: its
callers stem each distinct form once already, and the cache's bookkeeping
costs six times the stemming (0.95 against 0.15 µs a word, measured on a
piece's words).
"""

from __future__ import annotations

import hashlib
import threading
import unicodedata
from collections.abc import Sequence
from typing import cast

import Stemmer

LANGUAGES = {"e": "english", "t": "turkish"}
"""The stemmers by the one-letter code a stem is kept under, in the order
:func:`stem_words` answers them."""

VERSION = f"snowball {Stemmer.version()} {' '.join(LANGUAGES.values())}"
"""Which stems these are. A word index piece records it (as :data:`TAG`):
stems of another version are another index, rebuilt from the log."""

TAG = hashlib.blake2b(VERSION.encode(), digest_size=4, person=b"stash.stems").digest()

_local = threading.local()


def _stemmers() -> list[Stemmer.Stemmer]:
    got: list[Stemmer.Stemmer] | None = getattr(_local, "stemmers", None)
    if got is None:
        got = _local.stemmers = [Stemmer.Stemmer(lang, 0) for lang in LANGUAGES.values()]
    return got


def lower(form: str) -> str:
    """A word as written (a run of letters, digits and marks), as the
    stemmers read it: composed, lowercased, ``İ`` to ``i``."""
    if form.isascii():
        return form.lower()
    return unicodedata.normalize("NFC", form).lower().replace("i\u0307", "i")


def stem_words(lowered: Sequence[str]) -> list[list[str]]:
    """The stems of ``lowered`` (words as :func:`lower` gives them), one
    list per language of :data:`LANGUAGES`, unfolded."""
    words = list(lowered)
    return [cast(list[str], stemmer.stemWords(words)) for stemmer in _stemmers()]
