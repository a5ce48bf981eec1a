"""What a rotation leaves in main's key ring for its new owner token, one row
per memory (docs/DESIGN.md, "Key epochs"): from ``POST /rotate`` (or, for a
memory the old token makes in the window, from its making) until the new
token's first use has taken that memory over.

Each is a ``keyring_meta`` row ``owner_handover.<memory number>`` holding
JSON: ``grants`` and ``appends``, the first read/full and append grant ids
minted in the window (every id from there on is ended at the take-over;
ids only grow, storage/memories/__init__.py, "Ids"), ``made`` (the memory was made
in the window), and for a memory other than main ``box``: the secret the old
owner token is enrolled under in that memory, sealed to the new owner
grant's public key (crypto/epochs.py ``seal_for``), which only the new
token's secret opens. Main's row (number 0) holds no box: main's take-over
is the retirement of the old owner grant itself. A row gives nobody a key:
its box opens only with the new owner token, and what it opens is the old
enrolment, which the take-over revokes. An edited or unreadable row is read
as none (the memory is then not taken over and is named by the owner's
listings, never served to the wrong token).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from ..sqlite.transactions import write_transaction

PREFIX = "owner_handover."


@dataclass(frozen=True)
class Handover:
    number: int
    grants: int  # the first read/full/owner grant id minted in the window
    appends: int  # the first append grant id minted in the window
    made: bool  # the memory was made (created or forked) in the window
    box: bytes | None  # the old owner's enrolment secret, sealed to the new owner grant (None in main)


def context(user_id: str, number: int, successor: int) -> bytes:
    """What a box is bound to: the identity, the memory and the new owner
    grant it is sealed to, so a box moved to another memory's row, or one
    sealed to a successor a later rotation ended, does not open."""
    return f"stash/v2|{user_id}|owner_handover|{number}|{successor}|".encode()


def _parse(number: int, text: str) -> Handover | None:
    try:
        row = json.loads(text)
        box = row.get("box")
        out = Handover(
            number,
            int(row["grants"]),
            int(row["appends"]),
            bool(row["made"]),
            None if box is None else bytes.fromhex(box),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return out


def all_of(conn: sqlite3.Connection) -> dict[int, Handover]:
    """Every row, by memory number (unreadable ones left out)."""
    out: dict[int, Handover] = {}
    for name, value in conn.execute(
        "SELECT name, value FROM keyring_meta WHERE name >= ? AND name < ?", (PREFIX, PREFIX[:-1] + "/")
    ):
        tail = str(name)[len(PREFIX) :]
        if tail.isdigit():
            found = _parse(int(tail), str(value))
            if found is not None:
                out[found.number] = found
    return out


def of(conn: sqlite3.Connection, number: int) -> Handover | None:
    row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (f"{PREFIX}{number}",)).fetchone()
    return None if row is None else _parse(number, str(row[0]))


def put(conn: sqlite3.Connection, h: Handover) -> None:
    value = json.dumps(
        {"grants": h.grants, "appends": h.appends, "made": h.made, "box": None if h.box is None else h.box.hex()},
        sort_keys=True,
    )
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (f"{PREFIX}{h.number}", value),
        )


def drop(conn: sqlite3.Connection, number: int | None = None) -> None:
    """Delete memory ``number``'s row (None: every row)."""
    with write_transaction(conn):
        if number is None:
            conn.execute("DELETE FROM keyring_meta WHERE name >= ? AND name < ?", (PREFIX, PREFIX[:-1] + "/"))
        else:
            conn.execute("DELETE FROM keyring_meta WHERE name = ?", (f"{PREFIX}{number}",))
