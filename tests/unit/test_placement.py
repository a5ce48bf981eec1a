"""The placement file (stash/fleet/placement.py): what it accepts, what it
refuses and how each refusal names what to fix, the replica rule of a shard
given to another host, and an atomic write. The coverage check is held to an
oracle written from the definition (every first hex digit in exactly one
shard) over random sets of ranges."""

from __future__ import annotations

import json
import random
import stat
from pathlib import Path

import pytest

from stash.fleet import placement as pl
from stash.fleet.placement import Placement, PlacementError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "placement.example.json"
S3 = "?endpoint=https://s3.example.com"


def doc(**over) -> dict:
    base = {
        "epoch": 1,
        "router": {"site": "stash.example.com", "admin": "localhost:2019"},
        "hosts": {"a": "10.0.0.11:8080", "b": "10.0.0.12:8080", "c": "10.0.0.13:8080"},
        "shards": [
            {"digits": "0-7", "host": "a", "replica": f"s3://fleet/a/e1{S3}"},
            {"digits": "8-f", "host": "b", "replica": f"s3://fleet/b/e1{S3}"},
        ],
        "replica_root": f"s3://fleet{S3}",
    }
    base.update(over)
    return base


def refused(data) -> str:
    with pytest.raises(PlacementError) as caught:
        pl.parse(data)
    return str(caught.value)


def test_a_placement_says_who_holds_what() -> None:
    p = pl.parse(doc())
    assert p.held_by("a") == frozenset("01234567")
    assert p.held_by("b") == frozenset("89abcdef")
    assert p.held_by("c") == frozenset()  # a standby
    assert p.replica_of("a") == f"s3://fleet/a/e1{S3}" and p.replica_of("c") is None
    assert p.shard_of("7fffffffffffffff").host == "a" and p.shard_of("8000000000000000").host == "b"
    assert p.shard_of("A000000000000000").host == "b"
    with pytest.raises(PlacementError, match="'z'"):
        p.held_by("z")


def test_it_round_trips_through_its_file(tmp_path: Path) -> None:
    p = pl.parse(doc())
    path = tmp_path / "placement.json"
    path.write_text("old")
    pl.write(path, p)
    assert pl.load(path) == p
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [f.name for f in tmp_path.iterdir()] == ["placement.json"]  # no temporary file left
    assert json.loads(path.read_text()) == doc()


def test_the_example_parses() -> None:
    p = pl.load(EXAMPLE)
    assert p.epoch >= 1 and {s.host for s in p.shards} <= set(p.hosts)


@pytest.mark.parametrize(
    ("shards", "says"),
    [
        ([("0-7", "a"), ("a-f", "b")], "digits 8-9 are in no shard"),
        ([("0-7", "a"), ("9-f", "b")], "digit 8 is in no shard"),
        ([("0-3", "a"), ("3-f", "b")], "digit 3 is in shards 0-3 and 3-f"),
        ([("0-9", "a"), ("5-f", "b")], "digits 5-9 are in shards 0-9 and 5-f"),
        ([("0-f", "a"), ("8", "b")], "digit 8 is in shards 0-f and 8"),
    ],
)
def test_a_gap_or_an_overlap_is_refused_naming_the_digits(shards, says) -> None:
    replica = {"a": "/r/a", "b": "/r/b"}
    data = doc(shards=[{"digits": d, "host": h, "replica": replica[h]} for d, h in shards])
    assert says in refused(data)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {
                "shards": [
                    {"digits": "0-7", "host": "a", "replica": "/r/a"},
                    {"digits": "8-f", "host": "x", "replica": "/r/x"},
                ]
            },
            "shard 8-f names host 'x', which is not in hosts (a, b, c)",
        ),
        (
            {
                "shards": [
                    {"digits": "0-3", "host": "a", "replica": "/r/a1"},
                    {"digits": "4-7", "host": "a", "replica": "/r/a2"},
                    {"digits": "8-f", "host": "b", "replica": "/r/b"},
                ]
            },
            "host a's shards 0-3, 4-7 name 2 replicas",
        ),
        (
            {
                "shards": [
                    {"digits": "0-7", "host": "a", "replica": "/r/x"},
                    {"digits": "8-f", "host": "b", "replica": "/r/x"},
                ]
            },
            "hosts a, b share the replica /r/x",
        ),
        ({"epoch": 0}, "epoch is '0'"),
        ({"epoch": True}, "epoch is 'True'"),
        ({"epoch": "2"}, "epoch is '2'"),
        ({"hosts": {"A b": "10.0.0.1:80"}}, "host name 'A b'"),
        ({"hosts": {"a": "10.0.0.1"}}, "host a's address is '10.0.0.1'"),
        ({"hosts": {"a": "10.0.0.1:80 {"}}, "host a's address"),
        ({"router": {"site": "x.example } evil {", "admin": "localhost:2019"}}, "router's site"),
        ({"router": {"site": "x.example"}}, "router lacks admin"),
        ({"colour": "blue"}, "unknown field(s) 'colour'"),
        ({"replica_root": "relative/path"}, "replica_root is 'relative/path'"),
        ({"shards": [{"digits": "0-F", "host": "a", "replica": "/r/a"}]}, "shard digits '0-F'"),
        ({"shards": [{"digits": "7-0", "host": "a", "replica": "/r/a"}]}, "run backwards; write 0-7"),
        ({"shards": []}, "shards must be a list"),
        (
            {"shards": [{"digits": "0-f", "host": "a", "replica": "/r/a", "restoring": "/r/old"}]},
            "shard 0-f's restoring must be a list",
        ),
        (
            {"shards": [{"digits": "0-f", "host": "a", "replica": "/r/a", "restoring": ["old"]}]},
            "shard 0-f's restoring is 'old'",
        ),
        (
            {"shards": [{"digits": "0-f", "host": "a", "replica": "/r/a", "restoring": ["/r/a"]}]},
            "shard 0-f restores from its own replica /r/a",
        ),
    ],
)
def test_a_bad_placement_is_refused_naming_what_is_wrong(change, says) -> None:
    assert says in refused(doc(**change))


