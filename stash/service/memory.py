"""The OptMem memory model over one opened memory file (docs/DESIGN.md, "Memory model").

Each method is one route's whole behaviour and returns the JSON-ready answer;
refusals are :mod:`stash.core.errors` exceptions. Nothing here knows HTTP.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..core import blocks, lines, sizes, words
from ..core.errors import Conflict, Damaged, Invalid, NotFound
from ..core.recall import BadPattern, compile_pattern
from ..storage.keyring import now_utc
from ..storage.memfile import ERASED, MemoryFile
from . import instructions, recall_scan, words_scan

AWAKE = "You are awake."
READ_ONLY = (
    "This capability is read-only: you can wake, recall and zoom, but not note, nap or forget. When "
    "something should be remembered, tell the user (the memory's owner) instead of noting it; when you "
    "need the past, recall it."
)
MIN_LINE_BYTES = len("#0-1 x\n")  # the shortest rendered line and its newline
# A recall's time bound: RE2 is linear, but a pattern that defeats its DFA is a
# slow linear, so matching gets RECALL_SECONDS beyond what opening the log
# costs (RECALL_SECONDS_PER_MEMORY each).
RECALL_SECONDS = 5.0
RECALL_SECONDS_PER_MEMORY = 10e-6
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_Method = TypeVar("_Method", bound=Callable[..., Any])


def one_snapshot(method: _Method) -> _Method:
    """Run a method that only reads in one snapshot of the memory file
    (MemoryFile.snapshot), so what it reads first (the count, the
    settled tree) and what it reads next (the summaries named there) agree,
    whatever another worker commits meanwhile."""

    @functools.wraps(method)
    def inside(self: Memory, *args: Any, **kw: Any) -> Any:
        with self.mf.snapshot():
            return method(self, *args, **kw)

    return inside  # type: ignore[return-value]


def nap_prompt(bid: str, source: list[str], remaining: int, limit: int, run: list[dict[str, Any]]) -> str:
    """The compression prompt: OptMem's own, byte for byte, up to its command
    (docs/DESIGN.md, "Nap"), then each command of ``run`` as an order on its
    own line: the nap first, then the batch offer when ``run`` has one."""
    tail = (
        ""
        if not remaining
        else "\n"
        + ("1 compression remains" if remaining == 1 else f"{remaining} compressions remain")
        + " after this one."
    )
    text = (
        f"Compress memories #{bid} into one line of at most {limit} bytes.\n"
        "Keep what has lasting effect, drop what does not. Invent nothing.\n\n"
        + "\n".join("  " + s for s in source)
        + f"\n{tail}\n"
        + instructions.run_lines(run[:1])
    )
    if len(run) > 1:
        text += f"\n{BATCH_OFFER.format(k=run[1]['fields']['batch'])}\n" + instructions.run_lines(run[1:])
    return text


# A batch prompt's text besides its blocks (its instructions, the remaining count, the command's
# curl line), with room to spare: Memory.batch_fit.
BATCH_OVERHEAD = 1_000

BATCH_OFFER = (
    "Or write {k} of the due blocks as one batch (by yourself, or split them among parallel subagents that "
    "only write lines and never call Stash):"
)


def today_utc() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


class Memory:
    def __init__(self, mf: MemoryFile, today: Callable[[], str] = today_utc, *, writes: bool = True) -> None:
        """``writes``: the capability may write (full or owner). A read
        capability is never handed a nap or told to note: every instruction
        it gets is one it can carry out."""
        self.mf = mf
        self.today = today
        self.writes = writes
        self.sizes = sizes.effective(mf.config())

    # ------------------------------------------------------------ reading helpers

    def _block(self, text: object, hint: Callable[[], str] | None = None) -> tuple[int, int]:
        """``text`` as a block; refused with ``hint()``, a sentence naming a
        block that fits what the caller showed (by default: copy one)."""
        why = None
        if not isinstance(text, str):
            why = "The block must be a string, written low-high."
        else:
            try:
                return blocks.parse_block(text)
            except blocks.BlockIdError as e:
                why = str(e)
        tip = hint() if hint else "Copy one from the wake or the nap prompt."
        raise Invalid(f"{why} {tip}", code="block.invalid")

    def _zoom_hint(self, T: int) -> str:
        """Which block to zoom into, from what a wake of ``T`` memories shows:
        its first ``#lo-hi`` line; when every line is a memory, the largest
        block from #0 (zoom opens any complete block, shown or not); and when
        the log holds fewer than two memories, that there is none yet."""
        shown = [b for b in blocks.cover(T, self.sizes["WAKE_LINES"]) if b[1] - b[0] > 1]
        if shown:
            return f"Zoom into a #lo-hi line the wake prints, like {blocks.block_id(*shown[0])} (its first)."
        if T >= 2:
            size = 1 << (T.bit_length() - 1)
            return (
                f"The wake prints every one of the {T} notes word for word, so it shows no #lo-hi line; "
                f"a complete block still opens, like {blocks.block_id(0, size)}."
            )
        return "There are no blocks to zoom into yet: a block holds at least 2 notes."

    def _zoom_next(self, T: int) -> list[dict[str, Any]]:
        """The order that helps after a zoom past the end, as memo names one:
        the zoom :meth:`_zoom_hint` suggests, filled in; with no block yet,
        the wake."""
        shown = [b for b in blocks.cover(T, self.sizes["WAKE_LINES"]) if b[1] - b[0] > 1]
        if not shown and T >= 2:
            shown = [(0, 1 << (T.bit_length() - 1))]
        if not shown:
            return [instructions.wake()]
        bid = blocks.block_id(*shown[0])
        return [instructions.step("POST", "/zoom", {"block": bid}, bid)]

    def _within(self, lo: int, hi: int, T: int) -> None:
        if hi > T:
            raise Invalid(
                f"{blocks.block_id(lo, hi)} reaches past the log, which holds {lines.plural(T, 'note')}; "
                "only complete blocks have summaries.",
                code="block.beyond_log",
            )

    def _render_memories(self, lo: int, hi: int) -> list[str]:
        return [lines.memory_line(*m) for m in self.mf.memories(lo, hi)]

    def _source(self, lo: int, hi: int) -> list[str]:
        """The rendered lines block ``[lo, hi)`` is compressed from (docs/DESIGN.md, "Nap")."""
        if hi - lo <= blocks.RAW_MAX:
            return self._render_memories(lo, hi)
        source = []
        erased = self.mf.erased_runs()
        for a, b in blocks.halves(lo, hi):
            if erased.covers(a, b):
                source.append(lines.summary_line(a, b, ERASED))
                continue
            s = self.mf.summary(a, b)
            if s is None:
                raise Damaged(
                    f"The summary of {blocks.block_id(a, b)} is missing though a block above it is due; "
                    f"forget {blocks.block_id(a, b)} and nap again."
                )
            source.append(lines.summary_line(a, b, s))
        return source

    @one_snapshot
    def nap_for(self, T: int, settled: dict[int, int] | None = None) -> dict[str, Any] | None:
        """The due compression at snapshot ``T`` as a nap object, or None;
        always None for a read capability, which cannot write it. When more
        than one is due, the prompt says so and how to take the ones that can
        be written now as one batch."""
        if not self.writes:
            return None
        settled = self.mf.settled(T) if settled is None else settled
        first = blocks.first_pending(T, settled)
        if first is None:
            return None
        lo, hi = first
        source = self._source(lo, hi)
        remaining = blocks.pending_count(T, settled) - 1
        bid = blocks.block_id(lo, hi)
        limit = self.sizes["ENTRY_CHARS"]
        run = [instructions.nap(bid)]
        ready = self.batch_fit(blocks.batch(T, settled, blocks.BATCH_MAX)) if remaining else 0
        if ready > 1:
            run.append(instructions.nap_batch(ready))
        return {
            "block": bid,
            "source": source,
            "remaining": remaining,
            "max_bytes": limit,
            "prompt": nap_prompt(bid, source, remaining, limit, run),
            "run": run,
        }

    def batch_fit(self, ready: list[tuple[int, int]]) -> int:
        """How many of the ``ready`` blocks a batch offer names: as many as
        fit in one part (PART_CHARS bytes), as a wake part does, because
        harnesses cut long output; always at least one. Each block costs its
        ``#lo-hi:`` line, its source lines and its line in the command, read
        for real: reading stops once the part is full, so an offer reads at
        most about one part's worth of lines."""
        room = self.sizes["PART_CHARS"] - BATCH_OVERHEAD
        # A memory is in up to four raw blocks of a run (#0-1, #0-3, #0-7, #0-15): its line is read once, with
        # the rest of its aligned #lo-hi of RAW_MAX that the run reaches, in one read (a read of a few rows
        # costs mostly its own statement), and counted for every block it is in.
        rendered: dict[int, str] = {}
        reach = max((hi for lo, hi in ready if hi - lo <= blocks.RAW_MAX), default=0)

        def source(lo: int, hi: int) -> list[str]:
            if hi - lo > blocks.RAW_MAX:
                return self._source(lo, hi)
            unread = [i for i in range(lo, hi) if i not in rendered]
            if unread:
                end = max(unread[-1] + 1, min(reach, (unread[0] // blocks.RAW_MAX + 1) * blocks.RAW_MAX))
                rendered.update((m[0], lines.memory_line(*m)) for m in self.mf.memories(unread[0], end))
            return [rendered[i] for i in range(lo, hi)]

        n = 0
        for lo, hi in ready:
            bid = blocks.block_id(lo, hi)
            room -= (
                2 * len(bid)
                + 8
                + sum(len(s.encode()) + 3 for s in source(lo, hi))
                + 1
                + len(instructions.summary_placeholder(bid))
                + 2
            )
            if room < 0:
                break
            n += 1
        return max(1, n) if ready else 0

    @one_snapshot
    def batch_for(self, T: int, k: int) -> dict[str, Any]:
        """Up to ``k`` due blocks that can be written at once (docs/DESIGN.md, "Blocks and the tree"),
        each with its source, and the prompt that ends with the one command
        that settles them all: as many of them as fit in one part
        (PART_CHARS bytes; always at least one), the rest left for the next
        batch, which the prompt says remain."""
        settled = self.mf.settled(T)
        nap = self.nap_for(T, settled)
        todo = blocks.batch(T, settled, k)
        limit = self.sizes["ENTRY_CHARS"]
        items: list[dict[str, Any]] = [
            {"block": blocks.block_id(lo, hi), "source": self._source(lo, hi), "max_bytes": limit} for lo, hi in todo
        ]
        if not items:
            return {
                "saved": None,
                "nap": None,
                "batch": [],
                "prompt": None,
                "run": [],
                "message": "Nothing left to compress.",
            }
        pending = blocks.pending_count(T, settled)
        fits, over = 1, len(items) + 1  # the largest count known to fit, the smallest known not to
        if len(self._batch_prompt(items, pending, limit).encode()) <= self.sizes["PART_CHARS"]:
            fits = over = len(items)
        while over - fits > 1:
            mid = (fits + over) // 2
            if len(self._batch_prompt(items[:mid], pending, limit).encode()) <= self.sizes["PART_CHARS"]:
                fits = mid
            else:
                over = mid
        items = items[:fits]
        ids = [it["block"] for it in items]
        run = [instructions.nap_summaries(ids)]
        return {
            "saved": None,
            "nap": nap,
            "batch": items,
            "prompt": self._batch_prompt(items, pending, limit),
            "run": run,
            "message": f"{lines.plural(len(items), 'block')} to compress: {ids[0]} to {ids[-1]}.",
        }

    @staticmethod
    def _batch_prompt(items: list[dict[str, Any]], pending: int, limit: int) -> str:
        ids = [it["block"] for it in items]
        run = [instructions.nap_summaries(ids)]
        after = pending - len(items)
        body = "\n\n".join(f"#{it['block']}:\n" + "\n".join("  " + s for s in it["source"]) for it in items)
        return (
            (
                f"Compress each of these {len(items)} blocks into one line of at most {limit} bytes.\n"
                "Keep what has lasting effect, drop what does not. Invent nothing. Each block stands alone, so they "
                "can be written in parallel (by subagents that only write lines and never call Stash).\n\n"
                if len(items) > 1
                else f"Compress this block into one line of at most {limit} bytes.\n"
                "Keep what has lasting effect, drop what does not. Invent nothing.\n\n"
            )
            + body
            + "\n\n"
            + (
                f"{lines.plural(after, 'compression')} will remain after these; ask for the next batch then.\n"
                if after
                else ""
            )
            + (
                "Send every line at once, in this order (all or nothing).\n"
                if len(items) > 1
                else "Send the line with this command.\n"
            )
            + instructions.run_lines(run)
        )

    # ------------------------------------------------------------ wake

    def _prefetch(self, cover: list[tuple[int, int]], cache: dict[tuple[int, int], str]) -> None:
        """Render the lines of ``cover`` not in ``cache`` with one query per
        run of memories and per level, instead of one per line. A block
        whose summary is missing stays out of ``cache``, for
        :meth:`_wake_lines` to refuse as it would one by one."""
        todo = [b for b in cover if b not in cache]
        singles = [lo for lo, hi in todo if hi - lo == 1]
        start = 0
        for k in range(1, len(singles) + 1):
            if k == len(singles) or singles[k] != singles[k - 1] + 1:
                for line_, i in zip(
                    self._render_memories(singles[start], singles[k - 1] + 1), range(singles[start], singles[k - 1] + 1)
                ):
                    cache[(i, i + 1)] = line_
                start = k
        by_size: dict[int, list[int]] = {}
        for lo, hi in todo:
            if hi - lo > 1:
                by_size.setdefault(hi - lo, []).append(lo // (hi - lo))
        for size, idxs in by_size.items():
            for idx, text in self.mf.summaries_of(size, min(idxs), max(idxs) + 1).items():
                lo = idx * size
                cache[(lo, lo + size)] = lines.summary_line(lo, lo + size, text)

    def _wake_lines(self, T: int, budget: int, settled: dict[int, int], cache: dict[tuple[int, int], str]) -> list[str]:
        out = []
        cover = blocks.cover(T, budget)
        for lo, hi in cover:
            # A wholly erased block shows as erased, never from a row (docs/DESIGN.md, "Erase").
            if hi - lo > 1 and blocks.is_erased(settled, lo, hi):
                cache[(lo, hi)] = lines.summary_line(lo, hi, ERASED)
        self._prefetch(cover, cache)
        for lo, hi in cover:
            key = (lo, hi)
            if key not in cache:
                if hi - lo == 1:
                    cache[key] = self._render_memories(lo, hi)[0]
                else:
                    s = self.mf.summary(lo, hi)
                    if s is None:
                        if not self.writes:
                            n = blocks.pending_count(T, settled)
                            raise Conflict(
                                f"Cannot wake yet: the memory context needs #{blocks.block_id(lo, hi)}, which is "
                                f"not compressed yet. The memory's writer (a full or owner capability) owes "
                                f"{lines.plural(n, 'compression')}; this read capability cannot write them. Tell "
                                "the user, and wake again once the writer has answered its naps.",
                                code="wake.needs_nap",
                                needs=blocks.block_id(lo, hi),
                                nap=None,
                                run=[],
                            )
                        nap = self.nap_for(T, settled)
                        if nap is None:
                            raise Damaged(
                                f"The summary of {blocks.block_id(lo, hi)} is missing though nothing is due; "
                                f"forget {blocks.block_id(lo, hi)} and nap again."
                            )
                        n = blocks.pending_count(T, settled)
                        raise Conflict(
                            f"Cannot wake: the memory context needs #{blocks.block_id(lo, hi)}, which is not "
                            f"compressed yet. Do the {lines.plural(n, 'compression')} due (the first is below), "
                            "then wake again.",
                            code="wake.needs_nap",
                            needs=blocks.block_id(lo, hi),
                            nap=nap,
                            run=[instructions.wake()],
                        )
                    cache[key] = lines.summary_line(lo, hi, s)
            out.append(cache[key])
        return out

    @one_snapshot
    def wake(self, part: int = 1, T: int | None = None) -> dict[str, Any]:
        head = self.mf.pinned_head(current=True)
        answer = self._wake(head.count, part, T)
        answer["head"] = head.as_dict()
        return answer

    def _wake(self, now: int, part: int, T: int | None) -> dict[str, Any]:
        if T is None:
            T = now
        elif T > now:
            raise Invalid(
                f"T={T}, but the log holds {lines.plural(now, 'memory')}; wake again without T.", code="wake.bad_t"
            )
        if not T:
            if part != 1:
                raise Invalid(f"No part {part}: the memory has 1 part; wake without part.", code="wake.no_part")
            empty, run = "", []
            if not now:
                empty = (
                    "No memories yet; the order below records the first one.\n" if self.writes else "No memories yet.\n"
                )
                run = [instructions.note()] if self.writes else []
            return {
                "T": 0,
                "part": 1,
                "parts": 1,
                "lines": [],
                "awake": True,
                "nap": None,
                "next": None,
                "message": empty + self._awake(),
                "run": run,
            }
        settled = self.mf.settled(T)
        nap = self.nap_for(T, settled)
        room = self.sizes["WAKE_CHARS"] - len((AWAKE + "\n").encode())
        if nap:
            room -= len(("\n" + nap["prompt"] + "\n").encode())
        room = max(room, self.sizes["ENTRY_CHARS"])
        cache: dict[tuple[int, int], str] = {}
        # Lowering one step at a time is the rule; budgets that cannot fit are
        # skipped exactly: cover(T, b) has at least min(b, T) lines and every
        # rendered line costs at least MIN_LINE_BYTES, so no b above
        # room // MIN_LINE_BYTES fits (and for b >= T the document is the same
        # verbatim one whatever b is).
        budget = min(self.sizes["WAKE_LINES"], max(1, room // MIN_LINE_BYTES))
        while True:
            doc = self._wake_lines(T, budget, settled, cache)
            if budget <= 1 or sum(lines.line_bytes(x) for x in doc) <= room:
                break
            budget -= 1
        parts = lines.paginate(doc, self.sizes["PART_LINES"], self.sizes["PART_CHARS"])
        if not 1 <= part <= len(parts):
            raise Invalid(
                f"No part {part}: the memory has {lines.plural(len(parts), 'part')}; wake again from part 1.",
                code="wake.no_part",
            )
        last = part == len(parts)
        run = [] if last else [instructions.wake(part + 1, T)]
        return {
            "T": T,
            "part": part,
            "parts": len(parts),
            "lines": parts[part - 1],
            "awake": last,
            "nap": nap if last else None,
            "next": instructions.render(run[0]) if run else None,
            "message": self._awake() if last else "Not awake yet: read the next part.",
            "run": run,
        }

    def _awake(self) -> str:
        """The wake's closing message: for a read capability, what it is and
        what to do instead of noting or napping, before the awake line."""
        return AWAKE if self.writes else f"{READ_ONLY}\n{AWAKE}"

    def count(self) -> int:
        """How many memories the log holds."""
        return self.mf.count()

    # ------------------------------------------------------------ note, nap

    def note(self, text: object) -> dict[str, Any]:
        """Append one memory, dated the later of today (UTC) and the newest
        memory's date (docs/DESIGN.md, "Memory model"): a clock set back
        never makes the log's dates go backwards, so every log keeps the
        import rule (non-decreasing dates) and its export imports again. The
        newest date is read inside the write lock, so a racing note cannot
        slip an earlier date in after a later one."""
        text = lines.check_written(text, self.sizes["ENTRY_CHARS"])
        items = [(self.today(), text)]

        def not_before_newest(T: int, newest: str | None) -> None:
            if newest is not None and newest > items[0][0]:
                items[0] = (newest, text)  # append reads its items after this check, inside the lock

        i = self.mf.append(items, check=not_before_newest)
        return {"id": i, "nap": self.nap_for(i + 1), "head": self.mf.pinned_head().as_dict()}

    def nap(
        self, block: object = None, text: object = None, batch: object = None, summaries: object = None
    ) -> dict[str, Any]:
        if batch is not None or summaries is not None:
            if block is not None or text is not None or (batch is not None and summaries is not None):
                raise Invalid(
                    'Send one of {}, {"block", "text"}, {"batch": k} or {"summaries": [...]}.', code="nap.mixed"
                )
            if batch is not None:
                if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= blocks.BATCH_MAX:
                    raise Invalid(f"batch must be a whole number from 1 to {blocks.BATCH_MAX}.", code="nap.bad_batch")
                return self.batch_for(self.mf.count(), batch)
            return self.settle(summaries)
        T = self.mf.count()
        if block is None:
            if text is not None:
                raise Invalid(
                    'A summary needs its block: send {"block": "lo-hi", "text": ...}.', code="nap.missing_block"
                )
            nap = self.nap_for(T)
            return {
                "saved": None,
                "nap": nap,
                "message": "Nothing left to compress." if nap is None else f"Compress {nap['block']} next.",
            }
        if text is None:
            raise Invalid(
                'A summary needs its text: send {"block": "lo-hi", "text": "<your line>"}, '
                "or {} to ask what is due. Nothing was written.",
                code="nap.missing_text",
            )
        lo, hi = self._block(block)
        self._within(lo, hi, T)
        bid = blocks.block_id(lo, hi)
        with self.mf.snapshot():
            settled = self.mf.settled(T)
            if (lo, hi) != blocks.first_pending(T, settled):
                return self._not_due(T, settled, lo, hi)
        text = lines.check_written(text, self.sizes["ENTRY_CHARS"], "summary")
        if not self.mf.put_summary(lo, hi, text):
            # Another writer got there first (a racing nap of the same block:
            # answered as any already-settled block is), or a forget dropped
            # a half this block builds on.
            with self.mf.snapshot():
                settled = self.mf.settled(T)
                if blocks.is_settled(settled, lo, hi):
                    return self._not_due(T, settled, lo, hi)
                return {
                    "saved": None,
                    "nap": self.nap_for(T, settled),
                    "message": f"{bid} was forgotten meanwhile; nothing was written.",
                }
        return {"saved": bid, "nap": self.nap_for(T), "message": f"{bid} saved."}

    def _not_due(self, T: int, settled: blocks.Settled, lo: int, hi: int) -> dict[str, Any]:
        """The answer to a nap of a block that is not the one due: already
        settled (nothing written, the next nap offered), or 409 naming the
        one due."""
        bid = blocks.block_id(lo, hi)
        if blocks.is_settled(settled, lo, hi):
            return {
                "saved": None,
                "settled": bid,
                "nap": self.nap_for(T, settled),
                "message": f"{bid} is already settled; nothing was written.",
            }
        due = self.nap_for(T, settled)
        assert due is not None  # (lo, hi) is pending but not first, so a first exists
        raise Conflict(
            f"Wrong block: {bid}. Blocks settle in order, and the next is {due['block']}; answer that one.",
            code="nap.wrong_block",
            due=due["block"],
            nap=due,
        )

    def settle(self, summaries: object) -> dict[str, Any]:
        """Settle ``[{"block", "text"}, ...]`` in order, all or nothing, each
        exactly as a single nap would (docs/DESIGN.md, "Blocks and the tree"), so the tree is the one
        single naps make. A block settled before the request is skipped (a
        retry of a batch that landed writes nothing); any other block out of
        order is 409 naming the one due, and nothing is written."""
        if not isinstance(summaries, list) or not 1 <= len(summaries) <= blocks.BATCH_MAX:
            raise Invalid(
                f'summaries must be a list of 1 to {blocks.BATCH_MAX} objects {{"block": "lo-hi", "text": "..."}}.',
                code="nap.bad_summaries",
            )
        T = self.mf.count()
        limit = self.sizes["ENTRY_CHARS"]
        with self.mf.snapshot():  # the tree the checks and any 409 read is one
            before = self.mf.settled(T)
            # The tree as it will be once the blocks before each one are written:
            # an erasure's holes are filled where they are, the frontiers move on.
            state = blocks.Settled(
                before, holes={size: list(ks) for size, ks in before.holes.items()}, erased=before.erased
            )
            parsed: list[tuple[int, int, str]] = []
            for k, item in enumerate(summaries):
                if not isinstance(item, dict) or set(item) != {"block", "text"}:
                    raise Invalid(
                        f'Summary {k} must be an object with exactly "block" and "text"; nothing was written.',
                        code="nap.bad_summaries",
                        index=k,
                    )
                try:
                    lo, hi = self._block(item["block"])
                    self._within(lo, hi, T)
                    parsed.append((lo, hi, lines.check_written(item["text"], limit, "summary")))
                except Invalid as e:
                    raise Invalid(
                        f"Summary {k}: {e.message} Nothing was written: fix that line and send all "
                        f"{len(summaries)} again with the same command, or ask for a new batch.",
                        code=e.code,
                        index=k,
                    ) from None
            todo: list[tuple[int, int, str]] = []
            for k, (lo, hi, text) in enumerate(parsed):
                size = hi - lo
                if blocks.is_settled(before, lo, hi):
                    continue
                if (lo, hi) != blocks.first_pending(T, state):
                    due = self.nap_for(T, before)
                    expected = blocks.first_pending(T, state)
                    want = blocks.block_id(*expected) if expected else None
                    why = (
                        f"the next after the ones before it is {want}"
                        if want
                        else "nothing is due after the ones before it"
                    )
                    raise Conflict(
                        f"Wrong block in summary {k}: {blocks.block_id(lo, hi)}; blocks settle in order, and {why}. "
                        f"Nothing was written; the next due is {due['block'] if due else 'none'}.",
                        code="nap.wrong_block",
                        due=due["block"] if due else None,
                        nap=due,
                        index=k,
                    )
                todo.append((lo, hi, text))
                if lo // size in state.holes.get(size, ()):
                    state.holes[size].remove(lo // size)
                else:
                    state[size] = lo // size + 1  # past any wholly erased blocks it skipped
        if todo and not self.mf.put_summaries(todo):
            # Another writer settled or forgot blocks between the check and the
            # write: answered as a single nap's race is, with nothing written.
            return {
                "saved": [],
                "nap": self.nap_for(T),
                "message": "Another writer settled or forgot blocks meanwhile; nothing was written. "
                "Answer what is due now.",
            }
        saved = [blocks.block_id(lo, hi) for lo, hi, _ in todo]
        message = (
            f"{lines.plural(len(saved), 'summary')} saved."
            if saved
            else "Every block was already settled; nothing was written."
        )
        return {"saved": saved, "nap": self.nap_for(T), "message": message}

    # ------------------------------------------------------------ recall, zoom, forget

    def recall(self, q: object, before: int | None = None) -> dict[str, Any]:
        """The newest matches that fit one part, of the memories before
        ``before`` (default: the whole log). ``more`` is the ``before`` of
        the next older page: the id of the oldest match shown, when older
        ones were left out. Pages are cut at ids, so walking ``more`` until
        it is null yields every match exactly once, even while notes arrive
        (they land after every page's range)."""
        if not isinstance(q, str):
            raise Invalid("Send the pattern as the string q.", code="recall.bad_pattern")
        try:
            matcher = compile_pattern(q)
        except BadPattern as e:
            raise Invalid(str(e), code="recall.bad_pattern") from None
        deadline = time.monotonic() + RECALL_SECONDS + self.mf.count() * RECALL_SECONDS_PER_MEMORY
        try:
            found, total = recall_scan.recall(self.mf, matcher, self.sizes["PART_CHARS"], deadline, before)
        except BadPattern as e:
            raise Invalid(str(e), code="recall.too_slow") from None
        more = int(found[0].split(" ", 1)[0][1:]) if found and len(found) < total else None
        count = "No match." if not total else f"{lines.plural(total, 'match')}."
        if before is not None and total:
            count = f"{lines.plural(total, 'match')} before #{before}."
        run = []
        if more is not None:
            message = (
                f"{count} The newest {len(found)} {'is' if len(found) == 1 else 'are'} shown; the command "
                "below fetches the older ones."
            )
            run = [instructions.recall(more)]
        elif total and not found:
            message = f"{count} None fits in PART_CHARS={self.sizes['PART_CHARS']} bytes; raise PART_CHARS."
        else:
            message = count
        return {"matches": found, "total": total, "more": more, "message": message, "run": run}

    def recall_words(self, text: object, before: object = None) -> dict[str, Any]:
        """A words search (docs/DESIGN.md, "Word search"): the best matches
        that fit one part, best first, with their scores; ``more`` is the
        cursor of the next page (sent back as ``before``), which ranks the
        same memories with the same statistics, so walking it shows every
        match once."""
        try:
            query = words.parse_query(text)
            cursor = None if before is None else words.parse_cursor(before, query)
        except words.BadWords as e:
            raise Invalid(str(e), code="recall.bad_words") from None
        if cursor is not None and cursor.T > self.mf.count():
            raise Invalid(
                "before is not the more of a previous page of this search. Send the more the last "
                "page answered, or leave before out for the first page.",
                code="recall.bad_words",
            )
        deadline = time.monotonic() + RECALL_SECONDS + self.mf.count() * RECALL_SECONDS_PER_MEMORY
        try:
            found = words_scan.search(self.mf, query, self.sizes["PART_CHARS"], deadline, cursor)
        except words_scan.TooSlow:
            raise Invalid(
                "The words took too long to search this memory. Send longer or fewer words, "
                "or search again: the index built meanwhile is kept.",
                code="recall.too_slow",
            ) from None
        more = None if found.more is None else found.more.text()
        total = found.total
        count = "No match." if not total else f"{lines.plural(total, 'match')}."
        run = []
        if more is not None:
            message = (
                f"{count} The best {len(found.lines)} {'is' if len(found.lines) == 1 else 'are'} shown, "
                "best first; the command below fetches the next ones."
            )
            run = [instructions.recall_words(more)]
        elif found.cut:
            message = (
                f"{count} The next one does not fit in PART_CHARS={self.sizes['PART_CHARS']} bytes; "
                "raise PART_CHARS to see it and those after it."
            )
        elif not total:
            message = count
        elif cursor is not None:
            message = f"{count} These are the last of them."
        else:
            message = f"{count} Best first."
        return {
            "matches": found.lines,
            "scores": [s / words.SCALE for s in found.scores],
            "total": total,
            "more": more,
            "message": message,
            "run": run,
        }

    @one_snapshot
    def zoom(self, block: object) -> dict[str, Any]:
        T = self.mf.count()
        lo, hi = self._block(block, lambda: self._zoom_hint(T))
        if lo >= T:
            last = f" (#0 to #{T - 1})" if T else ""
            raise Invalid(
                f"{blocks.block_id(lo, hi)} starts beyond the log, which holds {lines.plural(T, 'note')}{last}. "
                + self._zoom_hint(T),
                code="block.beyond_log",
                run=self._zoom_next(T),
            )
        out = []
        for a, b in blocks.halves(lo, hi):
            if a >= T:
                continue
            if b - a == 1:
                out.extend(self._render_memories(a, b))
            elif b <= T and self.mf.erased_runs().covers(a, b):
                out.append(lines.summary_line(a, b, ERASED))
            else:
                s = self.mf.summary(a, b) if b <= T else None
                out.append(lines.summary_line(a, b, s if s is not None else "not compressed yet"))
        return {"block": blocks.block_id(lo, hi), "lines": out}

    def forget(self, block: object) -> dict[str, Any]:
        """Drop the summary of ``block``, the block containing it at each
        larger size, and every later summary of each of those sizes (each
        size's summaries stay a dense prefix: blocks.forget_span). The log is
        untouched; the answer carries the nap now due, the first of those
        summaries to write again."""
        lo, hi = self._block(block)
        T = self.mf.count()
        self._within(lo, hi, T)
        gone = self.mf.drop_summaries_from(lo, hi)
        if not gone:
            raise NotFound(
                f"No summary at {blocks.block_id(lo, hi)}: it is not compressed yet, so there is nothing to forget.",
                code="forget.no_summary",
            )
        return {"dropped": [blocks.block_id(a, b) for a, b in gone], "nap": self.nap_for(T)}

    # ------------------------------------------------------------ erasure

    MAX_ERASE = 10_000

    def erase(self, ids: object, at: str | None = None) -> dict[str, Any]:
        """Shred memories ``ids`` (docs/DESIGN.md, "Erase"); the receipt is dated ``at``, by default now."""
        at = at or now_utc()
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > self.MAX_ERASE
            or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
        ):
            raise Invalid(
                f'Send {{"ids": [...]}}: 1 to {self.MAX_ERASE} note ids as whole numbers.', code="erase.bad_ids"
            )
        T = self.mf.count()
        bad = [i for i in ids if not 0 <= i < T]
        if bad:
            raise Invalid(
                f"#{bad[0]} is not a note: the log holds {lines.plural(T, 'note')} (#0 to #{T - 1}). "
                "Nothing was erased.",
                code="erase.unknown_id",
            )
        rid, fresh, gone = self.mf.erase(ids, at)
        return {"receipt": rid, "ids": sorted(set(ids)), "erased": fresh, "dropped": len(gone), "at": at}

    def erasures(self) -> dict[str, Any]:
        return {"erasures": self.mf.receipts()}

    # ------------------------------------------------------------ config, import

    def config(self) -> dict[str, Any]:
        return {"sizes": dict(self.sizes), "defaults": dict(sizes.DEFAULTS)}

    def set_config(self, changes: object) -> dict[str, Any]:
        self.mf.set_config(sizes.validate_changes(changes))
        self.sizes = sizes.effective(self.mf.config())
        return self.config()

    def import_entries(self, entries: object) -> dict[str, Any]:
        if not isinstance(entries, list) or not entries:
            raise Invalid(
                'Send {"entries": [{"date": "YYYY-MM-DD", "text": "..."}, ...]}, oldest first.', code="import.empty"
            )
        today = self.today()
        items: list[tuple[str, str]] = []
        prev = None
        for k, entry in enumerate(entries):
            if not isinstance(entry, dict) or set(entry) != {"date", "text"}:
                raise Invalid(
                    f'Entry {k} must be an object with exactly "date" and "text"; nothing was imported.',
                    code="import.bad_entry",
                    index=k,
                )
            date = entry["date"]
            if not isinstance(date, str) or not _DATE.fullmatch(date):
                raise Invalid(
                    f"Entry {k}: the date must be YYYY-MM-DD; nothing was imported.", code="import.bad_date", index=k
                )
            try:
                dt.date.fromisoformat(date)
            except ValueError:
                raise Invalid(
                    f"Entry {k}: {date} is not a real calendar date; nothing was imported.",
                    code="import.bad_date",
                    index=k,
                ) from None
            if date > today:
                raise Invalid(
                    f"Entry {k}: {date} is in the future (today is {today} UTC); nothing was imported.",
                    code="import.bad_date",
                    index=k,
                )
            if prev is not None and date < prev:
                raise Invalid(
                    f"Entry {k}: {date} is earlier than the entry before it; sort oldest first. Nothing was imported.",
                    code="import.out_of_order",
                    index=k,
                )
            try:
                text = lines.check_line(entry["text"], self.sizes["ENTRY_CHARS"])
            except Invalid as e:
                raise Invalid(f"Entry {k}: {e.message} Nothing was imported.", code=e.code, index=k) from None
            items.append((date, text))
            prev = date

        def after_newest(T: int, newest: str | None) -> None:
            if newest is not None and items[0][0] < newest:
                raise Invalid(
                    f"Entry 0: {items[0][0]} is earlier than the newest note (#{T - 1}, {newest}); import only "
                    "notes dated on or after it, or import an older past into a new, empty memory (POST /init, "
                    "or stash init URL) before noting there. Nothing was imported.",
                    code="import.before_log",
                    index=0,
                )

        first = self.mf.append(items, check=after_newest)
        T = first + len(items)
        pending = blocks.pending_count(T, self.mf.settled(T))
        return {
            "first": first,
            "last": T - 1,
            "pending": pending,
            "head": self.mf.pinned_head().as_dict(),
            "run": [instructions.nap_status()] if pending else [],
        }
