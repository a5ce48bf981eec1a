"""The pure parts of ``stash import-optmem`` and ``stash export``: when to
settle while importing, and which archive members are refused.

The server's settling rule is simulated here from the words of docs/DESIGN.md,
"Blocks and the tree", alone:
pending blocks are the complete ones without a summary, by size smallest first,
then by position, and only the first may be answered."""

from __future__ import annotations

import io
import itertools
import random
import tarfile

import pytest

from stash.client import Failure, archive_members, import_stages

Tree = dict[int, list[str | None]]


def first_pending(T: int, settled: dict[int, set[int]]) -> tuple[int, int] | None:
    size = 2
    while size <= T:
        for k in range(T // size):
            if k not in settled.get(size, set()):
                return size, k
        size *= 2
    return None


def has(tree: Tree, size: int, k: int) -> bool:
    texts = tree.get(size, [])
    return k < len(texts) and texts[k] is not None


def simulate(T: int, tree: Tree, stops: list[int]) -> dict[int, set[int]]:
    """What a server following docs/DESIGN.md, "Blocks and the tree", ends up holding when the memories
    arrive in ``stops`` and each round answers what it asks while the folder
    has the text."""
    settled: dict[int, set[int]] = {}
    for t in stops:
        while (due := first_pending(t, settled)) is not None and has(tree, *due):
            settled.setdefault(due[0], set()).add(due[1])
    return settled


def memo_folder(rng: random.Random) -> tuple[int, Tree]:
    """A folder as OptMem leaves it: notes, naps in order, forgets (docs/DESIGN.md, "Forget")."""
    T = 0
    levels: dict[int, int] = {}  # size -> dense prefix length
    for _ in range(rng.randint(1, 40)):
        op = rng.random()
        if op < 0.4:
            T += rng.randint(1, 9)
        elif op < 0.85:
            for _ in range(rng.randint(0, 12)):
                due = first_pending(T, {s: set(range(n)) for s, n in levels.items()})
                if due is None:
                    break
                levels[due[0]] = levels.get(due[0], 0) + 1
        elif any(levels.values()):
            size = rng.choice([s for s, n in levels.items() if n])
            k = rng.randrange(levels[size])
            s = size
            while s in levels:
                levels[s] = min(levels[s], (k * size) // s)
                s *= 2
    T = max(T, 1)
    return T, {s: [f"summary {s}:{k}" for k in range(n)] for s, n in levels.items() if n}


def test_every_summary_of_an_optmem_folder_is_carried_over() -> None:
    rng = random.Random(20261129)
    for _ in range(400):
        T, tree = memo_folder(rng)
        stops = import_stages(T, tree)
        assert stops == sorted(set(stops)) and stops[-1] == T and stops[0] >= 1
        got = simulate(T, tree, stops)
        want = {s: set(range(len(texts))) for s, texts in tree.items()}
        assert got == want, (T, tree, stops)


def test_a_tail_still_due_does_not_cost_the_levels_above() -> None:
    # 40 memories, everything settled but the newest pair and what contains it:
    # importing all 40 first would stop at 38-39 before any size-4 block.
    T = 40
    tree: dict[int, list[str | None]] = {
        2: [f"a{k}" for k in range(19)],
        4: [f"b{k}" for k in range(9)],
        8: [f"c{k}" for k in range(4)],
        16: ["d0", "d1"],
        32: ["e0"],
    }
    assert sum(len(v) for v in simulate(T, tree, [T]).values()) == 19
    assert import_stages(T, tree) == [39, 40]
    assert simulate(T, tree, import_stages(T, tree)) == {s: set(range(len(v))) for s, v in tree.items()}


def test_summaries_that_cannot_be_carried_cost_no_extra_rounds() -> None:
    # 0-1 is missing, so it blocks every other summary whatever the schedule.
    tree: Tree = {2: [None, "x", "y"], 4: ["z"]}
    assert import_stages(7, tree) == [7]
    assert simulate(7, tree, [7]) == {}


def test_no_schedule_carries_more_for_any_small_folder() -> None:
    """Against every possible schedule, on folders OptMem could not even
    write (holes, summaries without their halves)."""
    rng = random.Random(7)
    for _ in range(300):
        T = rng.randint(2, 9)
        tree: Tree = {}
        size = 2
        while size <= T:
            tree[size] = [rng.choice([None, f"s{size}:{k}", f"s{size}:{k}"]) for k in range(rng.randint(0, T // size))]
            size *= 2
        planned = sum(len(v) for v in simulate(T, tree, import_stages(T, tree)).values())
        best = 0
        for r in range(T):
            for cut in itertools.combinations(range(1, T), r):
                best = max(best, sum(len(v) for v in simulate(T, tree, [*cut, T]).values()))
        assert planned == best, (T, tree)


def tar_gz(*members: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for m in members:
            if m.isfile():
                m.size = len(data)
                tar.addfile(m, io.BytesIO(data))
            else:
                tar.addfile(m)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    "bad",
    [
        member("/etc/passwd"),
        member("memory/../../outside"),
        member("../outside"),
        member("memory\\..\\outside"),
        member("C:/outside"),
        member("memory/LOG.txt", tarfile.SYMTYPE, "/etc/passwd"),
        member("memory/LOG.txt", tarfile.LNKTYPE, "README.txt"),
        member("memory/fifo", tarfile.FIFOTYPE),
    ],
)
def test_unsafe_archive_members_are_refused(bad: tarfile.TarInfo) -> None:
    with pytest.raises(Failure) as err:
        archive_members(tar_gz(member("README.txt"), bad))
    assert "nothing was written" in err.value.message


def test_plain_members_are_read_and_duplicates_refused() -> None:
    got = archive_members(
        tar_gz(member("README.txt"), member("./memory/LOG.txt"), member("memory/TREE", tarfile.DIRTYPE))
    )
    assert got == {"README.txt": b"x", "memory/LOG.txt": b"x"}
    with pytest.raises(Failure):
        archive_members(tar_gz(member("README.txt"), member("./README.txt")))
    with pytest.raises(Failure):
        archive_members(b"not a tar.gz")
