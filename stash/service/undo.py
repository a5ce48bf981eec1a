"""The owner's way back (docs/DESIGN.md, "Erase"): erase a range of the
log, or everything one capability wrote in it, a bounded slice per request.

A capability that flooded a memory is revoked, then undone: each call erases
at most :data:`UNDO_MAX` memories and looks at most :data:`UNDO_SCAN`
positions, answers the erasure's receipt and ``more``, the ``first`` to send
next (null once the range is done). Erased memories need no nap and count
for nothing against the memory quota, so once the slices are done the wake
and the quota are as if the flood had not come.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import Invalid, NotFound
from ..core.lines import plural
from .memory import Memory

UNDO_MAX = Memory.MAX_ERASE
UNDO_SCAN = 100_000


def _whole(name: str, value: object, T: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Invalid(f"{name} must be a note id, a whole number from 0.", code="undo.bad_range")
    if value >= T:
        raise Invalid(
            f"#{value} is not a note: the log holds {plural(T, 'note')}. Nothing was erased.", code="undo.bad_range"
        )
    return value


def undo(memory: Memory, grant: object, first: object, last: object, grants: set[int]) -> dict[str, Any]:
    """Erase the memories of ``[first, last]`` (inclusive; ``first``
    defaults to 0, ``last`` to the newest) that capability ``grant`` wrote,
    or all of them when ``grant`` is None, in one slice. One of ``grant``
    and ``last`` must be given, so "the whole log" is never a default.
    ``grants``: the ids this memory has ever had."""
    T = memory.count()
    if grant is not None and (isinstance(grant, bool) or not isinstance(grant, int) or grant not in grants):
        raise NotFound("No such capability; list them with GET /grants.", code="grants.unknown")
    if grant is None and last is None:
        raise Invalid(
            'Say what to undo: {"grant": id} for what one capability wrote, or {"first", "last"} '
            "for a range of ids. Nothing was erased.",
            code="undo.bad_range",
        )
    if not T:
        raise Invalid("The log is empty; there is nothing to undo.", code="undo.bad_range")
    lo = _whole("first", first, T) or 0
    hi_incl = _whole("last", last, T)
    hi = T if hi_incl is None else hi_incl + 1
    if hi <= lo:
        raise Invalid("last is before first; send first ≤ last. Nothing was erased.", code="undo.bad_range")
    stop = min(hi, lo + UNDO_SCAN)
    ids: list[int] = []
    mf = memory.mf
    end = stop
    if grant is None:
        erased = mf.erased_runs()
        i = lo
        while i < stop and len(ids) < UNDO_MAX:
            j = erased.next_live(1, i)  # past a run of erased memories at once
            if j >= stop:
                break
            ids.append(j)
            i = j + 1
        end = ids[-1] + 1 if len(ids) == UNDO_MAX else stop
    else:
        for i, writer in mf.writers(lo, stop):
            if writer == grant:
                ids.append(i)
                if len(ids) == UNDO_MAX:
                    end = i + 1
                    break
    more = end if end < hi else None
    if not ids:
        return {
            "receipt": None,
            "ids": [],
            "erased": [],
            "dropped": 0,
            "at": None,
            "more": more,
            "message": "Nothing to erase in this slice." if more is not None else "Nothing left to erase.",
        }
    receipt = memory.erase(ids)
    return {
        **receipt,
        "more": more,
        "message": f"{plural(len(receipt['erased']), 'memory')} erased"
        + (
            "; send the same request with first set to more for the next slice."
            if more is not None
            else "; nothing left to erase in the range."
        ),
    }
