"""``stash fleet failover`` and ``stash fleet move``: give a shard to another
host, from its users' replica in object storage (docs/DESIGN.md, "A fleet").

Both run where the receiving host's data folder is, and follow one order,
so that a step cut short is finished by running the command again:

1. read the shard's users from its replica (the roster), retrying while the
   bucket does not answer, and write that roster into ``DATA/.incoming/
   <digits>/``, outside ``users/``, which Litestream watches (its watcher
   once took a restore's staging copies there);
2. bring back the first few users (:data:`FIRST`) there with ``stash
   restore``'s code, each checked as ``stash verify`` checks it; any failure
   stops here and changes nothing the fleet serves. Move them into
   ``users/`` (the receiving host does not serve them yet: the placement
   does not give it their shard);
3. write the placement one epoch later with the shard on the receiving
   host, replicating under a path no host has written (the fence), and
   naming the replicas its other users are still read from (``restoring``).
   Every host watches the file: the receiver serves the shard and starts
   Litestream over its users; a host that held the shard moves its copies
   out of ``users/``;
4. wait until the receiver says it serves that epoch, then switch the
   router (Caddy's admin API): the shard answers from here on;
5. bring back the other users the same way while the shard serves, each
   moved into ``users/`` once checked. The host answers a user not back yet
   with 503 and ``Retry-After`` and marks it wanted, and the restore takes
   a wanted user next, so an agent waits about one user's restore, not the
   shard's. A user that never comes back whole keeps being answered 503, and
   the command says which and exits 1; run again, it goes on from there;
6. write the placement one epoch later again, with nothing left restoring.

A move first *drains* the shard on the host that holds it: a placement
epoch marks it moving, the host refuses its writes (503, retry later),
waits for the writes in flight, lets Litestream ship everything, and says
so in ``/health``; then the steps above run from its replica.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
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
from ..storage.private_files import private_folder
from . import placement as places
from . import router
from .host import ROSTER, WANTED, restore_folder
from .placement import Placement, PlacementError

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
# Users restored and checked before the shard is switched: the replica and its keys proven on a few, so a
# failover that cannot work stops having changed nothing; the rest come back while the shard serves.
FIRST = RESTORE_JOBS
PROBE_TIMEOUT_S = 3.0


class FleetError(RuntimeError):
    """The command stopped; the message says what happened and what to do."""


@dataclass
class Outcome:
    placement: Placement
    users: list[str] = field(default_factory=list)
    already: bool = False
    restore_s: float = 0.0  # until every user was back
    served_s: float = 0.0  # until the receiving host served the shard and the router sent it there
    took_s: float = 0.0


Say = Callable[[str], None]
T = TypeVar("T")


def _quiet(_: str) -> None:
    pass


def failover(
    placement_file: Path,
    digits: str,
    standby: str,
    data_dir: Path,
    *,
    attempts: int = ATTEMPTS,
    first: int | None = FIRST,
    jobs: int = RESTORE_JOBS,
    say: Say = _quiet,
) -> Outcome:
    """Give shard ``digits`` to ``standby``, whose data folder is ``data_dir``,
    from the shard's replica; the host that held it is presumed dead. The
    first ``first`` users (None: all) are back before the switch, the others
    while the shard serves; ``jobs`` restores run at once."""
    started = time.monotonic()
    now = _current(placement_file, data_dir)
    shard = now.shard(digits)
    if shard.host == standby and shard.restoring:
        return _give(placement_file, now, digits, standby, data_dir, attempts, say, started, first, jobs)
    if shard.host == standby:
        return _already(now, digits, standby, data_dir, say, started)
    now.held_by(standby)  # a host the placement knows
    return _give(placement_file, now, digits, standby, data_dir, attempts, say, started, first, jobs)


def move(
    placement_file: Path,
    digits: str,
    source: str,
    dest: str,
    data_dir: Path,
    *,
    attempts: int = ATTEMPTS,
    first: int | None = FIRST,
    jobs: int = RESTORE_JOBS,
    say: Say = _quiet,
) -> Outcome:
    """Move shard ``digits`` from the live host ``source`` to ``dest``, whose
    data folder is ``data_dir``: drain it on ``source``, then give it to
    ``dest`` from the replica ``source`` finished shipping (``first`` and
    ``jobs`` as :func:`failover` takes them)."""
    started = time.monotonic()
    now = _current(placement_file, data_dir)
    shard = now.shard(digits)
    if shard.host == dest and shard.restoring:
        return _give(placement_file, now, digits, dest, data_dir, attempts, say, started, first, jobs)
    if shard.host == dest and not shard.draining:
        return _already(now, digits, dest, data_dir, say, started)
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
    done = _give(placement_file, now, digits, dest, data_dir, attempts, say, started, first, jobs)
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


def _already(now: Placement, digits: str, host: str, data_dir: Path, say: Say, started: float) -> Outcome:
    """The shard is on ``host`` with every user back: a run cut after its last
    placement write left the router to switch and the restore's folder."""
    say(f"shard {digits} is on {host} already (placement epoch {now.epoch}); checking the router")
    shutil.rmtree(restore_folder(data_dir, digits), ignore_errors=True)
    _settle(now, host, say)
    return Outcome(now, already=True, took_s=time.monotonic() - started)


