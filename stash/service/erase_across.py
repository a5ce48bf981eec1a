"""Erase across memories (docs/DESIGN.md, "Memories"): every memory whose
text matches a query, in every memory of the identity named, erased as
``POST /erase`` erases, with one receipt naming memories and counts, never
the text nor the query; a dry run counts and shows what would go."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

from ..core import words as word_search
from ..core.errors import Invalid
from ..core.recall import BadPattern, compile_pattern
from ..storage import memories
from ..storage.keyring import now_utc
from .access import Session, Vault, unknown_memory

ERASE_MAX = 10_000  # matches one erasure across memories may take, as POST /erase's ids


def erase_matcher(words: object, q: object) -> Callable[[str], bool]:
    """The one place an erasure's query becomes a test on a rendered line
    ``#i DATE TEXT``: ``q`` is a recall regex over the whole line
    (docs/DESIGN.md, "Recall"); ``words`` is word search over the text
    (docs/DESIGN.md, "Word search"), and a memory is erased only when it
    holds every word of the query, each as a word prefix: the memories a
    words search ranks first, never every memory that shares one common
    word with the query."""
    if (words is None) == (q is None):
        raise Invalid('Send exactly one of "q" (a recall regex) or "words".', code="memory.bad_query")
    if words is not None:
        try:
            query = word_search.parse_query(words)
        except word_search.BadWords as e:
            return _refuse(str(e))
        return lambda line: word_search.matches_all(query, line.split(" ", 2)[2] if line.count(" ") >= 2 else "")
    try:
        # The pattern is compiled as recall compiles it (core/recall.py), so it matches what recall finds.
        return compile_pattern(q).search if isinstance(q, str) else _refuse("q is a recall regex, as a string.")
    except BadPattern as e:
        return _refuse(str(e))


def _refuse(message: str) -> Callable[[str], bool]:
    raise Invalid(message, code="memory.bad_query")


def matching(session: Session, test: Callable[[str], bool]) -> list[tuple[int, str]]:
    """The ids and rendered lines of memory's memories whose rendered line
    passes ``test``, oldest first, erased ones left out (their text is gone)."""
    mf = session.open_memory().mf
    erased = mf.erased_ids
    out = []
    for batch in mf.scan(mf.count(), 0):
        for line in batch:
            i = int(line.split(" ", 1)[0][1:])
            if i not in erased and test(line):
                out.append((i, line))
    return out


PREVIEW_BYTES = 20_000  # a dry run's lines, all memories together: what one wake part holds


def fingerprint(session: Session, query: str) -> str:
    """A keyed fingerprint of an erasure's query, never the query: keyed by
    main's epoch-0 key, so only the owner can test a guess against it."""
    key = hashlib.blake2b(b"erase-query", key=session.keys.base, digest_size=32, person=b"stash.erase.fp").digest()
    return hashlib.blake2b(query.encode(), key=key, digest_size=16).hexdigest()


def erase_across(
    vault: Vault, session: Session, token: str | None, words: object, q: object, names: object, dry_run: object
) -> dict[str, Any]:
    """Erase every memory matching the query in every memory named (default
    all), as ``POST /erase`` does in each: counted first in every memory, then
    erased memory by memory (each memory's erasure is its own transaction
    and its own receipt there); one receipt for the whole, naming memories
    and counts, never the text nor the query (its keyed fingerprint). Over
    ERASE_MAX matches in all: 422, nothing erased. A crash part-way leaves
    some memories erased and the rest untouched; resending the same request
    finishes it (what was erased no longer matches)."""
    test = erase_matcher(words, q)
    every = memories.names(vault.data_dir, session.user_id)
    if names is None:
        chosen = every
    elif (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise Invalid("memories is a list of memory names, each once.", code="memory.bad_query")
    else:
        missing = [n for n in names if n not in every]
        if missing:
            raise unknown_memory()
        chosen = list(names)
    if not isinstance(dry_run, bool) and dry_run is not None:
        raise Invalid("dry_run is true or false.", code="memory.bad_query")
    found: dict[str, list[int]] = {}
    preview: dict[str, list[str]] = {}
    room = PREVIEW_BYTES
    for name in chosen:
        if name == session.memory_name:
            hits = matching(session, test)
        else:
            with vault.session(token, "owner", memory=name) as other:
                hits = matching(other, test)
        found[name] = [i for i, _ in hits]
        if dry_run:
            # What would go, for the owner to see before the step that cannot be undone: as many lines as fit.
            preview[name] = []
            for _, line in hits:
                room -= len(line.encode()) + 1
                if room < 0:
                    break
                preview[name].append(line)
    total = sum(len(ids) for ids in found.values())
    if total > ERASE_MAX:
        raise Invalid(
            f"{total:,} notes match, more than the {ERASE_MAX:,} one erasure may take; nothing was "
            "erased. Narrow the query or name fewer memories.",
            code="memory.too_many_matches",
        )
    at = now_utc()
    counts = []
    flushed = True
    for name in chosen:
        ids = found[name]
        if ids and not dry_run:
            with contextlib.ExitStack() as stack:
                acting = (
                    session
                    if name == session.memory_name
                    else stack.enter_context(vault.session(token, "owner", memory=name))
                )
                for lo in range(0, len(ids), ERASE_MAX):
                    acting.open_memory().erase(ids[lo : lo + ERASE_MAX], at)
                flushed = acting.flush_memory() and flushed  # as every erasure: Session.flush_memory
        counts.append({"name": name, "erased": len(ids), **({"lines": preview[name]} if dry_run else {})})
    query = q if q is not None else words
    assert isinstance(query, str)
    return {
        "memories": counts,
        "total": total,
        "dry_run": bool(dry_run),
        "at": at,
        "fingerprint": fingerprint(session, ("q:" if q is not None else "words:") + query),
        "flushed": flushed,
    }
