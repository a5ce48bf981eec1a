"""``stash fleet failover`` and ``stash fleet move``: give a shard to another
host, from its users' replica in object storage (docs/DESIGN.md, "A fleet").

Both run where the receiving host's data folder is, and follow one order,
so that a step cut short is finished by running the command again:

1. read the shard's users from its replica (the roster), retrying while the
   bucket does not answer, and bring each back with ``stash restore``'s code
   into ``DATA/.incoming/``: outside ``users/``, which Litestream watches
   (its watcher picked up a restore's staging copies there, and missed a
   user folder moved in whole);
2. check every user as ``stash verify`` does; any failure stops here and
   changes nothing the fleet serves;
3. move the users into ``users/`` (the receiving host does not serve them
   yet: the placement does not give it their shard);
4. write the placement one epoch later with the shard on the receiving
   host, replicating under a path no host has written (the fence). Every
   host watches the file: the receiver serves the shard and starts
   Litestream over its new users; a host that held the shard moves its
   copies out of ``users/``;
5. wait until the receiver says it serves that epoch, then switch the
   router (Caddy's admin API).

A move first *drains* the shard on the host that holds it: a placement
epoch marks it moving, the host refuses its writes (503, retry later),
waits for the writes in flight, lets Litestream ship everything, and says
so in ``/health``; then the steps above run from its replica.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..service.ops import replica
from ..storage.layout import USER_ID
from . import placement as places
from . import router
from .placement import Placement, PlacementError

INCOMING = ".incoming"
RELEASED = "released"
ADOPTED = "placement.json"
# How often a step that needs the bucket (or Caddy) is tried before the
# command refuses, and the pause before the first retry (doubled each time).
ATTEMPTS = 5
FIRST_PAUSE_S = 0.5
# How long the receiving host (or the draining one) may take to adopt an epoch.
ADOPT_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 45.0
POLL_S = 0.1
RESTORE_JOBS = 8
PROBE_TIMEOUT_S = 3.0


class FleetError(RuntimeError):
    """The command stopped; the message says what happened and what to do."""


@dataclass
class Outcome:
    placement: Placement
    users: list[str] = field(default_factory=list)
    already: bool = False
    restore_s: float = 0.0
    took_s: float = 0.0


Say = Callable[[str], None]
T = TypeVar("T")


def _quiet(_: str) -> None:
    pass


def failover(
    placement_file: Path, digits: str, standby: str, data_dir: Path, *, attempts: int = ATTEMPTS, say: Say = _quiet
) -> Outcome:
    """Give shard ``digits`` to ``standby``, whose data folder is ``data_dir``,
    from the shard's replica; the host that held it is presumed dead."""
    started = time.monotonic()
    now = _current(placement_file, data_dir)
    shard = now.shard(digits)
    if shard.host == standby:
        say(f"shard {digits} is on {standby} already (placement epoch {now.epoch}); checking the router")
        _settle(now, standby, say)
        return Outcome(now, already=True, took_s=time.monotonic() - started)
    now.held_by(standby)  # a host the placement knows
    return _give(placement_file, now, digits, standby, data_dir, attempts, say, started)


def move(
    placement_file: Path,
    digits: str,
    source: str,
    dest: str,
    data_dir: Path,
    *,
    attempts: int = ATTEMPTS,
    say: Say = _quiet,
) -> Outcome:
    """Move shard ``digits`` from the live host ``source`` to ``dest``, whose
    data folder is ``data_dir``: drain it on ``source``, then give it to
    ``dest`` from the replica ``source`` finished shipping."""
    started = time.monotonic()
    now = _current(placement_file, data_dir)
    shard = now.shard(digits)
    if shard.host == dest and not shard.draining:
        say(f"shard {digits} is on {dest} already (placement epoch {now.epoch}); checking the router")
        _settle(now, dest, say)
        return Outcome(now, already=True, took_s=time.monotonic() - started)
    if shard.host != source:
        raise FleetError(f"shard {digits} is on {shard.host}, not {source} (placement epoch {now.epoch})")
    for attempt in range(1, attempts + 1):
        if not shard.draining or attempt > 1:
            # A new epoch: a drain whose final sync failed is run again by the host.
            now = now.with_shard_draining(digits)
            places.write(placement_file, now)
            say(f"placement epoch {now.epoch}: shard {digits} drains on {source}")
        if _wait_drained(now, source, digits):
            break
        if attempt == attempts:
            raise FleetError(
                f"{source} could not ship shard {digits}'s last writes to its replica in {attempts} drains (is the "
                "bucket reachable?); the shard stays draining there: run the move again once the bucket answers"
            )
        say(f"{source} could not ship the shard's last writes (is the bucket reachable?); draining again")
    say(f"{source} drained shard {digits}: its writes are in the replica")
    done = _give(placement_file, now, digits, dest, data_dir, attempts, say, started)
    try:  # the source lets go: it serves none of the shard from now on
        _adopted(done.placement, source)
    except FleetError as e:
        say(f"the shard is on {dest}, but {e}")
    return done


