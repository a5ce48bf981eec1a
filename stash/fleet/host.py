"""One host of a fleet and its placement (``stash serve --placement FILE
--fleet-host NAME``; docs/DESIGN.md, "A fleet").

The serve master *adopts* a placement: it checks it against the one adopted
before (an older epoch is refused; the same epoch must say the same), copies
it to ``placement.json`` in the data folder, and moves the folders of users
whose shard the host does not hold to ``released/e<epoch>/`` (never deleted),
so the host neither serves nor replicates them. While the server runs,
:class:`Watch` adopts a newer file as it appears.

Each worker reads only the adopted copy, through :class:`Adopted`, which the
vault asks before it opens any file of a user (service/access.py,
``Vault.serves``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..storage import userlock
from ..storage.layout import USER_ID
from ..storage.private_files import private_folder
from . import placement as pl
from .placement import Placement, PlacementError

ADOPTED = "placement.json"
RELEASED = "released"
DRAINED = ".run/drained.json"  # the shards the master drained, and at which epoch
DRAIN_ATTEMPTS = 5  # final syncs tried before the drain is reported unshipped
# How stale a worker's view of the adopted placement may be, and how often the master looks at the file: a
# stat each, so cheap, and every failover and move waits for both.
CHECK_S = 0.2
WATCH_S = 0.2
LOCK_WAIT_S = 10.0  # how long a released user's requests in progress may hold its folder before it moves
# Where ``stash fleet failover`` and ``move`` restore a shard, outside the ``users/`` folder Litestream watches
# (its watcher once took a restore's staging copies there): DATA/.incoming/<digits>/ holds the restore's work,
# ``roster.json`` (the users being restored, so a request for one not back yet is told to retry while any other
# unknown user is refused as usual) and ``wanted/<user id>`` (a request asked for that user: restored next).
INCOMING = ".incoming"
ROSTER = "roster.json"
WANTED = "wanted"


def restore_folder(data_dir: Path, digits: str) -> Path:
    """Where shard ``digits`` is restored on this host (see :data:`INCOMING`)."""
    pl.digits_of(digits)  # a shard's digits, never a path
    return Path(data_dir) / INCOMING / digits


def adopted_path(data_dir: Path) -> Path:
    return Path(data_dir) / ADOPTED


def adopted(data_dir: Path) -> Placement | None:
    """The placement this data folder adopted, or None (never one)."""
    path = adopted_path(data_dir)
    if not path.exists():
        return None
    return pl.load(path)


def adopt(data_dir: Path, given: Placement, host: str) -> bool:
    """Make ``given`` this host's placement: refused (PlacementError) when
    ``host`` is not in it, when it is older than the one adopted, or when it
    has the adopted epoch but says something else. True when it was new."""
    given.held_by(host)  # names the hosts when this one is not among them
    current = adopted(data_dir)
    if current is not None:
        if given.epoch < current.epoch:
            raise PlacementError(
                f"the placement's epoch {given.epoch} is older than epoch {current.epoch}, which this host has "
                "adopted; give it the fleet's current placement"
            )
        if given.epoch == current.epoch:
            if given != current:
                raise PlacementError(
                    f"the placement's epoch {given.epoch} is the one this host adopted, but it says something "
                    "else; every change of placement takes a new epoch"
                )
            return False
    pl.write(adopted_path(data_dir), given)
    return True


def release(data_dir: Path, placement: Placement, host: str) -> list[str]:
    """Move every user of a shard ``host`` does not hold out of ``users/``
    into ``released/e<epoch>/``, each under its exclusive lock so no request
    of it is in progress (once the workers see the placement, none starts);
    the users moved."""
    held = placement.held_by(host)
    users = Path(data_dir) / "users"
    if not users.is_dir():
        return []
    moved = []
    for entry in sorted(users.iterdir()):
        if not USER_ID.fullmatch(entry.name) or entry.name[0] in held or not entry.is_dir():
            continue
        to = Path(data_dir) / RELEASED / f"e{placement.epoch}"
        private_folder(to)
        with userlock.exclusive_within(entry, LOCK_WAIT_S):
            target = to / entry.name
            if target.exists():  # released at this epoch once already (a restart): keep both
                target = to / f"{entry.name}.{time.time_ns()}"
            shutil.move(str(entry), str(target))
        moved.append(entry.name)
    return moved


class Adopted:
    """A worker's view of the adopted placement: the digits this host holds
    and the epoch, read again when the file changes, looked at no more than
    every :data:`CHECK_S`. A file that cannot be read keeps the last view;
    before any, the host holds nothing."""

    def __init__(self, data_dir: Path, host: str) -> None:
        self.path = adopted_path(data_dir)
        self.host = host
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._next = 0.0
        self._held: frozenset[str] = frozenset()
        self._draining: frozenset[str] = frozenset()
        self._restoring: dict[str, str] = {}
        self._epoch: int | None = None
        self._rosters: dict[str, tuple[tuple[int, int, int], frozenset[str]]] = {}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        with self._lock:
            if now < self._next:
                return
            self._next = now + CHECK_S
            try:
                st = os.stat(self.path)
                seen = (st.st_mtime_ns, st.st_size, st.st_ino)
                if seen == self._seen:
                    return
                placement = pl.load(self.path)
                self._held, self._epoch = placement.held_by(self.host), placement.epoch
                self._draining = placement.draining_on(self.host)
                self._restoring = placement.restoring_on(self.host)
                self._seen = seen
            except (OSError, PlacementError):
                return

    def held(self) -> frozenset[str]:
        self._refresh()
        return self._held

    def epoch(self) -> int | None:
        self._refresh()
        return self._epoch

    def draining(self) -> frozenset[str]:
        """The first digits of the held shards being moved away (``stash fleet move``)."""
        self._refresh()
        return self._draining

    def restoring(self, user_id: str) -> bool:
        """Whether ``user_id`` is a user of a shard being restored onto this
        host that is not back yet: it is on the restore's roster and has no
        folder. Such a user is marked wanted, so the restore takes it next."""
        self._refresh()
        digits = self._restoring.get(user_id[:1])
        if digits is None or not USER_ID.fullmatch(user_id):
            return False
        folder = restore_folder(self.path.parent, digits)
        if user_id not in self._roster(folder / ROSTER) or (self.path.parent / "users" / user_id).exists():
            return False
        with contextlib.suppress(OSError):  # the restore's folder is gone: no one to tell, and the answer stands
            os.close(os.open(folder / WANTED / user_id, os.O_WRONLY | os.O_CREAT, 0o600))
        return True

    def _roster(self, path: Path) -> frozenset[str]:
        """The users a restore's roster names, read again when the file changes."""
        try:
            st = os.stat(path)
        except OSError:
            return frozenset()
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            known = self._rosters.get(str(path))
        if known is not None and known[0] == seen:
            return known[1]
        try:
            listed = json.loads(path.read_text())
        except (OSError, ValueError):
            return frozenset()
        users = frozenset(u for u in listed if isinstance(u, str)) if isinstance(listed, list) else frozenset()
        with self._lock:
            self._rosters[str(path)] = (seen, users)
        return users

    def drained(self) -> dict[str, Any] | None:
        """What the master last finished draining (:func:`drain`), for ``/health``."""
        if not self.draining():
            return None
        try:
            said = json.loads((self.path.parent / DRAINED).read_text())
        except (OSError, ValueError):
            return None
        return said if isinstance(said, dict) else None


