"""What a request cut by the server's shutdown answers (docs/DESIGN.md,
"Shutdown"; deploy/README.md, "Stopping").

On SIGTERM uvicorn stops taking requests and waits ``--shutdown-timeout``
seconds for those in flight, then cancels them. A cancelled request's work
runs on in its worker thread (a thread cannot be stopped), so a write the
client was about to be told failed could commit all the same. Instead:

- the work of every request runs as a task this module keeps
  (:func:`run_work`); when the request is cancelled it waits up to
  :data:`CUT_GRACE_S` more for that work and answers its real answer, so a
  committed write is reported as done;
- the server's shutdown (its app's lifespan) first interrupts every
  statement still running over a file in the process (storage/safeopen.py,
  ``stop_all``): a cut write still in SQLite rolls back at its next step and
  its request answers ``503 server.stopping``, and a thread caught in a file
  that makes SQLite loop cannot keep the process from exiting; then it
  waits, within the same bound, for every such work before it closes the
  files (:func:`drain`);
- a request cut before its work began, or whose work outlasts the grace,
  answers ``503 server.stopping`` in the error shape: resend it with the
  same ``Idempotency-Key`` once the server is back, and the replay says
  whether it was done. Never a bare 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from ..core.errors import Stopping, Unavailable

CUT_GRACE_S = 10.0
T = TypeVar("T")


def stopping_error() -> Unavailable:
    return Stopping()


async def run_work(works: set[asyncio.Future[Any]], fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread; if this request is cancelled (the
    shutdown timeout), its answer all the same once the work is done, within
    :data:`CUT_GRACE_S`; else :func:`stopping_error`."""
    work: asyncio.Future[T] = asyncio.ensure_future(run_in_threadpool(fn, *args))
    works.add(work)
    work.add_done_callback(works.discard)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        try:
            done, _ = await asyncio.wait({work}, timeout=CUT_GRACE_S)
        except asyncio.CancelledError:
            done = set()
        if work in done:
            return work.result()
        raise stopping_error() from None


async def drain(works: set[asyncio.Future[Any]]) -> None:
    """Wait, within :data:`CUT_GRACE_S`, for every request's work still running."""
    if works:
        await asyncio.wait(set(works), timeout=CUT_GRACE_S)