def _current(placement_file: Path, data_dir: Path) -> Placement:
    """The placement file, refused when the receiving host has adopted a newer one."""
    try:
        now = places.load(placement_file)
    except PlacementError as e:
        raise FleetError(f"{placement_file}: {e}") from None
    adopted = Path(data_dir) / ADOPTED
    if adopted.is_file():
        try:
            seen = places.load(adopted).epoch
        except PlacementError:
            seen = 0
        if seen > now.epoch:
            raise FleetError(
                f"this host has adopted placement epoch {seen}, newer than {placement_file}'s {now.epoch}: "
                "run the command with the newest placement"
            )
    return now


def _give(
    placement_file: Path,
    now: Placement,
    digits: str,
    host: str,
    data_dir: Path,
    attempts: int,
    say: Say,
    started: float,
) -> Outcome:
    shard = now.shard(digits)
    target = _target(shard.replica)
    data_dir = Path(data_dir)
    incoming = data_dir / INCOMING / f"e{now.epoch + 1}"
    t0 = time.monotonic()
    _clear(data_dir / INCOMING)  # what a cut run left
    incoming.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        # The roster is read in here too: the host's own roster.db (its replica's list) is not the shard's.
        users = _retry(attempts, say, "read the replica's roster", lambda: _shard_users(target, shard, incoming))
        say(f"{len(users)} user(s) of shard {digits} in {shard.replica}")
        _restore_all(target, users, incoming, attempts, say)
        restore_s = time.monotonic() - t0
        _move_in(users, incoming, data_dir)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
    after = now.with_shard_on(digits, host)
    places.write(placement_file, after)
    say(f"placement epoch {after.epoch}: shard {digits} on {host}, replicating to {after.replica_of(host)}")
    _settle(after, host, say)
    return Outcome(after, users, restore_s=restore_s, took_s=time.monotonic() - started)