def _say(text: str) -> None:
    print(f"stash: {text}", file=sys.stderr, flush=True)


class Watch:
    """The serve master's watch over the placement file: a newer epoch is
    adopted (then, once every worker sees it, the released users move
    aside, and ``changed`` is called with it); an older one, or one that does
    not parse, is reported once and ignored."""

    def __init__(
        self, file: Path, data_dir: Path, host: str, changed: Callable[[Placement], None] | None = None
    ) -> None:
        self.file, self.data_dir, self.host, self.changed = Path(file), Path(data_dir), host, changed
        self._stop = threading.Event()
        self._seen = self._stat()
        self._thread = threading.Thread(target=self._run, name="placement-watch", daemon=True)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.file)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_S):
            seen = self._stat()
            if seen is None or seen == self._seen:
                continue
            self._seen = seen
            try:
                self.look()
            except Exception as e:  # the watch must outlive any one bad file
                _say(f"placement {self.file}: {type(e).__name__}; keeping the adopted placement")

    def look(self) -> None:
        """Adopt the file if it is newer; say why not otherwise."""
        try:
            given = pl.load(self.file)
            if not adopt(self.data_dir, given, self.host):
                return
        except PlacementError as e:
            _say(f"placement {self.file} not adopted: {e}")
            return
        _say(f"adopted placement epoch {given.epoch}; this host holds {held_text(given, self.host)}")
        # Once every worker has looked at the adopted file again, none opens a released user's files.
        self._stop.wait(2 * CHECK_S + 0.1)
        _say(f"placement epoch {given.epoch} in force: every worker's next request reads it")
        moved = release(self.data_dir, given, self.host)
        if moved:
            _say(f"moved {len(moved)} user(s) of shards this host no longer holds to {RELEASED}/e{given.epoch}/")
        if self.changed is not None:
            self.changed(given)