def test_not_json_is_refused() -> None:
    with pytest.raises(PlacementError, match=r"not JSON \(line 1, column 2\)"):
        pl.loads("{epoch: 1}")
    with pytest.raises(PlacementError, match="must be a JSON object"):
        pl.loads("[1]")


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match=r"cannot read the placement file .*gone\.json"):
        pl.load(tmp_path / "gone.json")


def test_a_shard_given_to_a_standby_gets_a_new_path_of_the_new_epoch() -> None:
    p = pl.parse(doc(epoch=4))
    moved = p.with_shard_on("0-7", "c")
    assert moved.epoch == 5
    assert moved.shard("0-7") == pl.Shard("0-7", "c", f"s3://fleet/c/e5{S3}")
    assert moved.shard("8-f") == p.shard("8-f")
    assert moved.held_by("a") == frozenset() and moved.held_by("c") == frozenset("01234567")
    assert p.epoch == 4  # the original is untouched


def test_a_shard_restoring_on_its_new_host_names_its_old_replicas_until_every_user_is_back(tmp_path: Path) -> None:
    p = pl.parse(doc())
    old = p.replica_of("a") or ""
    moved = p.with_shard_on("0-7", "c", restoring=(old,))
    assert moved.epoch == 2 and moved.shard("0-7").restoring == (old,)
    assert moved.restoring_on("c") == {d: "0-7" for d in "01234567"} and moved.restoring_on("b") == {}
    path = tmp_path / "placement.json"
    pl.write(path, moved)
    assert pl.load(path) == moved
    assert json.loads(path.read_text())["shards"][0]["restoring"] == [old]
    back = moved.with_shard_restored("0-7")
    assert back.epoch == 3 and back.shard("0-7").restoring == () and back.restoring_on("c") == {}
    assert "restoring" not in json.loads(pl.dumps(back))["shards"][0]
    # Given on again, the shard names the replica it left and the ones still restoring, newest first.
    again = moved.with_shard_on("0-7", "b", restoring=(moved.replica_of("c") or "", old))
    assert again.shard("0-7").restoring == (f"s3://fleet/c/e2{S3}", old)


def test_a_shard_given_to_a_host_that_holds_one_takes_its_replica() -> None:
    moved = pl.parse(doc()).with_shard_on("0-7", "b")
    assert moved.epoch == 2 and {s.replica for s in moved.shards} == {f"s3://fleet/b/e1{S3}"}
    assert moved.held_by("b") == frozenset(pl.HEX)


def test_a_folder_root_joins_a_path() -> None:
    p = pl.parse(doc(replica_root="/srv/replicas/"))
    assert p.with_shard_on("8-f", "c").replica_of("c") == "/srv/replicas/c/e2"


