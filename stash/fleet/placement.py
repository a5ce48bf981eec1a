"""The fleet's placement: which host serves which shard of users, where each
host replicates, and the epoch that orders placements
(docs/DESIGN.md, "A fleet").

A shard is a range of first hex digits of the user id (``"0-7"``, ``"8"``,
``"9-b"``); the shards cover 0-f exactly once. Every host that holds shards
streams its whole ``users/`` folder to one replica, so every shard a host
holds names the same replica, and no two hosts share one. A host named in
``hosts`` that holds no shard is a standby.

Pure: parse, check and serialise, and read or write one file atomically.
Every refusal is a :class:`PlacementError` whose message says what to fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HEX = "0123456789abcdef"
_RANGE = re.compile(r"([0-9a-f])(?:-([0-9a-f]))?")
_HOST_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# host:port, the host a name, an IPv4 address or a bracketed IPv6 one: nothing a Caddyfile would read as syntax.
_ADDRESS = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")
_SITE = re.compile(r"(?:https?://)?[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})(?::[0-9]{1,5})?")
_REPLICA = re.compile(r"(?:s3|sftp|gs|abs|file)://\S+|/\S*")
FIELDS = ("epoch", "router", "hosts", "shards", "replica_root")
SHARD_FIELDS = ("digits", "host", "replica", "draining", "restoring")
ROUTER_FIELDS = ("site", "admin")


class PlacementError(ValueError):
    """A placement that cannot be used; the message says what to fix."""


def digits_of(text: str) -> frozenset[str]:
    """The first hex digits a shard's ``digits`` names: ``"0-7"``, ``"8"``, ``"9-b"``."""
    found = _RANGE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise PlacementError(f"shard digits {text!r} are not a hex digit or a range like 0-7 (lowercase)")
    lo, hi = HEX.index(found[1]), HEX.index(found[2] or found[1])
    if hi < lo:
        raise PlacementError(f"shard digits {text} run backwards; write {found[2]}-{found[1]}")
    return frozenset(HEX[lo : hi + 1])


def runs(digits: Iterable[str]) -> list[str]:
    """Digits as the fewest ranges, in order: {0,1,2,5} -> ["0-2", "5"]."""
    out: list[str] = []
    held = sorted({HEX.index(d) for d in digits})
    start = 0
    for i in range(1, len(held) + 1):
        if i == len(held) or held[i] != held[i - 1] + 1:
            lo, hi = held[start], held[i - 1]
            out.append(HEX[lo] if lo == hi else f"{HEX[lo]}-{HEX[hi]}")
            start = i
    return out


def _digits_phrase(digits: Iterable[str]) -> tuple[str, bool]:
    """("8-9", True) or ("3", False): the digits as text, and whether they are several."""
    held = set(digits)
    return ", ".join(runs(held)), len(held) > 1


@dataclass(frozen=True)
class Shard:
    digits: str  # as the file writes it: "0-7"
    host: str
    replica: str
    # Being moved to another host (`stash fleet move`): its host refuses its
    # writes, and says in /health once everything written is in the replica.
    draining: bool = False
    # Being restored onto its host (`stash fleet failover` or `move`): the
    # replicas, newest first, its users not yet back are read from. The host
    # serves the users already restored and asks the others to retry.
    restoring: tuple[str, ...] = ()

    @property
    def first_digits(self) -> frozenset[str]:
        return digits_of(self.digits)


@dataclass(frozen=True)
class Router:
    site: str  # the public name the router serves (its TLS certificate's)
    admin: str  # Caddy's admin address, host:port


