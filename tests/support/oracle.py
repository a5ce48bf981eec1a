"""The one oracle of the tests: docs/DESIGN.md's memory model written out from its words alone —
the cover, the pending order, the parts — and an independent model of one
memory built on it.

The invariant tests keep their own record of every note and summary they
wrote and compare the service against what this model derives from that
record. Nothing here imports the block arithmetic under test
(stash.core.blocks): the cover, the tile, the pending order, forget and zoom
are rewritten from the design's text so that a shared mistake cannot hide.
"""

from __future__ import annotations

import functools
import itertools
import re
import zlib

SINGLE = re.compile(r"#(\d+) (\d{4}-\d{2}-\d{2}) (.+)")
SUMMARY = re.compile(r"#(\d+)-(\d+) (.+)")

# The wake's closing words (awake marker) plus slack; used only to bound the
# byte-budget search, never as an exact expectation.
CLOSING_SLACK = 200


def bid(lo: int, hi: int) -> str:
    """docs/DESIGN.md, "Blocks and the tree": a block is written lo-(hi-1)."""
    return f"{lo}-{hi - 1}"


def parse_bid(text: str) -> tuple[int, int]:
    lo, last = text.split("-")
    return int(lo), int(last) + 1


def cost(line: str) -> int:
    """docs/DESIGN.md, "Wake": a line costs its UTF-8 bytes plus its newline."""
    return len(line.encode()) + 1


def spec_tile(T: int, a: float) -> list[tuple[int, int]]:
    """docs/DESIGN.md, "The cover", step 2, as a recursion over [0, R)."""
    R = 1
    while R < T:
        R *= 2
    kept: list[tuple[int, int]] = []

    def visit(lo: int, hi: int) -> None:
        if lo >= T:
            return  # dropped
        size = hi - lo
        if size > 1 and (hi > T or size > a * (T - lo)):
            mid = lo + size // 2
            visit(lo, mid)
            visit(mid, hi)
        else:
            kept.append((lo, hi))

    visit(0, R)
    return kept


@functools.lru_cache(maxsize=4096)
def _spec_cover(T: int, budget: int) -> tuple[tuple[int, int], ...]:
    if T <= budget:  # step 1 (T == 0 gives ())
        return tuple((i, i + 1) for i in range(T))
    lo, hi = 0.0, 1.0  # step 3
    # The tile changes only where a block's size equals a * (T - lo'), at a = size / (T - lo') with T - lo'
    # at most T: two such values differ by at least 1 / T², so once hi - lo is under that, no value lies
    # between the two ends but the least a that fits, and bisecting on would pick the same tile.
    for _ in range(60):
        if hi - lo < 1 / (T * T):
            break
        mid = (lo + hi) / 2
        if len(spec_tile(T, mid)) > budget:
            lo = mid
        else:
            hi = mid
    out = spec_tile(T, hi)
    while len(out) < budget:  # step 4: split the newest block larger than 1
        wide = [k for k, (a, b) in enumerate(out) if b - a > 1]
        if not wide:
            break
        k = wide[-1]
        a, b = out[k]
        m = (a + b) // 2
        out[k : k + 1] = [(a, m), (m, b)]
    return tuple(out)


def spec_cover(T: int, budget: int) -> list[tuple[int, int]]:
    """docs/DESIGN.md, "The cover", steps 1-4."""
    return list(_spec_cover(T, budget))


def oracle_pending(
    T: int, settled: set[tuple[int, int]], erased: frozenset[int] = frozenset()
) -> list[tuple[int, int]]:
    """Complete blocks without a summary, but for those whose every memory
    is erased (docs/DESIGN.md, "Erase": they need none): by size, then by
    position."""
    todo = []
    size = 2
    while size <= T:
        todo += [
            (lo, lo + size)
            for lo in range(0, T - size + 1, size)
            if (lo, lo + size) not in settled and not all_erased(lo, lo + size, erased)
        ]
        size *= 2
    return todo


def all_erased(lo: int, hi: int, erased: frozenset[int] | set[int]) -> bool:
    """docs/DESIGN.md, "Erase": a block whose every memory is erased."""
    return all(i in erased for i in range(lo, hi))


def oracle_batch(T: int, settled: set[tuple[int, int]], erased: frozenset[int], limit: int) -> list[tuple[int, int]]:
    """docs/DESIGN.md, "Blocks and the tree": the longest run of the first
    pending blocks whose sources are there before the batch: raw memories up
    to 16, else both halves summarised or wholly erased."""
    out = []
    for lo, hi in oracle_pending(T, settled, erased)[:limit]:
        mid = (lo + hi) // 2
        if hi - lo > 16 and not all((h in settled or all_erased(*h, erased)) for h in ((lo, mid), (mid, hi))):
            break
        out.append((lo, hi))
    return out