def _give(
    placement_file: Path,
    now: Placement,
    digits: str,
    host: str,
    data_dir: Path,
    attempts: int,
    say: Say,
    started: float,
    first: int | None,
    jobs: int,
) -> Outcome:
    shard = now.shard(digits)
    data_dir = Path(data_dir)
    # A run cut after the switch left the shard on ``host``, restoring: finish it from the same replicas.
    continuing = shard.host == host
    sources = shard.restoring if continuing else (shard.replica, *shard.restoring)
    work = restore_folder(data_dir, digits)
    private_folder(work)
    t0 = time.monotonic()
    targets = [_target(url) for url in sources]
    users = _retry(attempts, say, "read the replica's roster", lambda: _roster(targets, sources, shard, work, say))
    say(f"{len(users)} user(s) of shard {digits} in {', '.join(sources)}")
    _write_roster(work, users)
    home = data_dir / "users"
    if continuing:
        after, left = now, [u for u in users if not (home / u).exists()]
        say(f"shard {digits} is on {host} already; restoring the {len(left)} user(s) not back yet")
    else:
        _set_aside(data_dir, shard)
        batch, left = (users, []) if first is None else (users[:first], users[first:])
        problems = _restore(targets, batch, work, attempts, jobs, say, stream=False)
        if problems:
            raise FleetError(
                f"{_named(problems)} of the shard did not come back whole from the replica ({_shown(problems)}); "
                "nothing the fleet serves was changed: run stash restore and stash verify on them to see why"
            )
        after = now.with_shard_on(digits, host, restoring=sources if left else ())
        places.write(placement_file, after)
        say(f"placement epoch {after.epoch}: shard {digits} on {host}, replicating to {after.replica_of(host)}")
        _settle(after, host, say)
    served_s = time.monotonic() - started
    if left:
        say(
            f"shard {digits} is served by {host}; restoring its other {len(left)} user(s) while it serves (a "
            "request for one not back yet is answered 503 with Retry-After, and puts that user first)"
        )
        problems = _restore(targets, left, work, attempts, jobs, say, stream=True)
        if problems:
            raise FleetError(
                f"{_named(problems)} of the shard did not come back whole from the replica ({_shown(problems)}); the "
                f"shard is served by {host} and their requests are answered 503: run the command again to restore "
                "them, or stash restore and stash verify on them to see why"
            )
    restore_s = time.monotonic() - t0
    if after.shard(digits).restoring:
        after = after.with_shard_restored(digits)
        places.write(placement_file, after)
        say(f"placement epoch {after.epoch}: every user of shard {digits} is back on {host}")
        _settle(after, host, say)
    shutil.rmtree(work, ignore_errors=True)
    return Outcome(after, users, restore_s=restore_s, served_s=served_s, took_s=time.monotonic() - started)


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


def _roster(
    targets: list[replica.Target], sources: tuple[str, ...], shard: places.Shard, work: Path, say: Say
) -> list[str]:
    """The shard's users, as the replicas' rosters list them: the oldest
    replica's must be there; a newer one (a host that died while restoring
    the shard) may not have shipped its roster yet."""
    found: dict[str, None] = {}
    for i, target in enumerate(targets):
        _reachable(target)
        try:
            listed = replica.replica_users(target, work)
        except replica.ReplicaError:
            if i == len(targets) - 1:
                raise
            say(f"{sources[i]} holds no roster yet; its users are read from the older replicas")
            continue
        found.update((u, None) for u, _cipher in listed if u[:1] in shard.first_digits)
    return sorted(found)


def _write_roster(work: Path, users: list[str]) -> None:
    """The restore's roster, for the receiving host (fleet/host.py, ``INCOMING``)."""
    tmp = work / f".{ROSTER}.tmp"
    tmp.write_text(json.dumps(users))
    os.chmod(tmp, 0o600)
    os.replace(tmp, work / ROSTER)
    private_folder(work / WANTED)


