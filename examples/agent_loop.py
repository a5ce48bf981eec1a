#!/usr/bin/env python3
"""One session of an agent on the Stash library: wake, note what happened, and answer every due nap with
a summariser the caller supplies (here a stand-in that joins the first words of each source line; a real
agent asks its model). Run with STASH_URL and STASH_TOKEN set:

    python3 examples/agent_loop.py "chose jade over chrome" "the Harbor review moved to Friday"
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from stash import Nap, NapNeeded, Stash


def summarise(nap: Nap) -> str:
    """A stand-in for the model: the first three words of each source line, within the byte limit."""
    words = " / ".join(" ".join(line.split(" ", 2)[-1].split()[:3]) for line in nap.source)
    return words.encode()[: nap.max_bytes].decode(errors="ignore").strip() or "nothing of lasting effect"


def answer_naps(mem: Stash, nap: Nap | None, write: Callable[[Nap], str]) -> int:
    """Answer every due nap, one at a time, before the next action; how many were written."""
    written = 0
    while nap is not None:
        nap = mem.nap(nap.block, write(nap)).nap
        written += 1
    return written


def session(mem: Stash, notes: list[str], write: Callable[[Nap], str] = summarise) -> list[str]:
    """Wake (writing the summaries the wake needs first), note each line, answer each due nap; the wake."""
    while True:
        try:
            wake = mem.wake()
            break
        except NapNeeded as refused:
            answer_naps(mem, refused.nap, write)
    answer_naps(mem, wake.nap, write)
    for text in notes:
        answer_naps(mem, mem.note(text).nap, write)
    return mem.wake().lines


if __name__ == "__main__":
    memory = Stash(os.environ["STASH_URL"], os.environ["STASH_TOKEN"])
    for line in session(memory, sys.argv[1:]):
        print(line)