def oracle_parts(lines: list[str], max_lines: int, max_bytes: int) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for line in lines:
        cur = parts[-1]
        if cur and (len(cur) == max_lines or sum(map(cost, cur)) + cost(line) > max_bytes):
            parts.append([])
        parts[-1].append(line)
    return [p for p in parts if p]


def popcount(n: int) -> int:
    return bin(n).count("1")


def aligned_pow2(lo: int, hi: int) -> bool:
    size = hi - lo
    return size >= 1 and size & (size - 1) == 0 and lo % size == 0


def digest(source: list[str]) -> str:
    """What a worker writes into a summary so a reader can tell which source
    lines it was given."""
    return f"{zlib.crc32(chr(10).join(source).encode()):08x}"


class Model:
    """The test's own record of one memory: notes as ``(date, text)``,
    summaries keyed by ``(lo, hi)``, and what docs/DESIGN.md derives from them."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []
        self.summaries: dict[tuple[int, int], str] = {}
        self.erased: set[int] = set()
        self._gap: dict[int, int] = {}

    def erase(self, i: int) -> list[tuple[int, int]]:
        """docs/DESIGN.md, "Erase": the memory's text is gone and the summaries
        that contain it are dropped; returns them, smallest first."""
        self.erased.add(i)
        gone = sorted((b for b in self.summaries if b[0] <= i < b[1]), key=lambda b: (b[1] - b[0], b[0]))
        self.drop(gone)
        return gone

    def wholly_erased(self, lo: int, hi: int) -> bool:
        return all_erased(lo, hi, self.erased)

    def add_note(self, date: str, text: str) -> None:
        self.notes.append((date, text))

    def settle(self, block: tuple[int, int], text: str) -> None:
        assert block[1] <= self.T
        self.summaries[block] = text

    def drop(self, blocks: list[tuple[int, int]]) -> None:
        for lo, hi in blocks:
            del self.summaries[(lo, hi)]
            size = hi - lo
            self._gap[size] = min(self._gap.get(size, 0), lo // size)

    @property
    def T(self) -> int:
        return len(self.notes)

    def memory_line(self, i: int) -> str:
        date, text = self.notes[i]
        return f"#{i} {date} {'[erased]' if i in self.erased else text}"

    def render(self, block: tuple[int, int]) -> str:
        lo, hi = block
        if hi - lo == 1:
            return self.memory_line(lo)
        if self.wholly_erased(lo, hi):
            return f"#{bid(lo, hi)} [erased]"
        return f"#{bid(lo, hi)} {self.summaries[block]}"

    def _levels(self) -> list[int]:
        out, size = [], 2
        while size <= self.T:
            out.append(size)
            size *= 2
        return out

    def first_pending(self) -> tuple[int, int] | None:
        """docs/DESIGN.md, "Blocks and the tree": the complete block without a summary that comes first,
        smallest size first, then by position."""
        for size in self._levels():
            # _gap only remembers where the scan of this level stopped; the
            # truth is membership in self.summaries
            k = self._gap.get(size, 0)
            while (k * size, (k + 1) * size) in self.summaries or self.wholly_erased(k * size, (k + 1) * size):
                k += 1
            self._gap[size] = k
            if (k + 1) * size <= self.T:
                return k * size, (k + 1) * size
        return None

    def pending_count(self) -> int:
        """Complete blocks minus summaries (every summary is of a complete
        block) minus the wholly erased ones (none of which has a summary)."""
        erased = sum(1 for lo, hi in self.complete_blocks() if self.wholly_erased(lo, hi)) if self.erased else 0
        return sum(self.T // size for size in self._levels()) - len(self.summaries) - erased

    def complete_blocks(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        size = 2
        while size <= self.T:
            out.extend((lo, lo + size) for lo in range(0, self.T - size + 1, size))
            size *= 2
        return out

    def source(self, lo: int, hi: int) -> list[str]:
        """docs/DESIGN.md, "Nap": raw memories up to 16, else the halves' summaries."""
        if hi - lo <= 16:
            return [self.memory_line(i) for i in range(lo, hi)]
        mid = (lo + hi) // 2
        return [self.render((lo, mid)), self.render((mid, hi))]

    def forget_set(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """docs/DESIGN.md, "Forget": at each size from hi-lo up, the block containing lo and
        every later block of that level; smallest first."""
        size = hi - lo
        gone = [(a, b) for (a, b) in self.summaries if b - a >= size and a >= (lo // (b - a)) * (b - a)]
        return sorted(gone, key=lambda blk: (blk[1] - blk[0], blk[0]))

    def zoom(self, lo: int, hi: int) -> list[str]:
        """docs/DESIGN.md, "Zoom": each half as the wake would render it; a half wholly
        beyond T is omitted."""
        out = []
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            if a >= self.T:
                continue
            if b - a == 1:
                out.append(self.memory_line(a))
            elif b <= self.T and self.wholly_erased(a, b):
                out.append(f"#{bid(a, b)} [erased]")
            elif b <= self.T and (a, b) in self.summaries:
                out.append(f"#{bid(a, b)} {self.summaries[(a, b)]}")
            else:
                out.append(f"#{bid(a, b)} not compressed yet")
        return out


def parse_line(line: str) -> tuple[int, int, str | None, str]:
    """A rendered wake line back to ``(lo, hi, date, text)``."""
    m = SINGLE.fullmatch(line)
    if m:
        i = int(m.group(1))
        return i, i + 1, m.group(2), m.group(3)
    m = SUMMARY.fullmatch(line)
    assert m, f"not a wake line: {line!r}"
    return int(m.group(1)), int(m.group(2)) + 1, None, m.group(3)


def check_cover_shape(blocks: list[tuple[int, int]], T: int, budget: int) -> None:
    """The properties docs/DESIGN.md, "The cover", states of any cover, checked on its own."""
    pos = 0
    for lo, hi in blocks:
        assert lo == pos, f"gap or overlap at {lo} (expected {pos})"
        assert aligned_pow2(lo, hi), (lo, hi)
        assert hi <= T
        pos = hi
    assert pos == T, f"cover ends at {pos}, T={T}"
    assert len(blocks) <= max(budget, popcount(T)), (len(blocks), budget, T)
    sizes = [hi - lo for lo, hi in blocks]
    assert all(a >= b for a, b in itertools.pairwise(sizes)), "sizes grow toward the present"
    if T <= budget:
        assert sizes == [1] * T, "T within budget must be verbatim"


def check_nap(nap: dict | None, model: Model, entry_chars: int = 280) -> None:
    """A nap object is the model's first pending block, with its source."""
    first = model.first_pending()
    if first is None:
        assert nap is None, nap
        return
    assert nap is not None, f"{bid(*first)} is due but no nap was given"
    lo, hi = first
    assert nap["block"] == bid(lo, hi), (nap["block"], bid(lo, hi))
    assert nap["remaining"] == model.pending_count() - 1
    assert nap["max_bytes"] == entry_chars
    assert nap["source"] == model.source(lo, hi)
    assert bid(lo, hi) in nap["prompt"]


def expected_doc(model: Model, sizes: dict[str, int], doc: list[str]) -> tuple[list[str], int]:
    """The document docs/DESIGN.md, "Wake", allows for the model, and its line budget:
    ``cover(T, b)`` rendered, for the budget ``b`` reached by lowering
    WAKE_LINES one at a time while the rendered lines (plus closing words)
    exceed WAKE_CHARS. The closing words' exact length is not pinned down by
    the design, so a budget is accepted as skipped only if its lines alone come
    within a small slack of WAKE_CHARS."""
    T = model.T
    limit = sizes["WAKE_CHARS"]
    b = sizes["WAKE_LINES"]
    while True:
        want = [model.render(blk) for blk in spec_cover(T, b)]
        size = sum(cost(x) for x in want)
        if want == doc or b <= 1:
            assert b <= 1 or size <= limit, f"document of {size} bytes over WAKE_CHARS={limit}"
            return want, b
        assert size > limit - CLOSING_SLACK, f"lowered to fewer than {b} lines though {size} bytes fit {limit}"
        b -= 1


def collect_wake(mem, T: int | None = None) -> list[dict]:
    """Every part of one wake snapshot."""
    first = mem.wake(1, T)
    parts = [first]
    for k in range(2, first["parts"] + 1):
        parts.append(mem.wake(k, first["T"]))
    return parts


def check_parts(parts: list[dict], T: int, sizes: dict[str, int]) -> list[str]:
    """docs/DESIGN.md, "Wake", parts: numbered, same snapshot, awake on the last only,
    each within PART_LINES and PART_CHARS, filled greedily. Returns the
    document (every part's lines, in order)."""
    n = len(parts)
    for k, p in enumerate(parts, 1):
        assert p["T"] == T and p["part"] == k and p["parts"] == n, (p["T"], p["part"], p["parts"], T, k, n)
        assert p["awake"] is (k == n)
        if k < n:
            assert p["nap"] is None
        assert len(p["lines"]) <= sizes["PART_LINES"]
        assert sum(cost(x) for x in p["lines"]) <= sizes["PART_CHARS"]
        if k < n:
            nxt = parts[k]["lines"][0]
            assert (
                len(p["lines"]) == sizes["PART_LINES"]
                or sum(cost(x) for x in p["lines"]) + cost(nxt) > sizes["PART_CHARS"]
            ), "part not filled greedily"
    doc = [line for p in parts for line in p["lines"]]
    assert doc or T == 0
    assert all(p["lines"] for p in parts) or T == 0, "an empty part"
    return doc


def check_wake(mem, model: Model, sizes: dict[str, int]) -> tuple[list[str], int, int]:
    """The whole wake against the model: parts, cover shape, exact document,
    and the nap carried on the last part. Returns the document, how many parts
    it came in and the line budget it was rendered with."""
    T = model.T
    parts = collect_wake(mem)
    doc = check_parts(parts, T, sizes)
    want, budget = expected_doc(model, sizes, doc)
    blocks = [parse_line(x)[:2] for x in doc]
    check_cover_shape(blocks, T, budget)
    for line in doc:
        lo, hi, date, text = parse_line(line)
        if hi - lo == 1 and lo not in model.erased:
            assert (date, text) == model.notes[lo], (line, model.notes[lo])
        elif hi - lo > 1 and not model.wholly_erased(lo, hi):
            assert text == model.summaries.get((lo, hi)), (line, model.summaries.get((lo, hi)))
        else:
            assert line == model.render((lo, hi)), (line, model.render((lo, hi)))
    assert doc == want
    check_nap(parts[-1]["nap"], model, sizes["ENTRY_CHARS"])
    return doc, len(parts), budget


# ---------------------------------------------------------------- stored state


def load_model(mem) -> Model:
    """Read a whole store back into a model, checking on the way what must
    hold of any store: ids dense from 0 without duplicates, every row opens
    (no partial or torn row), every summary is of a complete block and each
    level is a dense prefix."""
    mf = mem.mf
    T = mf.count()
    # A table is made by its first row (schema.sql, "memory_on_use"): one never written to is not there.
    tables = {r[0] for r in mf.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ids = [r[0] for r in mf.conn.execute("SELECT id FROM log ORDER BY id")] if "log" in tables else []
    assert ids == list(range(T)), "log ids are not dense from 0"
    model = Model()
    for i, date, text in mf.memories(0, T):
        assert i == model.T
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), date
        model.add_note(date, text)
    stored = sorted(mf.conn.execute("SELECT size, idx FROM summaries")) if "summaries" in tables else []
    by_size: dict[int, list[int]] = {}
    for size, idx in stored:
        assert size >= 2 and size & (size - 1) == 0 and (idx + 1) * size <= T, (size, idx, T)
        by_size.setdefault(size, []).append(idx)
    for size, idxs in by_size.items():
        assert idxs == list(range(len(idxs))), f"level {size} is not a dense prefix"
        for idx in idxs:
            text = mf.summary(idx * size, (idx + 1) * size)
            assert text is not None
            model.settle((idx * size, (idx + 1) * size), text)
    return model


def check_summaries_match_sources(model: Model) -> None:
    """Every stored summary was written by a worker that names its block and
    the digest of the source it was given (``"lo-hi DIGEST label"``): the
    source the model derives from the store must have that digest. A summary
    of a larger block also needs both halves' summaries to exist."""
    for (lo, hi), text in model.summaries.items():
        block, dig, *_ = text.split(" ")
        assert block == bid(lo, hi), f"summary of {bid(lo, hi)} was written for {block}"
        if hi - lo > 16:
            for half in ((lo, (lo + hi) // 2), ((lo + hi) // 2, hi)):
                assert half in model.summaries, f"{bid(lo, hi)} is settled but its half {bid(*half)} is not"
        assert dig == digest(model.source(lo, hi)), f"summary of {bid(lo, hi)} was written from other lines"


def check_log_triggers(conn) -> None:
    """The append-only triggers exist and refuse an UPDATE and a DELETE of a
    real row (inside a transaction that is rolled back either way)."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'log'")}
    assert {"log_no_update", "log_no_delete"} <= names, names
    for sql in ("UPDATE log SET sealed = sealed WHERE id = 0", "DELETE FROM log WHERE id = 0"):
        conn.execute("BEGIN")
        try:
            conn.execute(sql)
            refused = ""
        except Exception as e:  # sqlite3 or sqlcipher3 IntegrityError
            refused = str(e)
        finally:
            conn.execute("ROLLBACK")
        assert "append-only" in refused, f"{sql!r} was not refused"


def answer_all(mem, model: Model, label: str = "parent") -> int:
    """Settle everything due in the worker format, following the model."""
    n = 0
    nap = mem.nap()["nap"]
    while nap is not None:
        check_nap(nap, model, mem.sizes["ENTRY_CHARS"])
        lo, hi = parse_bid(nap["block"])
        text = f"{nap['block']} {digest(model.source(lo, hi))} {label}"
        answer = mem.nap(nap["block"], text)
        assert answer["saved"] == nap["block"]
        model.settle((lo, hi), text)
        nap = answer["nap"]
        n += 1
    assert model.first_pending() is None
    return n