@dataclass(frozen=True)
class Placement:
    epoch: int
    hosts: Mapping[str, str]  # name -> host:port where its `stash serve` listens
    shards: tuple[Shard, ...]
    router: Router
    replica_root: str | None = None  # where a host given its first shard replicates: <root>/<host>/e<epoch>

    def shard_of(self, user_id: str) -> Shard:
        """The shard a user belongs to, by the first hex digit of its id."""
        first = user_id[:1].lower()
        for shard in self.shards:
            if first in shard.first_digits:
                return shard
        raise PlacementError(f"user id {user_id[:16]!r} does not start with a hex digit")

    def shard(self, digits: str) -> Shard:
        """The shard written ``digits``; refused naming the shards there are."""
        for shard in self.shards:
            if shard.digits == digits:
                return shard
        raise PlacementError(f"no shard is {digits!r}; the shards are {', '.join(s.digits for s in self.shards)}")

    def _known(self, host: str) -> None:
        if host not in self.hosts:
            raise PlacementError(f"host {host!r} is not in the placement's hosts ({', '.join(self.hosts)})")

    def held_by(self, host: str) -> frozenset[str]:
        """The first digits of the users ``host`` serves (none: a standby)."""
        self._known(host)
        return frozenset(d for s in self.shards if s.host == host for d in s.first_digits)

    def replica_of(self, host: str) -> str | None:
        """Where ``host`` replicates its users (None: it holds no shard)."""
        self._known(host)
        return next((s.replica for s in self.shards if s.host == host), None)

    def with_shard_on(self, digits: str, host: str, restoring: tuple[str, ...] = ()) -> Placement:
        """This placement with shard ``digits`` given to ``host``, one epoch
        later, its users not yet back read from the replicas ``restoring``.
        The shard takes ``host``'s replica when it holds shards already;
        otherwise a new path of the new epoch under ``replica_root``, which
        nothing has written (the fence)."""
        shard = self.shard(digits)
        self._known(host)
        if shard.host == host:
            raise PlacementError(f"shard {digits} is on host {host} already")
        epoch = self.epoch + 1
        replica = self.replica_of(host)
        if replica is None:
            if self.replica_root is None:
                raise PlacementError(
                    f"host {host} holds no shard, so its replica would be under replica_root, which the "
                    "placement does not name; add replica_root"
                )
            replica = join(self.replica_root, f"{host}/e{epoch}")
        shards = tuple(
            replace(s, host=host, replica=replica, draining=False, restoring=restoring) if s is shard else s
            for s in self.shards
        )
        return check(replace(self, epoch=epoch, shards=shards))

    def with_shard_restored(self, digits: str) -> Placement:
        """This placement with every user of shard ``digits`` back on its host, one epoch later."""
        shard = self.shard(digits)
        shards = tuple(replace(s, restoring=()) if s is shard else s for s in self.shards)
        return check(replace(self, epoch=self.epoch + 1, shards=shards))

    def restoring_on(self, host: str) -> dict[str, str]:
        """The shards ``host`` holds whose users are still being restored: each first digit's shard."""
        self._known(host)
        return {d: s.digits for s in self.shards if s.host == host and s.restoring for d in s.first_digits}

    def with_shard_draining(self, digits: str) -> Placement:
        """This placement with shard ``digits`` draining on its host, one epoch later."""
        shard = self.shard(digits)
        shards = tuple(replace(s, draining=True) if s is shard else s for s in self.shards)
        return check(replace(self, epoch=self.epoch + 1, shards=shards))

    def draining_on(self, host: str) -> frozenset[str]:
        """The first digits of the shards ``host`` holds that are draining."""
        self._known(host)
        return frozenset(d for s in self.shards if s.host == host and s.draining for d in s.first_digits)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "router": {"site": self.router.site, "admin": self.router.admin},
            "hosts": dict(self.hosts),
            "shards": [
                {
                    "digits": s.digits,
                    "host": s.host,
                    "replica": s.replica,
                    **({"draining": True} if s.draining else {}),
                    **({"restoring": list(s.restoring)} if s.restoring else {}),
                }
                for s in self.shards
            ],
        }
        if self.replica_root is not None:
            out["replica_root"] = self.replica_root
        return out


def join(root: str, path: str) -> str:
    """``path`` under the replica ``root``, before its query (an s3 URL's ``?endpoint=``)."""
    base, sep, query = root.partition("?")
    return f"{base.rstrip('/')}/{path}{sep}{query}"


