"""Fair shares of one server process among its tenants.

Every authenticated request holds one of its user's *slots* while it runs
(``--user-concurrency``, default 4), and slow work (recall, import, export)
also holds one of its user's *slow slots* (``--user-slow``, default 1) and
one of the process's *slow slots* (``--slow-slots``, default 2). A request
that finds none free is answered ``429`` with ``Retry-After`` at once, never
queued: a flood of slow recalls from one tenant then runs one at a time, and
the worker threads stay free for everyone else's wakes and notes.

Slots are counted per process, like the rate limits: with ``--workers N`` a
user may hold up to N times as many.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ..core.errors import TooMany
from ..core.lines import plural

RETRY_S = 1
SLOW_RETRY_S = 2


class Shares:
    def __init__(self, per_user: int, slow_per_user: int, slow_slots: int) -> None:
        self.per_user = per_user
        self.slow_per_user = slow_per_user
        self.slow_slots = slow_slots
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}
        self._slow: dict[str, int] = {}
        self._slow_total = 0

    def _refusal(self, user_id: str, slow: bool) -> TooMany | None:
        if self._busy.get(user_id, 0) >= self.per_user:
            return TooMany(
                f"This memory already has {plural(self.per_user, 'request')} in progress on this server; "
                "wait for them "
                f"(Retry-After), then retry, and send at most {self.per_user} at once.",
                RETRY_S,
                code="busy.user",
            )
        if slow and self._slow.get(user_id, 0) >= self.slow_per_user:
            return TooMany(
                f"This memory already has {self.slow_per_user} slow request(s) (recall, import or export) in "
                "progress; wait for it to finish (Retry-After), then retry one at a time, with a narrower "
                "pattern if a recall was slow.",
                SLOW_RETRY_S,
                code="busy.slow",
            )
        if slow and self._slow_total >= self.slow_slots:
            return TooMany(
                "The server is busy with other slow requests (recall, import or export); retry after "
                "Retry-After seconds. Wakes, notes and naps are not affected.",
                SLOW_RETRY_S,
                code="busy.server",
            )
        return None

    @contextlib.contextmanager
    def hold(self, user_id: str, slow: bool = False) -> Iterator[None]:
        """A slot for one request of ``user_id`` (and a slow one when
        ``slow``), released when the block ends; ``TooMany`` when none is free."""
        with self._lock:
            refusal = self._refusal(user_id, slow)
            if refusal is not None:
                raise refusal
            self._busy[user_id] = self._busy.get(user_id, 0) + 1
            if slow:
                self._slow[user_id] = self._slow.get(user_id, 0) + 1
                self._slow_total += 1
        try:
            yield
        finally:
            with self._lock:
                _drop(self._busy, user_id)
                if slow:
                    _drop(self._slow, user_id)
                    self._slow_total -= 1


def _drop(counts: dict[str, int], key: str) -> None:
    """One fewer; the entry goes when it reaches 0, so the table holds only
    users with requests in flight."""
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