def _clear(folder: Path) -> None:
    """Empty ``folder`` of everything a cut run restored into it."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _target(url: str) -> replica.Target:
    try:
        return replica.Target.parse(url)
    except replica.ReplicaError as e:
        raise FleetError(f"the shard's replica {url}: {e}") from None


def _reachable(target: replica.Target) -> None:
    """Refuse at once when the bucket's server does not answer: Litestream's
    own S3 client retries for about a minute before it says anything."""
    endpoint = target.endpoint
    if endpoint is not None and not replica.answers(endpoint, PROBE_TIMEOUT_S):
        raise replica.ReplicaError(f"the bucket's server at {endpoint} does not answer")


def _shard_users(target: replica.Target, shard: places.Shard, work: Path) -> list[str]:
    _reachable(target)
    return sorted(u for u, _cipher in replica.replica_users(target, work) if u[:1] in shard.first_digits)


def _retry(attempts: int, say: Say, what: str, step: Callable[[], T]) -> T:
    pause = FIRST_PAUSE_S
    for attempt in range(1, attempts + 1):
        try:
            return step()
        except (replica.ReplicaError, router.RouterError, OSError) as e:
            if attempt == attempts:
                raise FleetError(
                    f"could not {what} after {attempts} attempts ({e}); nothing the fleet serves was changed: "
                    "run the command again once it answers"
                ) from None
            say(f"could not {what} ({e}); trying again in {pause:.1f} s")
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


def _restore_all(target: replica.Target, users: list[str], incoming: Path, attempts: int, say: Say) -> None:
    """Every user restored into ``incoming/users/`` and checked; a user that
    fails is tried again (the bucket may have dropped a request), then the
    command stops."""
    left = list(users)
    problems: dict[str, str] = {}
    for attempt in range(1, attempts + 1):
        _retry(attempts, say, "reach the replica", lambda: _reachable(target))
        with ThreadPoolExecutor(RESTORE_JOBS) as pool:
            done = list(pool.map(lambda u: replica.restore_user(target, u, incoming), left))
        problems = {}
        for d in done:
            if d.ok and not d.left:
                continue
            why = d.problem or "; ".join([*(d.report.problems if d.report else []), *d.left]) or "not whole"
            problems[d.user_id] = why
            shutil.rmtree(incoming / "users" / d.user_id, ignore_errors=True)
        if not problems:
            return
        left = sorted(problems)
        if attempt < attempts:
            say(f"{len(left)} user(s) did not come back whole; trying them again")
            time.sleep(FIRST_PAUSE_S * attempt)
    shown = "; ".join(f"{u}: {why}" for u, why in sorted(problems.items())[:5])
    raise FleetError(
        f"{len(problems)} user(s) of the shard did not come back whole from the replica ({shown}); nothing the "
        "fleet serves was changed: run stash restore and stash verify on them to see why"
    )


def _move_in(users: list[str], incoming: Path, data_dir: Path) -> None:
    """Each restored user into ``users/``; a folder already there (a run cut
    short, or the receiver's own stale copy) is moved aside, never deleted."""
    home = data_dir / "users"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    aside = data_dir / RELEASED / f"replaced-{time.strftime('%Y%m%dT%H%M%S')}"
    for user_id in users:
        assert USER_ID.fullmatch(user_id)
        dest = home / user_id
        if dest.exists():
            aside.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.rename(dest, aside / user_id)
        os.rename(incoming / "users" / user_id, dest)
    fd = os.open(home, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _health(address: str) -> dict[str, object]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address}/health", timeout=5) as answer:
        body = json.loads(answer.read())
    return body if isinstance(body, dict) else {}


def _wait_for(address: str, host: str, ok: Callable[[dict[str, object]], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    said: dict[str, object] = {}
    while time.monotonic() < deadline:
        try:
            said = _health(address)
            if ok(said):
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(POLL_S)
    raise FleetError(
        f"{host} ({address}) did not {what} within {timeout:.0f} s (it last said placement epoch "
        f"{said.get('placement_epoch')}): is its stash serve running with --placement on this file? "
        "Run the command again once it is"
    )


def _adopted(now: Placement, host: str) -> None:
    """Wait for ``host`` to serve by ``now``'s epoch (or a later one)."""
    _wait_for(
        now.hosts[host],
        host,
        lambda h: isinstance(h.get("placement_epoch"), int) and int(str(h["placement_epoch"])) >= now.epoch,
        ADOPT_TIMEOUT_S,
        f"adopt placement epoch {now.epoch}",
    )


def _settle(now: Placement, host: str, say: Say) -> None:
    """Wait for ``host`` to serve ``now``'s epoch, then give the router ``now``."""
    _adopted(now, host)
    tls = "off" if now.router.site.startswith("http://") else "acme"
    config = router.caddyfile(now, tls=tls)
    _retry(
        ATTEMPTS, say, f"give Caddy at {now.router.admin} the new routes", lambda: router.load(config, now.router.admin)
    )
    say(f"the router at {now.router.admin} routes by placement epoch {now.epoch}")


def _wait_drained(now: Placement, source: str, digits: str) -> bool:
    """Whether ``source`` shipped everything of the drained shard (False: its final sync failed)."""
    said: list[dict[str, object]] = []

    def drained(health: dict[str, object]) -> bool:
        d = health.get("drained")
        if isinstance(d, dict) and d.get("epoch") == now.epoch and digits in (d.get("shards") or []):
            said.append(d)
            return True
        return False

    _wait_for(
        now.hosts[source], source, drained, DRAIN_TIMEOUT_S, f"drain shard {digits} at placement epoch {now.epoch}"
    )
    return said[-1].get("shipped") is True