def test_moving_a_shard_is_refused_clearly() -> None:
    p = pl.parse(doc())
    with pytest.raises(PlacementError, match="on host a already"):
        p.with_shard_on("0-7", "a")
    with pytest.raises(PlacementError, match="no shard is '0-3'; the shards are 0-7, 8-f"):
        p.with_shard_on("0-3", "c")
    with pytest.raises(PlacementError, match="'z' is not in"):
        p.with_shard_on("0-7", "z")
    without = pl.parse({k: v for k, v in doc().items() if k != "replica_root"})
    with pytest.raises(PlacementError, match="add replica_root"):
        without.with_shard_on("0-7", "c")


# ---------------------------------------------------------------- the oracle


def oracle_runs(ints: list[int]) -> list[str]:
    """Maximal runs of consecutive digits, written as the placement writes them."""
    out, hexd = [], "0123456789abcdef"
    ints = sorted(set(ints))
    i = 0
    while i < len(ints):
        j = i
        while j + 1 < len(ints) and ints[j + 1] == ints[j] + 1:
            j += 1
        out.append(hexd[ints[i]] if i == j else f"{hexd[ints[i]]}-{hexd[ints[j]]}")
        i = j + 1
    return out


def oracle(ranges: list[tuple[int, int]]) -> list[str]:
    """From the definition: each digit 0..15 in exactly one range lo..hi. The
    texts a refusal must hold: each run of uncovered digits, and for each
    pair of ranges, each run of the digits both hold."""
    name = [f"{r[0]:x}" if r[0] == r[1] else f"{r[0]:x}-{r[1]:x}" for r in ranges]
    uncovered = [d for d in range(16) if not any(lo <= d <= hi for lo, hi in ranges)]
    out = []
    if uncovered:
        out.append(f"{', '.join(oracle_runs(uncovered))} {'are' if len(uncovered) > 1 else 'is'} in no shard")
    for i in range(len(ranges)):
        for j in range(i + 1, len(ranges)):
            both = [d for d in range(16) if ranges[i][0] <= d <= ranges[i][1] and ranges[j][0] <= d <= ranges[j][1]]
            if both:
                verb = "are" if len(both) > 1 else "is"
                out.append(f"{', '.join(oracle_runs(both))} {verb} in shards {name[i]} and {name[j]}")
    return out


def test_coverage_and_overlap_agree_with_the_oracle() -> None:
    rng = random.Random(45)
    valid = 0
    for _ in range(3000):
        if rng.random() < 0.3:  # a partition, sometimes nudged: the valid cases and their near misses
            cuts = sorted(rng.sample(range(1, 16), rng.randint(0, 6)))
            bounds = [0, *cuts, 16]
            ranges = [(bounds[k], bounds[k + 1] - 1) for k in range(len(bounds) - 1)]
            if rng.random() < 0.5:
                k = rng.randrange(len(ranges))
                lo, hi = ranges[k]
                lo = min(15, max(0, lo + rng.choice((-1, 1))))
                ranges[k] = (min(lo, hi), max(lo, hi))
        else:
            ends = [(rng.randrange(16), rng.randrange(16)) for _ in range(rng.randint(1, 5))]
            ranges = [(min(e), max(e)) for e in ends]
        hosts = {f"h{k}": f"10.0.0.{k + 1}:8080" for k in range(len(ranges))}
        shards = [
            {"digits": f"{lo:x}" if lo == hi else f"{lo:x}-{hi:x}", "host": f"h{k}", "replica": f"/r/h{k}"}
            for k, (lo, hi) in enumerate(ranges)
        ]
        expected = oracle(ranges)
        data = doc(hosts=hosts, shards=shards)
        if not expected:
            valid += 1
            p = pl.parse(data)
            for k, (lo, hi) in enumerate(ranges):
                assert p.held_by(f"h{k}") == frozenset(f"{d:x}" for d in range(lo, hi + 1))
            continue
        message = refused(data)
        for text in expected:
            assert text in message, (ranges, text, message)
        assert message.count(";") == len(expected) - 1, (ranges, message)
    assert valid > 300  # both sides of the check were exercised


def test_a_placement_is_a_value() -> None:
    p = pl.parse(doc())
    assert isinstance(p, Placement) and pl.parse(json.loads(pl.dumps(p))) == p
    with pytest.raises(AttributeError):
        p.epoch = 2  # type: ignore[misc]