def _set_aside(data_dir: Path, shard: places.Shard) -> None:
    """Copies of the shard's users this host holds from before (a run cut
    short, or an old stay of the shard here) are moved aside, never deleted:
    the shard is served from what the replica holds now."""
    home = data_dir / "users"
    stale = (
        [e for e in home.iterdir() if USER_ID.fullmatch(e.name) and e.name[0] in shard.first_digits]
        if (home.is_dir())
        else []
    )
    if stale:
        aside = _aside(data_dir)
        private_folder(aside)
        for entry in stale:
            os.rename(entry, aside / entry.name)


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


class _Queue:
    """The users left to restore, in roster order, except that a user a
    request asked for (the host's ``wanted/`` mark) goes next."""

    def __init__(self, users: list[str], wanted: Path | None) -> None:
        self._left = list(users)
        self._set = set(users)
        self._wanted = wanted
        self._lock = threading.Lock()

    def next(self) -> tuple[str, bool] | None:
        with self._lock:
            if not self._left:
                return None
            asked = sorted(set(os.listdir(self._wanted)) & self._set) if self._wanted and self._wanted.is_dir() else []
            user = asked[0] if asked else self._left[0]
            self._left.remove(user)
            self._set.discard(user)
            return user, bool(asked)


def _restore(
    targets: list[replica.Target], users: list[str], work: Path, attempts: int, jobs: int, say: Say, *, stream: bool
) -> dict[str, str]:
    """Restore and check ``users`` into ``work/users/``, each from the
    newest replica that holds it, a user that fails tried again (the bucket
    may have dropped a request); the users that never came back whole, with
    why. ``stream``: each user moves into ``users/`` as soon as it is back
    (the host serves the shard already), wanted users first; otherwise they
    move in together, and only when every one is back."""
    data_dir = work.parent.parent
    queue = _Queue(users, work / WANTED if stream else None)
    problems: dict[str, str] = {}
    done: list[str] = []
    lock = threading.Lock()
    step = max(1, len(users) // 10)

    def one(user: str) -> str | None:
        why = "not tried"
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                time.sleep(FIRST_PAUSE_S * attempt)
            try:
                for target in targets:
                    _reachable(target)
            except replica.ReplicaError as e:
                why = str(e)
                continue
            shutil.rmtree(work / "users" / user, ignore_errors=True)
            back = _newest(targets, user, work)
            if back.ok and not back.left:
                return None
            why = (
                back.problem or "; ".join([*(back.report.problems if back.report else []), *back.left]) or ("not whole")
            )
            shutil.rmtree(work / "users" / user, ignore_errors=True)
        return why

    def worker() -> None:
        while (item := queue.next()) is not None:
            user, asked = item
            why = one(user)
            with lock:
                if why is not None:
                    problems[user] = why
                    continue
                if stream:
                    _move_in([user], work, data_dir)
                    with contextlib.suppress(OSError):
                        os.unlink(work / WANTED / user)
                done.append(user)
                if asked:
                    say(f"user {user} restored ahead of its turn ({len(done)} of {len(users)}): a request asked for it")
                elif stream and len(done) % step == 0:
                    say(f"{len(done)} of {len(users)} user(s) back")

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for running in [pool.submit(worker) for _ in range(min(max(1, jobs), len(users)))]:
            running.result()  # a worker's failure is the command's
    if not stream and not problems:
        _move_in(users, work, data_dir)
    return problems


def _newest(targets: list[replica.Target], user: str, work: Path) -> replica.Restored:
    """``user`` restored from the newest replica that holds it."""
    back = replica.Restored(user, problem="in no replica", absent=True)
    for target in targets:
        back = replica.restore_user(target, user, work)
        if not back.absent:
            break
    return back


def _named(problems: dict[str, str]) -> str:
    return f"{len(problems)} user(s)"


def _shown(problems: dict[str, str]) -> str:
    return "; ".join(f"{u}: {why}" for u, why in sorted(problems.items())[:5])


def _aside(data_dir: Path) -> Path:
    """A folder of its own for copies moved aside, even for two runs within a second."""
    return data_dir / RELEASED / f"replaced-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns()}"


def _move_in(users: list[str], work: Path, data_dir: Path) -> None:
    """Each restored user into ``users/``; a folder already there (a run cut
    short, or the receiver's own stale copy) is moved aside, never deleted."""
    home = data_dir / "users"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    aside = _aside(data_dir)
    for user_id in users:
        assert USER_ID.fullmatch(user_id)
        dest = home / user_id
        if dest.exists():
            aside.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.rename(dest, aside / user_id)
        os.rename(work / "users" / user_id, dest)
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
