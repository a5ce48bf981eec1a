"""The end of a session, done after its answer has left.

A request's answer is ready once its work has committed; what follows it
(the key ring's copy of the memory's head raised to what the file now holds,
both files handed back to the pool, the user's lock let go) changes nothing
the answer says, and used to cost every write about a quarter of a
millisecond of its two before the answer (a note, at a million memories).
A capability other than the owner's now ends its session right after its
answer is sent (web/dispatch.py runs it as the response's
background work, tracked as the request's own work, so a stopping server
still waits for it).

What keeps that as safe as ending it first:

* **This worker's next request of the same user runs it first.** Every
  session begins with :meth:`Pending.run_for` its user, which runs (or waits
  for) whatever that user's earlier sessions left: it reads the copy they
  raised and takes the files they handed back, as if they had ended before
  their answers.
* **Once.** A :class:`Deferred` runs its work once, whoever calls it first,
  and a second caller waits until it is done.
* **Failures are logged, never raised.** The answer is gone already; the
  error log names the failure's class, nothing of the memory or the request.
  A copy left behind is a lag, which the next write brings up to date.
* **Nothing is left when the server stops:** :meth:`Pending.run_all` runs
  what is still waiting before the pool closes.

An owner's session still ends before its answer: a capability minted,
revoked or rotated must be seen by every worker once its answer is read
(tag_index.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

error_log = logging.getLogger("stash.error")


class Deferred:
    """One session's end, run once (:meth:`run`)."""

    def __init__(self, work: Callable[[], object], done: Callable[[Deferred], None] | None = None) -> None:
        self._work: Callable[[], object] | None = work
        self._done = done
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return self._work is not None

    def run(self) -> None:
        """Run the work unless it ran; a caller that finds it running waits
        for its end. Never raises."""
        with self._lock:
            work, self._work = self._work, None
            if work is None:
                return
            try:
                work()
            except Exception as exc:  # the answer has left: logged, by class only
                error_log.error("a session's end after its answer failed (%s)", type(exc).__name__)
            finally:
                if self._done is not None:
                    self._done(self)


class Pending:
    """Every :class:`Deferred` of one process not run yet, by user."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_user: dict[str, list[Deferred]] = {}

    def add(self, user_id: str, work: Callable[[], object]) -> Deferred:
        """File ``work`` under ``user_id``; the :class:`Deferred` that runs it."""

        def forget(d: Deferred) -> None:
            with self._lock:
                left = [e for e in self._by_user.get(user_id, []) if e is not d]
                if left:
                    self._by_user[user_id] = left
                else:
                    self._by_user.pop(user_id, None)

        deferred = Deferred(work, forget)
        with self._lock:
            self._by_user.setdefault(user_id, []).append(deferred)
        return deferred

    def run_for(self, user_id: str) -> None:
        """Run (or wait for) every session's end ``user_id`` has waiting."""
        with self._lock:
            waiting = list(self._by_user.get(user_id, ()))
        for d in waiting:
            d.run()

    def run_all(self) -> None:
        with self._lock:
            waiting = [d for ds in self._by_user.values() for d in ds]
        for d in waiting:
            d.run()

    def count(self) -> int:
        with self._lock:
            return sum(len(ds) for ds in self._by_user.values())
