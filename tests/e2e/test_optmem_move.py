"""Moving in from OptMem and out to it, through the ``stash`` client against
a real server: ``stash import-optmem DIR`` and ``stash export DIR``.

OptMem folders are written here straight from the format (fixed-width records,
space padded, newline terminated), never by the export code; the wake they
should give is rendered from the oracle of
(docs/DESIGN.md, "The cover")."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.oracle import spec_cover
from tests.support.server import Cli, Http, Server, cli_env, path_with, python_bin, start_server

pytestmark = pytest.mark.slow

LOG_REC, TREE_REC = 320, 288


# ---------------------------------------------------------------- an OptMem folder, from the format


def record(text: str, width: int) -> bytes:
    raw = text.encode("utf-8")
    assert len(raw) <= width - 1
    return raw + b" " * (width - 1 - len(raw)) + b"\n"


def write_folder(
    path: Path, memories: list[tuple[str, str]], tree: dict[int, list[str]], config: str | None = None
) -> Path:
    (path / "TREE").mkdir(parents=True)
    (path / "LOG.txt").write_bytes(b"".join(record(f"#{i} {d} {t}", LOG_REC) for i, (d, t) in enumerate(memories)))
    for size, texts in tree.items():
        (path / "TREE" / str(size)).write_bytes(b"".join(record(t, TREE_REC) for t in texts))
    if config is not None:
        (path / "config").write_text(config, encoding="utf-8")
    return path


def dated(n: int, start: dt.date = dt.date(2020, 1, 1)) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        text = f"memory {i}: " + ("naïve café ☕ in İstanbul" if i % 7 == 0 else f"plain note number {i}")
        if i == 5:
            text = "x" * 270 + " é"  # a long one: 273 bytes
        out.append(((start + dt.timedelta(days=i // 3)).isoformat(), text))
    return out


def full_tree(T: int, missing: AbstractSet[tuple[int, int]] = frozenset()) -> dict[int, list[str]]:
    """A summary for every complete block but ``missing`` (size, index), each
    level a dense prefix as OptMem keeps it (so only a tail may be missing)."""
    tree: dict[int, list[str]] = {}
    size = 2
    while size <= T:
        texts = []
        for k in range(T // size):
            if (size, k) in missing:
                break
            texts.append(f"summary of {k * size}-{(k + 1) * size - 1} ✓" + (" y" * 120 if k == 1 else ""))
        if texts:
            tree[size] = texts
        size *= 2
    return tree


def expected_line(memories, tree, lo: int, hi: int) -> str | None:
    if hi - lo == 1:
        date, text = memories[lo]
        return f"#{lo} {date} {text}"
    texts = tree.get(hi - lo, [])
    k = lo // (hi - lo)
    return f"#{lo}-{hi - 1} {texts[k]}" if k < len(texts) else None


# ---------------------------------------------------------------- a server of our own, with cheap key derivation


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # These tests make about two thousand authenticated requests; the
    # cheapest argon2id the server accepts keeps them to seconds.
    with start_server(tmp_path_factory.mktemp("optmem-server"), *CHEAP_KDF_FLAGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def web(fast: Server) -> Iterator[Http]:
    h = Http(fast.url)
    yield h
    h.close()


@pytest.fixture(scope="module")
def run(fast: Server, tmp_path_factory: pytest.TempPathFactory):
    """The client as ``python -m stash`` with a given token."""
    path = path_with(python_bin(tmp_path_factory.mktemp("bin")))

    def call(tok: str, *args: str) -> subprocess.CompletedProcess:
        return Cli([sys.executable, "-m", "stash"], cli_env(fast.url, tok, path)).run(*args)

    return call


def wake(web: Http, tok: str) -> tuple[list[str], dict | None]:
    first = web.ok("GET", "/wake", tok)
    lines, last = list(first["lines"]), first
    for k in range(2, first["parts"] + 1):
        last = web.ok("GET", "/wake", tok, params={"part": k, "T": first["T"]})
        lines += last["lines"]
    assert last["awake"]
    return lines, last["nap"]


def blocks_of(T: int, smallest: int = 2) -> list[str]:
    out, size = [], smallest
    while size < 2 * T:
        out += [f"{lo}-{lo + size - 1}" for lo in range(0, T, size)]
        size *= 2
    return out


def held(web: Http, tok: str) -> int:
    return web.ok("GET", "/wake", tok)["T"]


# ---------------------------------------------------------------- moving in from an OptMem folder


def test_import_optmem_moves_a_folder_in_whole(run, web: Http, tmp_path: Path) -> None:
    T = 152
    memories = dated(T)
    # Everything settled but the newest pair, and the blocks that contain it.
    tree = full_tree(T, missing={(2, 75), (4, 37), (8, 18)})
    config = (
        "# OptMem sizes for this memory. A commented line means: follow the\n"
        "# tool's default.\n\n"
        "WAKE_LINES   = 40     # the memory context: how many lines wake prints\n"
        "# WAKE_CHARS   = 1000000 # the memory context: how many bytes wake prints\n"
        "# ENTRY_CHARS  = 280    # the longest one memory may be, in bytes\n"
        "PART_CHARS   = 100000 # output paging: largest part, in bytes\n"
        "PART_LINES   = 15     # output paging: largest part, in lines\n"
    )
    folder = write_folder(tmp_path / "memory", memories, tree, config)
    tok = web.init()["token"]

    done = run(tok, "import-optmem", str(folder))
    assert done.returncode == 0, done.stderr
    carried = sum(map(len, tree.values()))
    assert done.stdout.splitlines()[:3] == [
        f"Imported {T} notes, #0 to #{T - 1}, with their dates.",
        f"Carried over {carried} of the folder's {carried} summaries; 3 compressions are due.",
        "Sizes carried over: WAKE_LINES=40, PART_CHARS=100000, PART_LINES=15.",
    ]

    # Every date and text, word for word.
    want = [expected_line(memories, tree, i, i + 1) for i in range(T)]
    found = web.ok("POST", "/recall", tok, json={"q": "."})
    assert (found["matches"], found["total"], found["more"]) == (want, T, None)
    # Every summary, seen from the block above it; the missing ones are due.
    for block in blocks_of(T, smallest=4):
        lo, last = map(int, block.split("-"))
        got = web.ok("GET", "/zoom", tok, params={"block": block})["lines"]
        halves = [(lo, (lo + last + 1) // 2), ((lo + last + 1) // 2, last + 1)]
        assert got == [
            expected_line(memories, tree, a, b) or f"#{a}-{b - 1} not compressed yet" for a, b in halves if a < T
        ], block
    # The wake: the design's cover of the folder, in parts of 15 lines, and the first missing block is due.
    cover = spec_cover(T, 40)
    expected = [expected_line(memories, tree, lo, hi) for lo, hi in cover]
    assert None not in expected, "the folder must hold every summary its wake needs"
    lines, nap = wake(web, tok)
    assert lines == expected
    assert web.ok("GET", "/wake", tok)["parts"] == 3
    assert nap is not None and nap["block"] == "150-151" and nap["remaining"] == 2
    sizes = web.ok("GET", "/config", tok)["sizes"]
    assert (sizes["WAKE_LINES"], sizes["PART_CHARS"], sizes["PART_LINES"], sizes["ENTRY_CHARS"]) == (
        40,
        100000,
        15,
        280,
    )

    # A memory that is not empty is refused, and left as it was.
    again = run(tok, "import-optmem", str(folder))
    assert again.returncode == 1 and "not empty" in again.stderr
    assert held(web, tok) == T


def small_folder(path: Path) -> Path:
    return write_folder(path, dated(8), full_tree(8))


def cut(path: Path, name: str, start: int, end: int, insert: bytes = b"") -> None:
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[:start] + insert + data[end:])


def put_record(path: Path, i: int, text: str) -> None:
    cut(path, "LOG.txt", i * LOG_REC, (i + 1) * LOG_REC, record(text, LOG_REC))


MALFORMED = {
    "short record": (
        lambda p: cut(p, "LOG.txt", 3 * LOG_REC + 300, 4 * LOG_REC - 1),
        "LOG.txt record #3 (bytes 960 to 1279) is not one 320-byte line",
    ),
    "bad date": (
        lambda p: put_record(p, 2, "#2 2021-02-30 the 30th of February"),
        "LOG.txt record #2 (bytes 640 to 959): 2021-02-30 is not a real calendar date",
    ),
    "no LOG.txt": (lambda p: (p / "LOG.txt").unlink(), "holds no LOG.txt, nor memory/LOG.txt"),
    "summary of an incomplete block": (
        lambda p: (p / "TREE" / "4").write_bytes((p / "TREE" / "4").read_bytes() + record("too early", TREE_REC)),
        "TREE/4 holds 3 summaries, but the log's 8 notes complete only 2 blocks of 4: record 2 would be "
        "block 8-11, which is not complete",
    ),
    "interrupted last write": (
        lambda p: cut(p, "LOG.txt", 8 * LOG_REC, 8 * LOG_REC, b"#8 2020-01-03 half"),
        "LOG.txt record #8 (bytes 2560 to 2577) is cut short",
    ),
    "dates out of order": (
        lambda p: put_record(p, 6, "#6 2019-12-31 before its neighbours"),
        "LOG.txt record #6 (bytes 1920 to 2239): 2019-12-31 is earlier than the note before it",
    ),
    "misnumbered record": (
        lambda p: put_record(p, 4, "#5 2020-01-02 wrong number"),
        "LOG.txt record #4 (bytes 1280 to 1599) is numbered #5",
    ),
    "tab in a memory": (lambda p: put_record(p, 1, "#1 2020-01-01 a\ttab"), "control character U+0009"),
    "future date": (lambda p: put_record(p, 7, "#7 2999-01-01 from the future"), "2999-01-01 is in the future"),
    "odd level": (lambda p: (p / "TREE" / "3").write_bytes(record("odd", TREE_REC)), "TREE/3 is not a level"),
    "bad config": (
        lambda p: (p / "config").write_text("WAKE_LINES = lots\n"),
        "config line 1: WAKE_LINES must be a positive whole number",
    ),
    "bad summary": (
        lambda p: cut(p, "TREE/2", 0, TREE_REC, b"\xff" * (TREE_REC - 1) + b"\n"),
        "TREE/2 record 0 (block 0-1) is not UTF-8 text",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_folder_is_refused_before_anything_is_sent(case: str, run, web: Http, tmp_path: Path) -> None:
    spoil, message = MALFORMED[case]
    folder = small_folder(tmp_path / "memory")
    spoil(folder)
    tok = web.init()["token"]
    done = run(tok, "import-optmem", str(folder))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and "Nothing was imported" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout
    assert held(web, tok) == 0


def test_the_unspoilt_folder_imports(run, web: Http, tmp_path: Path) -> None:
    """The malformed cases above fail for their spoiling alone."""
    tok = web.init()["token"]
    done = run(tok, "import-optmem", str(small_folder(tmp_path / "memory")))
    assert done.returncode == 0, done.stderr
    assert "Carried over 7 of the folder's 7 summaries; 0 compressions are due." in done.stdout
    assert held(web, tok) == 8


# ---------------------------------------------------------------- out to a folder and back in


@pytest.fixture(scope="module")
def source(web: Http) -> str:
    """A memory of 304 memories with an erased one, summaries with a tail
    still due, and sizes of its own."""
    tok = web.init()["token"]
    memories = dated(300)
    web.ok("POST", "/import", tok, json={"entries": [{"date": d, "text": t} for d, t in memories]})
    web.ok("POST", "/erase", tok, json={"ids": [37]})
    nap = web.ok("POST", "/nap", tok, json={})["nap"]
    while nap:
        text = f"summary of {nap['block']}" + (" long" * 50 if nap["block"] == "2-3" else "")
        nap = web.ok("POST", "/nap", tok, json={"block": nap["block"], "text": text})["nap"]
    web.ok("POST", "/import", tok, json={"entries": [{"date": "2021-06-01", "text": f"late {i}"} for i in range(4)]})
    web.ok("POST", "/nap", tok, json={"block": "300-301", "text": "the first late pair"})
    # ENTRY_CHARS below the longest memory and summary already written.
    # WAKE_CHARS, which OptMem does not read, travels in the manifest only.
    web.ok("POST", "/config", tok, json={"WAKE_LINES": 50, "PART_LINES": 20, "ENTRY_CHARS": 200, "WAKE_CHARS": 50_000})
    return tok


@pytest.fixture(scope="module")
def exported(source: str, run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("exports") / "out"
    done = run(source, "export", str(target))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Exported to {target}: 304 notes (1 erased), ")
    assert sorted(p.name for p in target.iterdir()) == ["README.txt", "manifest.json", "memory"]
    return target


def test_round_trip_agrees_everywhere(source: str, exported: Path, run, web: Http) -> None:
    lines, nap = wake(web, source)
    assert nap is not None and nap["block"] == "302-303"

    other = web.init()["token"]
    done = run(other, "import-optmem", str(exported))
    assert done.returncode == 0, done.stderr
    doc = json.loads((exported / "manifest.json").read_text())
    total = sum(doc["summaries"].values())
    assert (
        f"Carried over {total} of the folder's {total} summaries; {doc['pending']} compressions are due." in done.stdout
    )
    assert ", 1 of them erased again." in done.stdout

    assert wake(web, other) == (lines, nap)
    assert web.ok("GET", "/wake", other)["parts"] > 1
    assert web.ok("GET", "/config", other) == web.ok("GET", "/config", source)
    # Zooming every block of 4 or more shows every summary (the memories themselves: recall below).
    for block in blocks_of(304, smallest=4):
        assert web.ok("GET", "/zoom", other, params={"block": block}) == web.ok(
            "GET", "/zoom", source, params={"block": block}
        ), block
    for q in (".", "erased", r"memory 1\d:", "CAFÉ|istanbul", "^#3[0-9] ", "late"):
        mine = web.ok("POST", "/recall", source, json={"q": q})
        assert 0 < len(mine["matches"]) == mine["total"] and web.ok("POST", "/recall", other, json={"q": q}) == mine, q
    assert [r["ids"] for r in web.ok("GET", "/erasures", other)["erasures"]] == [[37]]
    # The strongest check: the new memory exports the very same content.
    again = run(other, "export", str(exported.parent / "again"))
    assert again.returncode == 0, again.stderr
    assert (exported.parent / "again" / "manifest.json").read_bytes() == (exported / "manifest.json").read_bytes()


def test_the_manifest_checks_out_with_coreutils_alone(exported: Path) -> None:
    doc = json.loads((exported / "manifest.json").read_text())
    command = "find . -type f ! -name manifest.json | sed 's|^\\./||' | LC_ALL=C sort | xargs sha256sum | sha256sum"
    done = subprocess.run(["/bin/sh", "-c", command], cwd=exported, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == doc["digest"]
    for f in doc["files"]:
        data = (exported / f["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (f["bytes"], f["sha256"])
    assert {f["path"] for f in doc["files"]} == {
        "README.txt",
        "memory/LOG.txt",
        "memory/config",
        *(f"memory/TREE/{s}" for s in doc["summaries"]),
    }


def spoil_summary(root: Path) -> None:
    data = bytearray((root / "memory" / "TREE" / "2").read_bytes())
    data[0] ^= 0x01
    (root / "memory" / "TREE" / "2").write_bytes(bytes(data))


def spoil_digest(root: Path) -> None:
    doc = json.loads((root / "manifest.json").read_text())
    doc["digest"] = "0" * 64
    (root / "manifest.json").write_text(json.dumps(doc))


def drop_member(root: Path) -> None:
    (root / "README.txt").unlink()


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (spoil_summary, "stash: memory/TREE/2 does not match manifest.json"),
        (spoil_digest, "stash: the digest in manifest.json does not match its list of files"),
        (drop_member, "stash: README.txt is listed in manifest.json but missing"),
    ],
)
def test_a_tampered_export_fails_its_check(spoil, message: str, exported: Path, run, web: Http, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    spoil(copy)
    tok = web.init()["token"]
    done = run(tok, "import-optmem", str(copy))
    assert done.returncode == 1
    assert done.stderr.startswith(message) and "Nothing was imported." in done.stderr, done.stderr
    assert held(web, tok) == 0


def test_erased_memories_take_the_owner(exported: Path, run, web: Http) -> None:
    owner = web.init()["token"]
    full = web.ok("POST", "/grants", owner, json={"scope": "full"})["token"]
    done = run(full, "import-optmem", str(exported))
    assert done.returncode == 1
    assert "1 erased note (#37 first); re-creating it erased takes the owner's token" in done.stderr
    assert held(web, owner) == 0


def test_export_to_a_folder_refuses_to_mix_unless_forced(source: str, run, tmp_path: Path) -> None:
    target = tmp_path / "busy"
    (target / "memory" / "TREE").mkdir(parents=True)
    (target / "memory" / "TREE" / "4096").write_text("stale")
    (target / "notes.txt").write_text("mine")
    refused = run(source, "export", str(target))
    assert refused.returncode == 2 and "is not empty" in refused.stderr and "--force" in refused.stderr
    assert (target / "memory" / "TREE" / "4096").exists()
    forced = run(source, "export", "--force", str(target))
    assert forced.returncode == 0, forced.stderr
    # What the export holds is replaced whole; what it does not name stays.
    assert not (target / "memory" / "TREE" / "4096").exists()
    assert (target / "notes.txt").read_text() == "mine"
    assert not [p for p in target.iterdir() if p.name.startswith(".stash-export-")]
    assert (target / "memory" / "LOG.txt").stat().st_size == 304 * LOG_REC