def _object(value: Any, what: str, fields: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PlacementError(f"{what} must be a JSON object")
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise PlacementError(
            f"{what} has unknown field(s) {', '.join(map(repr, unknown))}; its fields are {', '.join(fields)}"
        )
    missing = [k for k in required if k not in value]
    if missing:
        raise PlacementError(f"{what} lacks {', '.join(missing)}")
    return value


def _string(value: Any, what: str, pattern: re.Pattern[str], example: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise PlacementError(f"{what} is {str(value)[:80]!r}; write it like {example}")
    return value


def _port(address: str, what: str) -> None:
    found = _ADDRESS.fullmatch(address)
    if found is None or not 1 <= int(found[1]) <= 65535:
        raise PlacementError(f"{what} is {address[:80]!r}; write it like 10.0.0.11:8080")


def parse(data: Any) -> Placement:
    """The placement a JSON value (as :func:`json.loads` gives it) describes."""
    top = _object(data, "the placement", FIELDS, ("epoch", "router", "hosts", "shards"))
    epoch = top["epoch"]
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        raise PlacementError(f"epoch is {str(epoch)[:40]!r}; it must be a whole number from 1")
    r = _object(top["router"], "router", ROUTER_FIELDS, ROUTER_FIELDS)
    router = Router(
        _string(r["site"], "router's site", _SITE, "stash.example.com"),
        _string(r["admin"], "router's admin", _ADDRESS, "localhost:2019"),
    )
    _port(router.admin, "router's admin")
    if not isinstance(top["hosts"], dict) or not top["hosts"]:
        raise PlacementError('hosts must be a JSON object naming each host\'s address: {"a": "10.0.0.11:8080"}')
    hosts: dict[str, str] = {}
    for name, address in top["hosts"].items():
        if _HOST_NAME.fullmatch(name) is None:
            raise PlacementError(f"host name {name[:40]!r} must be lowercase letters, digits, - or _")
        if not isinstance(address, str):
            raise PlacementError(f"host {name}'s address must be a string like 10.0.0.11:8080")
        _port(address, f"host {name}'s address")
        hosts[name] = address
    if not isinstance(top["shards"], list) or not top["shards"]:
        raise PlacementError("shards must be a list of {digits, host, replica} covering the digits 0-f")
    shards = []
    for i, s in enumerate(top["shards"]):
        s = _object(s, f"shard {i + 1}", SHARD_FIELDS, SHARD_FIELDS[:3])
        digits_of(s["digits"])
        if not isinstance(s["host"], str):
            raise PlacementError(f"shard {s['digits']}'s host must be a host's name")
        replica = _string(s["replica"], f"shard {s['digits']}'s replica", _REPLICA, "s3://bucket/a/e1?endpoint=URL")
        draining = s.get("draining", False)
        if not isinstance(draining, bool):
            raise PlacementError(f"shard {s['digits']}'s draining must be true or false")
        restoring = s.get("restoring", [])
        if not isinstance(restoring, list):
            raise PlacementError(f"shard {s['digits']}'s restoring must be a list of replica URLs, newest first")
        sources = tuple(
            _string(r, f"shard {s['digits']}'s restoring", _REPLICA, "s3://bucket/a/e1?endpoint=URL") for r in restoring
        )
        shards.append(Shard(s["digits"], s["host"], replica, draining, sources))
    root = top.get("replica_root")
    if root is not None:
        root = _string(root, "replica_root", _REPLICA, "s3://bucket?endpoint=URL")
    return check(Placement(epoch, hosts, tuple(shards), router, root))


def problems(shards: tuple[Shard, ...], hosts: Mapping[str, str]) -> list[str]:
    """Every reason these shards cannot be a placement over these hosts."""
    out = []
    for shard in shards:
        if shard.replica in shard.restoring:
            out.append(f"shard {shard.digits} restores from its own replica {shard.replica}; name the old replica")
        if shard.host not in hosts:
            out.append(f"shard {shard.digits} names host {shard.host!r}, which is not in hosts ({', '.join(hosts)})")
    covered = set().union(*(s.first_digits for s in shards))
    missing = set(HEX) - covered
    if missing:
        text, several = _digits_phrase(missing)
        out.append(f"{'digits' if several else 'digit'} {text} {'are' if several else 'is'} in no shard")
    for i, a in enumerate(shards):
        for b in shards[i + 1 :]:
            both = a.first_digits & b.first_digits
            if both:
                text, several = _digits_phrase(both)
                out.append(
                    f"{'digits' if several else 'digit'} {text} {'are' if several else 'is'} in shards "
                    f"{a.digits} and {b.digits}"
                )
    replicas: dict[str, set[str]] = {}
    owners: dict[str, set[str]] = {}
    for shard in shards:
        replicas.setdefault(shard.host, set()).add(shard.replica)
        owners.setdefault(shard.replica, set()).add(shard.host)
    for host, named in replicas.items():
        if len(named) > 1:
            held = ", ".join(s.digits for s in shards if s.host == host)
            out.append(
                f"host {host}'s shards {held} name {len(named)} replicas; a host streams its whole users/ folder "
                "to one replica, so give them the same one"
            )
    for replica, users in owners.items():
        if len(users) > 1:
            out.append(f"hosts {', '.join(sorted(users))} share the replica {replica}; each host needs its own")
    return out


def check(placement: Placement) -> Placement:
    found = problems(placement.shards, placement.hosts)
    if found:
        raise PlacementError("; ".join(found))
    return placement


def loads(text: str | bytes) -> Placement:
    try:
        data = json.loads(text)
    except ValueError as e:
        where = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise PlacementError(f"the placement is not JSON{where}") from None
    return parse(data)


def dumps(placement: Placement) -> str:
    return json.dumps(placement.to_json(), indent=2) + "\n"


def load(path: Path) -> Placement:
    """The placement file at ``path``; its absence or unreadability is a PlacementError too."""
    try:
        text = Path(path).read_bytes()
    except OSError as e:
        raise PlacementError(f"cannot read the placement file {path} ({e.strerror or type(e).__name__})") from None
    return loads(text)


def write(path: Path, placement: Placement) -> None:
    """Replace the file at ``path`` with ``placement`` whole (0600, synced,
    renamed into place): a reader sees the old placement or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(dumps(placement))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
