"""The server's one OAuth state file, ``DATA/oauth.db`` (schema.sql,
section ``oauth``): what an MCP host's authorization flow needs between two
of its requests, which any worker may answer (docs/DESIGN.md, "Remote MCP").

Three kinds of row, each short-lived: a registered client (until it is
first approved, at most :data:`UNUSED_CLIENT_S`), a consent page awaiting
its form (:data:`REQUEST_S`), and an approved code (``--oauth-code-seconds``; once
redeemed, its row stays without its token for :data:`REPLAY_S`, so that a
second redemption can be told from an unknown code). The file is plain
SQLite in WAL mode with ``secure_delete`` on; after a code's token is taken
out (redeemed, or expired with its grant) the WAL is folded into the file
and emptied (:func:`flush`), so no page of the file or its WAL holds the
sealed token any more."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import safeopen
from .private_files import create_private
from .sqlite.schema import sections
from .sqlite.transactions import BUSY_TIMEOUT_MS, checkpoint, write_transaction

FILE = "oauth.db"
REPLAY_S = 600  # a redeemed code's row (no token) is kept this long, so a replay revokes its grant
REQUEST_S = 600  # a consent page's form is taken this long after the page was shown
UNUSED_CLIENT_S = 3600  # a registered client never approved is forgotten after this


def now() -> int:
    return int(time.time())


@contextlib.contextmanager
def opened(data_dir: Path) -> Iterator[sqlite3.Connection]:
    """The state file, made (0600) on first use, for the block."""
    path = Path(data_dir) / FILE
    create_private(path)
    conn = safeopen.open_plain(path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
        conn.executescript(sections()["oauth"])
        yield conn
    finally:
        safeopen.close(conn)


def exists(data_dir: Path) -> bool:
    return (Path(data_dir) / FILE).is_file()


def flush(conn: sqlite3.Connection) -> bool:
    """Fold the WAL into the file and empty it: True once no frame of it is left."""
    return checkpoint(conn)


# ---------------------------------------------------------------- clients


def put_client(conn: sqlite3.Connection, client_id: str, metadata: dict[str, Any]) -> None:
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO oauth_clients(client_id, metadata, created) VALUES (?, ?, ?)",
            (client_id, json.dumps(metadata), now()),
        )


def client(conn: sqlite3.Connection, client_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT metadata FROM oauth_clients WHERE client_id = ?", (client_id,)).fetchone()
    if row is None:
        return None
    found: dict[str, Any] = json.loads(row[0])
    return found


# ---------------------------------------------------------------- consent pages


def put_request(conn: sqlite3.Connection, nonce_id: bytes, request: dict[str, Any]) -> None:
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO oauth_requests(id, request, expires) VALUES (?, ?, ?)",
            (nonce_id, json.dumps(request), now() + REQUEST_S),
        )


def take_request(conn: sqlite3.Connection, nonce_id: bytes) -> dict[str, Any] | None:
    """The request a consent form answers, taken once: a nonce posted twice finds nothing."""
    with write_transaction(conn):
        row = conn.execute("DELETE FROM oauth_requests WHERE id = ? RETURNING request, expires", (nonce_id,)).fetchone()
    if row is None or row[1] <= now():
        return None
    taken: dict[str, Any] = json.loads(row[0])
    return taken


# ---------------------------------------------------------------- codes


def put_code(conn: sqlite3.Connection, code_id: bytes, approval: dict[str, Any], sealed: bytes, lifetime: int) -> None:
    """File an approved code for ``lifetime`` seconds (``--oauth-code-seconds``, at most 55)."""
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO oauth_codes(id, approval, sealed, expires) VALUES (?, ?, ?, ?)",
            (code_id, json.dumps(approval), sealed, now() + lifetime),
        )
        client_id = approval.get("client_id")
        conn.execute("UPDATE oauth_clients SET used = ? WHERE client_id = ? AND used IS NULL", (now(), client_id))


@dataclass(frozen=True)
class Redemption:
    """A code looked up once: its approval, and its sealed token (None: redeemed before, a replay)."""

    approval: dict[str, Any]
    sealed: bytes | None


def approval_of(conn: sqlite3.Connection, code_id: bytes) -> dict[str, Any] | None:
    """The approval a code was filed with, whatever its state (None: unknown); nothing is taken."""
    row = conn.execute("SELECT approval FROM oauth_codes WHERE id = ?", (code_id,)).fetchone()
    if row is None:
        return None
    approval: dict[str, Any] = json.loads(row[0])
    return approval


def redeem(conn: sqlite3.Connection, code_id: bytes) -> Redemption | None:
    """Take a live code's sealed token out of the file, once; None for a code that is unknown or past its
    time. A code redeemed before answers its approval without a token, and its row goes: one replay
    revokes, a second finds nothing. The caller flushes the file once the token is out (:func:`flush`)."""
    with write_transaction(conn):
        row = conn.execute(
            "SELECT approval, sealed, expires, redeemed FROM oauth_codes WHERE id = ?", (code_id,)
        ).fetchone()
        if row is None or (row[3] is None and row[2] <= now()):
            return None  # an expired, unredeemed code is the sweep's: its grant goes with it
        approval = json.loads(row[0])
        if row[3] is not None:
            conn.execute("DELETE FROM oauth_codes WHERE id = ?", (code_id,))
            return Redemption(approval, None)
        conn.execute(
            "UPDATE oauth_codes SET sealed = NULL, redeemed = ?, expires = ? WHERE id = ?",
            (now(), now() + REPLAY_S, code_id),
        )
        return Redemption(approval, bytes(row[1]))


def unredeemed_past(conn: sqlite3.Connection) -> list[tuple[bytes, dict[str, Any]]]:
    """Every code past its time that nobody redeemed: each grant to withdraw, then :func:`drop_code`."""
    rows = conn.execute(
        "SELECT id, approval FROM oauth_codes WHERE redeemed IS NULL AND expires <= ?", (now(),)
    ).fetchall()
    return [(bytes(r[0]), json.loads(r[1])) for r in rows]


def drop_code(conn: sqlite3.Connection, code_id: bytes) -> None:
    """Delete an unredeemed code past its time (its grant withdrawn first)."""
    with write_transaction(conn):
        conn.execute("DELETE FROM oauth_codes WHERE id = ? AND redeemed IS NULL AND expires <= ?", (code_id, now()))


def forget_old(conn: sqlite3.Connection) -> None:
    """Delete what has lived its time: consent pages, redeemed codes past their replay window, clients never
    approved."""
    with write_transaction(conn):
        conn.execute("DELETE FROM oauth_requests WHERE expires <= ?", (now(),))
        conn.execute("DELETE FROM oauth_codes WHERE redeemed IS NOT NULL AND expires <= ?", (now(),))
        conn.execute("DELETE FROM oauth_clients WHERE used IS NULL AND created <= ?", (now() - UNUSED_CLIENT_S,))
