"""One authenticated call, run the way its route declares it.

A route declares what happens around its handler: the scope it needs, the
file its Idempotency-Key record is kept in, the memories it adds (checked
against the operator's quotas), the audit event it leaves, and the cleanup
after it commits. :func:`perform` is the one place that runs those
declarations, so no handler wires them by hand and two routes that declare
the same thing cannot do it differently."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..crypto.chain import Head
from ..crypto.tokens import Token
from . import append, audit, idempotency, quotas
from .access import Session, Vault

RECORDS = ("memory", "keyring", "rotation")
CLEANUPS = ("memory", "epoch")
ServiceCall = Callable[[Session, dict[str, Any], Any], Any]


@dataclass(frozen=True)
class Event:
    """The audit event a route leaves (audit.EVENTS), and its detail, made
    from the request's fields and the answer; a detail of None leaves none
    (a revocation of a revoked capability changed nothing)."""

    name: str
    detail: Callable[[Session, dict[str, Any], Any], dict[str, object] | None]

    def __post_init__(self) -> None:
        if self.name not in audit.EVENTS:
            raise ValueError(f"unknown audit event {self.name}")


@dataclass(frozen=True)
class Effects:
    """What a route does beyond its handler. ``record``: where its
    Idempotency-Key record lives (``memory`` file, ``keyring``, or
    ``rotation``: the key ring, sealed under the old owner token's secret);
    ``adds``: how many memories the request adds; ``cleanup``: the flush run
    after the write commits (``memory``: the memory file's WAL; ``epoch``:
    re-seal under the new key epoch and flush the key ring)."""

    scope: str
    record: str | None = None
    event: Event | None = None
    adds: Callable[[dict[str, Any]], int | None] | None = None  # None from it: no check
    cleanup: str | None = None

    def __post_init__(self) -> None:
        if self.record not in (None, *RECORDS) or self.cleanup not in (None, *CLEANUPS):
            raise ValueError(f"unknown record {self.record!r} or cleanup {self.cleanup!r}")


@dataclass(frozen=True)
class Outcome:
    """A call's answer: replayed from an earlier request's record, or with
    the audit event it recorded (None: none)."""

    body: Any
    replayed: bool = False
    event: str | None = None
    # The session's end, to run once the answer has left (session_end.py); None: it has ended.
    finish: Callable[[], None] | None = None


@dataclass(frozen=True)
class Limits:
    """The operator's quotas per memory (quotas.py)."""

    memories: int
    bytes: int


def perform(
    vault: Vault,
    token: str | Token | None,
    pin: Head | None,
    effects: Effects,
    route: str,
    fields: dict[str, Any],
    key: str | None,
    limits: Limits,
    handler: ServiceCall,
    context: Any = None,
    sent: dict[str, Any] | None = None,
    memory: str | None = None,
) -> Outcome:
    """Authenticate ``token`` for ``effects.scope``, then run ``handler``
    with the session, the parsed fields and ``context`` as declared. An
    Idempotency-Key's record is of ``route`` and ``sent`` (the body as sent;
    by default ``fields``).

    A session other than an owner's ends after the answer: the outcome's
    ``finish`` ends it (session_end.py), and the caller runs it once the
    answer has left."""
    with contextlib.ExitStack() as stack:
        session = stack.enter_context(vault.session(token, effects.scope, pin, memory, route))
        outcome = _run(
            vault, session, effects, route, fields, fields if sent is None else sent, key, limits, handler, context
        )
        if session.scope == "owner":
            return outcome
        rest = stack.pop_all()
    return replace(outcome, finish=vault.after.add(session.user_id, rest.close).run)


def _run(
    vault: Vault,
    session: Session,
    effects: Effects,
    route: str,
    fields: dict[str, Any],
    sent: dict[str, Any],
    key: str | None,
    limits: Limits,
    handler: ServiceCall,
    context: Any,
) -> Outcome:
    """One call in its session, in order: the write's transaction, the
    Idempotency-Key's lookup, the quota, the handler, the record of its
    answer, the audit event, the cleanup.

    The transaction is opened on the file the route's record lives in (the
    memory file, or the key ring), and the quota check, the handler and the
    record all run inside it, so two writes cannot both slip under a limit
    and a crash leaves the write and its record both or neither. The audit
    event of a key-ring write is recorded in that write's transaction; the
    event of a memory-file write is recorded once the write has committed
    (the event lives in the key ring, another file), and a replayed answer
    records none. A rotation resent by its old token, with its
    Idempotency-Key, answers its recorded answer (idempotency._rotation)
    while that token is still the owner, i.e. until the new token's first
    use; after it, 401. A route that keeps no record runs with no
    transaction of its own."""
    grant_id = session.grant_id  # a rotation's event belongs to the owner capability that asked for it
    in_keyring = effects.record in ("keyring", "rotation")
    entry = None if effects.record is None else idempotency.key_record(session, effects.record, key, route, sent)
    recorded: str | None = None
    with _transaction(session, entry):
        replayed = None if entry is None else entry.replay()
        if replayed is None:
            _check_quota(session, effects, fields, limits)
            answer = handler(session, fields, context)
            if entry is not None:
                entry.remember(answer)
            if in_keyring:
                recorded = _record(session, grant_id, effects.event, fields, answer)
    if replayed is not None:  # a replay records nothing now, whatever the first request did
        return Outcome(_cleanup(vault, session, effects, replayed), replayed=True)
    if not in_keyring:
        recorded = _record(session, grant_id, effects.event, fields, answer)
    return Outcome(_cleanup(vault, session, effects, answer), event=recorded)


@contextlib.contextmanager
def _transaction(session: Session, entry: idempotency.KeyRecord | None) -> Iterator[None]:
    """The write's transaction, on the file its record lives in; none for a
    route that keeps no record. An append note's begins on the key ring only
    once the memory's lock is held exclusive (append.noting says why)."""
    if entry is None:
        yield
        return
    with contextlib.ExitStack() as held:
        if session.scope == "append":
            held.enter_context(append.noting(session))
        held.enter_context(entry.transaction())
        yield


def _check_quota(session: Session, effects: Effects, fields: dict[str, Any], limits: Limits) -> None:
    """Refuse a request that would take the memory past the operator's
    quotas (quotas.py), inside the write's transaction. An append note
    checks inside its own lock instead (service/append.py): it holds no key
    to open the memory with."""
    adding = None if effects.adds is None else effects.adds(fields)
    if adding is None or session.scope == "append":
        return
    memory = session.open_memory()
    quotas.identity_room(session, memory.count() - len(memory.mf.erased_ids), adding, limits.memories, limits.bytes)


def _cleanup(vault: Vault, session: Session, effects: Effects, body: Any) -> Any:
    """The declared flush once the write has committed (also after a replay)."""
    if effects.cleanup == "memory":
        return {**body, "flushed": session.flush_memory()}
    if effects.cleanup == "epoch":
        return {**body, "flushed": vault.finish_epoch(session)}
    return body


def _record(session: Session, grant_id: int, event: Event | None, fields: dict[str, Any], answer: Any) -> str | None:
    """Record ``event`` for this answer; its name, or None when none was recorded."""
    if event is None:
        return None
    detail = event.detail(session, fields, answer)
    if detail is None:
        return None
    session.keyring.record(grant_id, event.name, detail, session.keys)
    return event.name