def held_text(placement: Placement, host: str) -> str:
    held = pl.runs(placement.held_by(host))
    return f"digits {', '.join(held)}" if held else "no shard (a standby)"


class Host:
    """The serve master's side of a fleet host: the placement adopted at
    start (before any worker), the released users moved aside, replication
    to the host's replica, and the watch that follows the placement file."""

    def __init__(self, settings: Any, placement: Placement) -> None:
        self.settings = settings
        self.file = Path(settings.placement)
        self.data_dir = Path(settings.data_dir)
        self.name: str = settings.fleet_host
        self.replica = placement.replica_of(self.name)
        self.held = placement.held_by(self.name)
        self._start: Callable[[str], Any] | None = None
        self._stop: Callable[[Any], int | None] | None = None
        self._replicator: Any = None
        self._lock = threading.Lock()
        self._watch: Watch | None = None

    @classmethod
    def start(cls, settings: Any) -> Host:
        """Adopt the placement file at start: refused (PlacementError) as
        :func:`adopt` refuses, or when a replica is not one Litestream takes."""
        from ..service.ops.replica import ReplicaError, Target

        given = pl.load(Path(settings.placement))
        given.held_by(settings.fleet_host)
        replica = given.replica_of(settings.fleet_host)
        if replica is not None:
            try:
                Target.parse(replica)
            except ReplicaError as e:
                raise PlacementError(f"host {settings.fleet_host}'s replica: {e}") from None
        adopt(settings.data_dir, given, settings.fleet_host)
        name = settings.fleet_host
        _say(f"placement epoch {given.epoch}; this host ({name}) holds {held_text(given, name)}")
        moved = release(settings.data_dir, given, settings.fleet_host)
        if moved:
            _say(f"moved {len(moved)} user(s) of shards this host does not hold to {RELEASED}/e{given.epoch}/")
        made = dataclasses.replace(settings, replicate=replica)
        return cls(made, given)

    def replicate(self, start: Callable[[str], Any], stop: Callable[[Any], int | None]) -> None:
        """Replicate to the host's replica with ``start(replica)`` (ended
        with ``stop``), and from now on follow the placement file."""
        self._start, self._stop = start, stop
        with self._lock:
            self._replicator = start(self.replica) if self.replica is not None else None
        self._watch = Watch(self.file, self.data_dir, self.name, self._changed).start()

    def _changed(self, placement: Placement) -> None:
        replica = placement.replica_of(self.name)
        held = placement.held_by(self.name)
        with self._lock:
            gained = held - self.held
            self.held = held
            if replica != self.replica or gained:
                # Litestream starts over the users moved in before the switch; those a failover or a move
                # moves in later are taken by its directory watch, which scans a folder renamed into the tree.
                assert self._start is not None and self._stop is not None
                _say(f"replica of this host is {replica or 'none'}; restarting replication")
                self._stop(self._replicator)
                self._replicator = None
                self.replica = replica
                if replica is not None:
                    self._replicator = self._start(replica)
        draining = placement.draining_on(self.name)
        if draining:
            self._drain(placement, draining)

    def _drain(self, placement: Placement, digits: frozenset[str]) -> None:
        """The shards of ``digits`` are moving away: the workers refuse their
        requests already (the placement is in force); wait for those in
        progress (each user's exclusive lock), then have Litestream ship
        everything (a stop runs its final sync) and start it again, and say
        so in ``DATA/.run/drained.json`` for ``/health``."""
        users = Path(self.data_dir) / "users"
        for entry in sorted(users.iterdir()) if users.is_dir() else []:
            if USER_ID.fullmatch(entry.name) and entry.name[0] in digits:
                with userlock.exclusive_within(entry, LOCK_WAIT_S):
                    pass
        shipped = False
        for attempt in range(DRAIN_ATTEMPTS):
            with self._lock:
                if self.replica is None:
                    break
                assert self._start is not None and self._stop is not None
                shipped = self._stop(self._replicator) == 0
                self._replicator = self._start(self.replica)
            if shipped:
                break
            _say(f"the final sync of the draining shards failed (attempt {attempt + 1}); trying again")
            time.sleep(1.0 + attempt)
        shards = [s.digits for s in placement.shards if s.host == self.name and s.draining]
        said = {"epoch": placement.epoch, "shards": shards, "shipped": shipped}
        path = Path(self.data_dir) / DRAINED
        private_folder(path.parent)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(said))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        _say(f"drained shard(s) {', '.join(shards)} at placement epoch {placement.epoch}: shipped {shipped}")

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            if self._stop is not None:
                self._stop(self._replicator)
            self._replicator = None
