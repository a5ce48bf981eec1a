"""The running digest of a log: a keyed hash chain over its sealed rows.

``h(0)`` is a keyed hash of the user id alone; ``h(i+1)`` is BLAKE2b, keyed by
the chain key (a subkey of the user's master key), over ``h(i)``, the row's
position and the row's sealed bytes. The head of a log of ``T`` memories is
``(T, h(T))``. Without the key nobody can compute a head for a log, so a head
found next to a shorter or different log proves the log was cut or replaced;
log rows never change once written (erasure destroys keys, not ciphertext), so
a head stays valid for as long as the log exists.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

DIGEST_BYTES = 32
_PERSON = b"stash.chain"
_PIN = re.compile(r"(\d{1,18}):([0-9a-f]{64})(?::(\d{1,18}))?")


def genesis(key: bytes, user_id: str) -> bytes:
    """``h(0)``: the head digest of an empty log."""
    return hashlib.blake2b(
        f"stash/v1|{user_id}|log".encode(), key=key, digest_size=DIGEST_BYTES, person=_PERSON
    ).digest()


def step(key: bytes, prev: bytes, i: int, sealed: bytes) -> bytes:
    """``h(i+1)`` from ``h(i)`` and row ``i``'s sealed bytes."""
    h = hashlib.blake2b(prev, key=key, digest_size=DIGEST_BYTES, person=_PERSON)
    h.update(i.to_bytes(8, "big"))
    h.update(sealed)
    return h.digest()


def extend(key: bytes, digest: bytes, start: int, rows: Iterable[bytes]) -> tuple[int, bytes]:
    """Run the chain from ``h(start) = digest`` over ``rows`` (rows ``start``,
    ``start+1``, ...); returns the new count and digest."""
    i = start
    for sealed in rows:
        digest = step(key, digest, i, sealed)
        i += 1
    return i, digest


def same(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


@dataclass(frozen=True)
class Head:
    """A log's head: how many memories it holds and the digest after the
    last, and, when known, the version of the memory file's whole-state head
    at the same moment (it grows with every write of anything: memories,
    summaries, config, erasures), so that a pin catches a rollback of any of
    them, not only of the log."""

    count: int
    digest: bytes
    state: int | None = None

    def pin(self) -> str:
        """The text a client sends back in ``Stash-Pin``:
        ``count:digest`` or ``count:digest:state``."""
        base = f"{self.count}:{self.digest.hex()}"
        return base if self.state is None else f"{base}:{self.state}"

    def as_dict(self) -> dict[str, object]:
        return {"count": self.count, "digest": self.digest.hex(), "state": self.state, "pin": self.pin()}

    @classmethod
    def parse(cls, text: str) -> Head | None:
        """A head written as ``count:hexdigest[:state]``, or None if it is not one."""
        m = _PIN.fullmatch(text.strip())
        if not m:
            return None
        return cls(int(m.group(1)), bytes.fromhex(m.group(2)), None if m.group(3) is None else int(m.group(3)))
