#!/usr/bin/env python3
"""stash — the command-line client of a Stash memory server.

One file, Python 3 standard library only: fetch it from any server with

    curl -o stash "$STASH_URL/client" && chmod +x stash

It reads two environment variables, the whole integration:

    STASH_URL    the server's address, like https://stash.example
    STASH_TOKEN  your capability (a secret: never print it, never commit it)

Every instruction it prints is a command that runs as printed. The server's
prompts end with a line "Run: curl ..."; this client swaps each such curl
command for its own equivalent verb.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import hashlib
import http.client
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# What this module offers the package: the verbs (main, VERBS) and what stash mcp (stash/cli/mcp_server.py) and
# stash/cli/main.py call; tests/unit/test_tooling.py holds it to their use.
LIBRARY = [
    "Stash",
    "StashError",
    "Unreachable",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "NotAllowed",
    "Conflict",
    "NapNeeded",
    "TooLarge",
    "Misdirected",
    "Invalid",
    "RateLimited",
    "ServerError",
    "error_class",
    "Nap",
    "Wake",
    "WakePart",
    "Noted",
    "Saved",
    "Batch",
    "Found",
    "Zoomed",
    "Forgot",
    "Imported",
    "Sizes",
    "Initialized",
    "Grant",
    "Minted",
    "Revoked",
    "Rotated",
    "Receipt",
    "Undone",
    "MemoryInfo",
    "Unopened",
    "Listed",
    "Forked",
    "Destroyed",
    "Matched",
    "Health",
    "Archive",
]
__all__ = [
    "VERBS",
    "Failure",
    "Steps",
    "batch_lines",
    "closed_pipe",
    "command_memory",
    "forget_lines",
    "is_block",
    "main",
    "nap_lines",
    "note_lines",
    "recall_lines",
    "recall_words_lines",
    "refused",
    "server_url",
    "summaries_lines",
    "token",
    "wake_lines",
    "zoom_lines",
    # the library (CLIENT.md, "The Python library")
    *LIBRARY,
]

# The verbs of the installed package that this one file lacks (stash/cli/main.py's HOST_VERBS): named so
# that asking the one file for one says where it is instead of "invalid choice".
PACKAGE_VERBS = ("serve", "backup", "verify", "replicate", "restore", "migrate", "compact", "mcp", "fleet")

VERBS = {
    "init": "mint a new identity on URL, with its first memory, main: prints the two export lines (its token "
    'shown once) for eval "$(stash init URL)", and the block for AGENTS.md on stderr',
    "wake": "read the wake, part by part, until it says you are awake",
    "note": "record one note: a line of lasting effect",
    "nap": "show the due compression, or answer it: nap <block> - with your line on standard input; take many at "
    "once: nap --batch K",
    "recall": "search every note of the memory with a regex, or by words with --words (prefixes, any case or "
    "accent, best first)",
    "zoom": "open a block of the wake into its two halves",
    "forget": "drop a bad summary, the block containing it at each larger size, and every later summary of "
    "those sizes; the naps that follow write them again",
    "config": "show the sizes, or set them: config NAME=VALUE (empty value restores the default)",
    "import": "bulk-append dated notes from a file of 'YYYY-MM-DD text' lines",
    "grants": "list capabilities, mint one (read | append | full; --memory NAME binds it to that memory), or "
    "revoke one (revoke ID)",
    "memories": "the owner's memories: list; create NAME; delete NAME --yes; fork SOURCE NAME [--at N]; "
    "erase --q REGEX [--memory NAME ...] [--dry-run]",
    "erase": "shred notes for good by id (owner): erase ID [ID ...]",
    "erasures": "list the erasure receipts (owner)",
    "undo": "erase what one capability wrote (undo --grant ID) or a range (undo --first I --last J), slice by "
    "slice (owner); revoke the capability first",
    "rotate": "replace the owner token: prints the new one once and uses it, which ends the old one (owner)",
    "destroy": "destroy the whole identity, every memory and every token of it (owner): destroy --yes",
    "export": "download the whole memory as an OptMem folder (or a .tar.gz) and check its manifest",
    "import-optmem": "move an OptMem memory folder (LOG.txt, TREE/, config) into this empty memory (or, with "
    "--memory NAME, into that memory of the owner's)",
    "health": "check that the server answers, and which ciphers it uses",
    "unpin": "forget the log head this client pinned for this memory, to accept an older state restored on purpose",
}

TIMEOUT = 30.0
LONG_TIMEOUT = 300.0
IMPORT_BATCH_BYTES = 8 * 1024 * 1024  # well under the server's 16 MiB import cap
IMPORT_BATCH_ENTRIES = 10_000  # the server's default --import-per-request for a full capability
# Writes that carry an Idempotency-Key, so that resending one whose answer was
# lost cannot write twice: the server replays the first answer instead. Written
# from the server's route declarations by `python -m stash.web.refgen --write`.
# <!-- generated: keyed writes -->
KEYED_WRITES = frozenset(
    {
        ("DELETE", "/grants/{grant_id}"),
        ("POST", "/erase"),
        ("POST", "/erase/undo"),
        ("POST", "/grants"),
        ("POST", "/import"),
        ("POST", "/nap"),
        ("POST", "/note"),
        ("POST", "/rotate"),
    }
)
# <!-- end generated -->
_KEYED = [
    (method, re.compile("[^/]+".join(map(re.escape, re.split(r"\{\w+\}", path))))) for method, path in KEYED_WRITES
]


def is_keyed(method: str, path: str) -> bool:
    """The request is one of the server's keyed writes (a path like
    ``/grants/7`` matches its route's ``/grants/{grant_id}``)."""
    return any(m == method and pattern.fullmatch(path) for m, pattern in _KEYED)


RETRIES = 4  # resends of a keyed write after the first try
RETRY_PAUSE = 0.5  # seconds before the first resend, doubling each time
RETRY_STATUSES = (502, 503, 504)
BUSY_RETRIES = 3  # resends of a request refused 429 busy.* (refused before any work, so always safe to resend)
BUSY_WAIT_MAX = 10.0  # seconds: a longer Retry-After is reported instead of waited for
# Refusals that say nothing was done and the same request will go through: a revocation moved the key
# epoch while the request opened the memory. Resent like a busy refusal, after a short pause.
REDO_CODES = ("store.rekeyed",)
REDO_WAIT = 0.2
# A fleet's shard moving to another host (503 fleet.moving): nothing was done, and the move takes seconds.
MOVING_CODE = "fleet.moving"
MOVING_RETRIES = 15
_DATED = re.compile(r"(?:#\d+\s+)?(\d{4}-\d{2}-\d{2})\s+(.*)")


# Exit statuses a script can rely on (API-REFERENCE.md, "The stash client").
OK = 0
REFUSED = 1  # the server answered with an error: its message is on stderr
USAGE = 2  # wrong arguments, STASH_URL or STASH_TOKEN unset or malformed, an unreadable file
UNREACHABLE = 3  # no answer from a Stash server: connection, DNS, timeout, or not Stash at that address
INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports it
CLOSED_PIPE = 141  # whoever read the output stopped reading (`| head`), as a shell reports SIGPIPE

# --json: print each answer of the server as it came, one JSON document per line, instead of text.
_JSON = {"on": False}


class Failure(Exception):
    """A refusal to report: ``message`` goes to stderr, ``code`` is the exit status;
    ``body`` is the server's error object, printed on stdout under --json."""

    def __init__(
        self,
        message: str,
        code: int = REFUSED,
        extra: str | None = None,
        status: int | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.extra = extra
        self.status = status  # the HTTP status of a server refusal, else None
        self.body = body


# ---------------------------------------------------------------- the command this client is run as


def _prog() -> str:
    """The shortest shell words that run this client again, so that printed
    commands run as printed: ``stash`` when ``stash`` on PATH is this client,
    else the shortest path to it (relative to the working folder or
    absolute), with the interpreter in front only when the file cannot run
    by itself."""
    a0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(a0) == "__main__.py":  # python -m stash
        return "stash" if _stash_on_path_runs(None) else f"{_interpreter()} -m stash"
    if a0 and os.path.isfile(a0):
        if _stash_on_path_runs(a0):
            return "stash"
        if os.access(a0, os.X_OK) and _starts_with(a0, b"#!"):
            return shell_word(_shortest_path(a0))
        return f"{_interpreter()} {shell_word(_shortest_path(a0))}"
    return "stash"


def _stash_on_path_runs(script: str | None) -> bool:
    """Whether ``stash`` as found on PATH runs this client: the very file
    ``script`` (through any symlink), or, for ``python -m stash`` (``script``
    None), a launcher whose ``#!`` line names this same interpreter."""
    found = shutil.which("stash")
    if found is None:
        return False
    if script is not None:
        return os.path.realpath(found) == os.path.realpath(script)
    return _starts_with(found, b"#!" + os.fsencode(sys.executable) + b"\n")


def _starts_with(path: str, prefix: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(prefix)) == prefix
    except OSError:
        return False


def _interpreter() -> str:
    """This interpreter as the shortest words that start it: ``python3`` or
    ``python`` when that name on PATH is this very path (compared without
    resolving symlinks: a virtual environment's python is a symlink whose
    own path decides which packages it sees), else its shortest path."""
    here = os.path.abspath(sys.executable)
    for name in ("python3", "python"):
        found = shutil.which(name)
        if found is not None and os.path.abspath(found) == here:
            return name
    return shell_word(_shortest_path(here))


def _shortest_path(path: str) -> str:
    """``path`` relative to the working folder or absolute, whichever is
    shorter; a relative one always holds a slash, so the shell never looks
    it up on PATH instead."""
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # another drive
        return absolute
    if os.sep not in relative:
        relative = os.curdir + os.sep + relative
    return min(relative, absolute, key=len)


def shell_word(text: str) -> str:
    """``text`` as one POSIX shell word that the shell passes on unchanged and
    that runs nothing: single quotes around it (inside them no character is
    special, not even ``$``, backquote, backslash or ``!``), each single quote
    of the text written as ``'"'"'``. This is shlex.quote, named here because
    every printed command with data in it must go through it."""
    return shlex.quote(text)


DELIMITER = "STASH_END"  # the server's too: no line a note, summary or pattern accepts equals it
_BLOCK_ID = re.compile(r"[0-9]{1,19}-[0-9]{1,19}")
BATCH_OFFER = (
    "Or write {k} of the due blocks as one batch (by yourself, or split them among parallel subagents that "
    "only write lines and never call Stash):"
)


def _heredoc(command: str, lines: list[str]) -> str:
    """``command`` reading ``lines`` from a quoted here-document: the shell
    passes every byte of them on, so a placeholder replaced by any line a
    memory may hold reaches the server exactly."""
    return f"{command} <<'{DELIMITER}'\n" + "\n".join(lines) + f"\n{DELIMITER}"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _block(value: object) -> bool:
    return isinstance(value, str) and _BLOCK_ID.fullmatch(value) is not None


is_block = _block  # its public name, for stash mcp


class Steps:
    """How a next step is named: here as a command of this client that runs
    as printed in sh, dash or bash; ``stash mcp`` names tool calls instead.
    Each is built from the server's step object (``run`` in its answers):
    only its numbers and block ids, each checked, reach a command, and the
    text an agent fills in is this client's own placeholder."""

    lead = "Run: "

    def wake(self, part: int | None = None, T: int | None = None) -> str:
        return f"{_prog()} wake" if part is None else f"{_prog()} wake {part} {T}"

    def nap(self, block: str | None = None) -> str:
        if block is None:
            return f"{_prog()} nap"
        return _heredoc(f"{_prog()} nap {block} -", ["<your line>"])

    def note(self) -> str:
        return _heredoc(f"{_prog()} note -", ["<one line>"])

    def nap_batch(self, k: int) -> str:
        return f"{_prog()} nap --batch {k}"

    def nap_summaries(self, blocks: list[str]) -> str:
        return _heredoc(f"{_prog()} nap --summaries -", [f"{b} <your line for {b}>" for b in blocks])

    def zoom(self, block: str | None = None) -> str:
        """The zoom template, or with ``block`` (a checked block id the server named) the zoom of it."""
        return _heredoc(f"{_prog()} zoom -", ["<lo-hi>"]) if block is None else f"{_prog()} zoom {block}"

    def recall(self, before: int | None = None) -> str:
        more = "" if before is None else f" --before {before}"
        return _heredoc(f"{_prog()} recall -{more}", ["<the same regex>" if before is not None else "<regex>"])

    def recall_words(self, before: str | None = None) -> str:
        more = "" if before is None else f" --before {before}"
        return _heredoc(f"{_prog()} recall --words -{more}", ["<the same words>" if before is not None else "<words>"])

    def render(self, step: object) -> str | None:
        """This client's command for one of the server's step objects; None
        for a step it does not know (a newer server's), which is left out."""
        if not isinstance(step, dict) or not isinstance(step.get("fields"), dict):
            return None
        path, fields = step.get("path"), step["fields"]
        keys = set(fields)
        if path == "/wake":
            if not keys:
                return self.wake()
            if keys == {"part", "T"} and _whole(fields["part"]) and _whole(fields["T"]):
                return self.wake(fields["part"], fields["T"])
        elif path == "/nap":
            if not keys:
                return self.nap()
            if keys == {"block", "text"} and _block(fields["block"]):
                return self.nap(fields["block"])
            if keys == {"batch"} and _whole(fields["batch"]):
                return self.nap_batch(fields["batch"])
            items = fields.get("summaries")
            if (
                keys == {"summaries"}
                and isinstance(items, list)
                and items
                and all(isinstance(x, dict) and _block(x.get("block")) for x in items)
            ):
                return self.nap_summaries([x["block"] for x in items])
        elif path == "/note" and keys == {"text"}:
            return self.note()
        elif path == "/recall" and "q" in keys and keys <= {"q", "before"}:
            before = fields.get("before")
            if before is None or _whole(before):
                return self.recall(before)
        elif path == "/recall" and "words" in keys and keys <= {"words", "before"}:
            before = fields.get("before")
            if before is None or (isinstance(before, str) and _CURSOR.fullmatch(before)):
                return self.recall_words(before)
        elif path == "/zoom" and keys == {"block"}:
            named = fields["block"] not in (step.get("placeholders") or []) and _block(fields["block"])
            return self.zoom(fields["block"] if named else None)
        return None

    def orders(self, run: object) -> list[str]:
        """Each known step of ``run`` as an order on its own line."""
        steps = run if isinstance(run, list) else []
        return [self.lead + cmd for cmd in (self.render(s) for s in steps) if cmd is not None]


SHELL = Steps()


def nap_text(nap: object, steps: Steps = SHELL) -> str | None:
    """A nap object as OptMem's prompt, its commands in ``steps``' terms.
    Rendered from the object's fields, never from the server's ``prompt``:
    each source line (memory text) is shown as one indented data line."""
    if not isinstance(nap, dict) or not _block(nap.get("block")):
        return None
    source = [x for x in nap.get("source") or [] if isinstance(x, str)]
    left = nap.get("remaining") if _whole(nap.get("remaining")) else 0
    limit = nap.get("max_bytes") if _whole(nap.get("max_bytes")) else 280
    tail = (
        ""
        if not left
        else "\n" + ("1 compression remains" if left == 1 else f"{left} compressions remain") + " after this one."
    )
    run: list[Any] = nap["run"] if isinstance(nap.get("run"), list) else []
    first = [
        s
        for s in run
        if isinstance(s, dict)
        and s.get("path") == "/nap"
        and isinstance(s.get("fields"), dict)
        and set(s["fields"]) == {"block", "text"}
    ]
    text = (
        f"Compress memories #{nap['block']} into one line of at most {limit} bytes.\n"
        "Keep what has lasting effect, drop what does not. Invent nothing.\n\n"
        + "\n".join("  " + line for line in source)
        + f"\n{tail}\n"
        + "\n".join(steps.orders(first[:1] or [{"path": "/nap", "fields": {"block": nap["block"], "text": ""}}]))
    )
    for s in run:
        if isinstance(s, dict) and isinstance(s.get("fields"), dict) and set(s["fields"]) == {"batch"}:
            order = steps.orders([s])
            if order:
                text += f"\n{BATCH_OFFER.format(k=s['fields']['batch'])}\n" + order[0]
    return text


# ---------------------------------------------------------------- HTTP


def _env(name: str, hint: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise Failure(f"stash: {name} is not set. {hint}", USAGE)
    return value


def _shown(url: str) -> str:
    """The address without any user:password part, fit to print."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def address(
    explicit: str | None = None,
    fallback: str | None = None,
    explicit_is: str = "the URL argument",
    fallback_is: str = "--url",
) -> tuple[str, str]:
    """The server's address and where it came from, in words an error can
    name: ``explicit`` (a command's argument) first, else STASH_URL, else
    ``fallback``. An address that is not http(s) is refused naming its source,
    so a mistyped argument is never reported as a bad STASH_URL."""
    for value, source in ((explicit, explicit_is), (os.environ.get("STASH_URL"), "STASH_URL"), (fallback, fallback_is)):
        url = (value or "").strip()
        if not url:
            continue
        if not url.startswith(("http://", "https://")):
            raise Failure(f"stash: {source} must start with http:// or https:// (it is {_shown(url)!r}).", USAGE)
        return url.rstrip("/"), source
    raise Failure(
        "stash: STASH_URL is not set. Set it to the server's address, like export STASH_URL=https://stash.example",
        USAGE,
    )


def server_url(fallback: str | None = None, explicit: str | None = None) -> str:
    return address(explicit, fallback)[0]


def token() -> str:
    return _env(
        "STASH_TOKEN",
        f"Set it to your capability (export STASH_TOKEN=...); a new identity gets one from: {_prog()} init",
    )


# ---------------------------------------------------------------- pinning
# The client remembers the last log head the server answered for each memory
# (server address and user id, never the token) and sends it as Stash-Pin,
# so a memory put back whole from an older copy, which the server alone
# cannot tell from the real one, is refused (409 store.pin_mismatch).

PIN_RE = re.compile(r"\d{1,18}:[0-9a-f]{64}(?::\d{1,18})?")


def pins_path() -> Path:
    """$STASH_PINS, else $XDG_CONFIG_HOME/stash/pins.json (~/.config/stash/pins.json)."""
    explicit = os.environ.get("STASH_PINS", "").strip()
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "stash" / "pins.json"


def _pin_key(url: str, tok: str | None) -> str | None:
    m = re.fullmatch(r"stash1_([0-9a-f]{16})_[0-9A-Za-z]{49}", tok or "")
    return f"{url}|{m.group(1)}" if m else None


def _read_pins() -> dict[str, Any]:
    try:
        data = json.loads(pins_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_pins(pins: dict[str, Any]) -> None:
    """Atomically (a rename), so two clients never leave half a file; best
    effort: a client that cannot write its pins still works, unpinned."""
    path = pins_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def pinned(url: str, tok: str | None) -> str | None:
    key = _pin_key(url, tok)
    pin = _read_pins().get(key) if key else None
    return pin if isinstance(pin, str) and PIN_RE.fullmatch(pin) else None


def remember_pin(url: str, tok: str | None, pin: object) -> None:
    """Keep ``pin`` if it is further along than the one kept (only forward:
    an answer that arrives late never moves the pin back)."""
    key = _pin_key(url, tok)
    if key is None or not isinstance(pin, str) or not PIN_RE.fullmatch(pin):
        return
    pins = _read_pins()
    old = pins.get(key)
    if isinstance(old, str) and PIN_RE.fullmatch(old) and _pin_order(old) >= _pin_order(pin):
        return
    pins[key] = pin
    _write_pins(pins)


def _pin_order(pin: str) -> tuple[int, int]:
    """How far a pin is along: its log's count, then its state version."""
    parts = pin.split(":")
    return int(parts[0]), int(parts[2]) if len(parts) > 2 else -1


def forget_pin(url: str, tok: str | None) -> bool:
    key = _pin_key(url, tok)
    pins = _read_pins()
    if key is None or key not in pins:
        return False
    del pins[key]
    _write_pins(pins)
    return True


def _pinning() -> bool:
    return os.environ.get("STASH_PIN", "").strip().lower() not in ("0", "off", "no", "false")


class Api:
    """The HTTP under :class:`Stash`, the one way every call reaches the server at ``url`` with the
    capability ``tok``: Idempotency-Keys on keyed writes and resends of them when an answer is lost, waits
    on busy refusals, the memory's log head pinned (see pins_path) unless ``pin`` is False (None: as
    STASH_PIN says). A refusal raises the :class:`StashError` subclass of its code and status; ``source``
    is where the address came from, as its messages name it."""

    def __init__(
        self, url: str, tok: str | None, source: str = "STASH_URL", pin: bool | None = None, cli: bool = False
    ) -> None:
        self.url = url
        self._token = tok
        self._pin = pin  # None: as STASH_PIN says
        self.source = source  # where the address came from, as errors name it
        self.cli = cli  # the stash command calls (its advice names commands), not a program (it names calls)

    def pinning(self) -> bool:
        """Whether this client pins the memory's log head: as it was made, else as STASH_PIN says."""
        return _pinning() if self._pin is None else self._pin

    def where(self) -> str:
        """The server as an error names it: with where its address came from."""
        if self.source == "STASH_URL":
            return f"STASH_URL={_shown(self.url)}"
        return f"{_shown(self.url)} ({self.source})"

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        query: dict[str, Any] | None = None,
        raw: bool = False,
        timeout: float = TIMEOUT,
        own: bool = True,
    ) -> Any:
        """One route, answered as JSON (``raw``: its bytes). ``own`` False: the call opens another memory
        than the one at ``url`` (a fork's source), so this memory's pin is neither sent nor moved."""
        pinning = own and self.pinning()
        target = self.url + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        data = None
        headers = {"Accept": "application/json", "User-Agent": "stash-client/1"}
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
            pin = pinned(self.url, self._token) if pinning else None
            if pin:
                headers["Stash-Pin"] = pin
        keyed = is_keyed(method, path)
        if keyed:
            headers["Idempotency-Key"] = str(uuid.uuid4())
        req = urllib.request.Request(target, data=data, headers=headers, method=method)  # noqa: S310 - http(s) only
        attempt = busy = 0
        while True:
            try:
                payload = self._send(req, timeout)
                break
            except _Busy as b:
                # Refused before anything was done: wait as told, then the same request again.
                if busy >= b.resends or b.wait > BUSY_WAIT_MAX:
                    raise b.error from None
                busy += 1
                time.sleep(b.wait * (1 + random.random() / 4))
                continue
            except _Lost as lost:
                if not keyed or attempt == RETRIES:
                    raise lost.error from None
            # The same request, same key: if the first one was written, the
            # server answers what it answered then and writes nothing.
            time.sleep(RETRY_PAUSE * 2**attempt * (1 + random.random() / 4))
            attempt += 1
        if raw:
            return payload
        try:
            answer = json.loads(payload.decode("utf-8"))
        except ValueError:
            raise Unreachable(
                f"stash: the server at {self.where()} did not answer JSON; is that the address of a Stash server?"
            ) from None
        if isinstance(answer, dict) and isinstance(answer.get("head"), dict) and pinning:
            remember_pin(self.url, self._token, answer["head"].get("pin"))
        if _JSON["on"]:
            _emit_json(answer)
        return answer

    def _send(self, req: urllib.request.Request, timeout: float) -> bytes:
        """One try: the answer's bytes, a :class:`StashError`, or :class:`_Lost`
        when the answer may have been lost on the way (a dropped connection,
        a timeout, or a gateway's 502/503/504), which a keyed write resends."""
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) checked above
                data: bytes = resp.read()
                return data
        except urllib.error.HTTPError as err:
            if err.code in RETRY_STATUSES:
                lost = self._refusal(err)
                if lost.code == MOVING_CODE:
                    raise _Busy(lost, _retry_after(err.headers.get("Retry-After")), MOVING_RETRIES) from None
                raise _Lost(lost) from None
            error = self._refusal(err)
            if err.code == 429 and error.code.startswith("busy."):
                raise _Busy(error, _retry_after(err.headers.get("Retry-After"))) from None
            if error.code in REDO_CODES:
                raise _Busy(error, REDO_WAIT) from None
            raise error from None
        except urllib.error.URLError as err:
            unreachable = Unreachable(
                f"stash: cannot reach the server at {self.where()} "
                f"({_reason(err.reason)}). Check the address and that the server is running."
            )
            if isinstance(err.reason, (ConnectionError, TimeoutError, socket.timeout)):
                raise _Lost(unreachable) from None
            raise unreachable from None
        except (TimeoutError, socket.timeout):  # noqa: UP041 - distinct classes before Python 3.10
            raise _Lost(
                Unreachable(f"stash: the server at {self.where()} did not answer within {timeout:.0f} s; try again.")
            ) from None
        except (OSError, http.client.HTTPException) as err:
            raise _Lost(
                Unreachable(f"stash: the connection to {self.where()} failed ({_reason(err)}); try again.")
            ) from None

    def _refusal(self, err: urllib.error.HTTPError) -> StashError:
        """The refusal as its :class:`StashError` (see :func:`error_class`); an answer that is no Stash error
        object is :class:`Unreachable`, since what answered is not a Stash server."""
        try:
            body = json.loads(err.read().decode("utf-8"))
        except (ValueError, OSError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("message"), str):
            return Unreachable(
                f"stash: the server at {self.where()} answered HTTP {err.code} "
                "without a Stash error; is that the address of a Stash server?"
            )
        error = body.get("error")
        code = error if isinstance(error, str) else ""
        message = self.token_refused() if code == "auth.invalid" else body["message"]
        return error_class(code, err.code)(message, code, err.code, body)

    def token_refused(self) -> str:
        """The 401 as this client's user acts on it: the server's sentence
        is curl's (an Authorization header); for the command the token is
        STASH_TOKEN, for a program the token it gave :class:`Stash`."""
        if not self.cli:
            return (
                f"stash: the server at {self.where()} refused the token given to Stash: it is mistyped, "
                "revoked, expired or another server's (each gets this same answer). Pass a valid capability "
                "token, or mint a new identity with Stash(url, None).init()."
            )
        return (
            f"stash: the server at {self.where()} refused STASH_TOKEN: it is mistyped, revoked or another "
            f"server's (each gets this same answer). Set STASH_TOKEN to a valid capability "
            f"(export STASH_TOKEN=stash1_…), or mint a new identity with: {_prog()} init URL"
        )


def _retry_after(value: str | None) -> float:
    """Seconds to wait from a Retry-After header (delta-seconds); 1 when
    absent or unreadable."""
    try:
        return max(0.0, float(value)) if value is not None else 1.0
    except ValueError:
        return 1.0


class _Busy(Exception):
    """A refusal for want of a free slot (429 busy.*), or one of REDO_CODES:
    nothing was done, so the same request is sent again after ``wait``
    seconds."""

    def __init__(self, error: StashError, wait: float, resends: int = BUSY_RETRIES) -> None:
        super().__init__(error.message)
        self.error = error
        self.wait = wait
        self.resends = resends


class _Lost(Exception):
    """A try whose answer may have been lost; ``error`` is what to report
    if no resend gets one."""

    def __init__(self, error: StashError) -> None:
        super().__init__(error.message)
        self.error = error


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    text = getattr(reason, "strerror", None) or str(reason)
    return text or type(reason).__name__


def _out(text: str = "") -> None:
    """The plain-text answer; under --json the server's own answers stand in for it."""
    if not _JSON["on"]:
        sys.stdout.write(text + "\n")


def _say(text: str = "") -> None:
    """Prose beside an answer that a script reads from standard output (as
    ``eval "$(stash init URL)"`` does): on standard error; under --json the
    server's answer already holds it."""
    if not _JSON["on"]:
        sys.stderr.write(text + "\n")


def _emit_json(answer: object) -> None:
    sys.stdout.write(json.dumps(answer, ensure_ascii=False) + "\n")


def _out_lines(lines: list[str]) -> None:
    for line in lines:
        _out(line)


def _nap_prompt(nap: object, steps: Steps) -> list[str]:
    text = nap_text(nap, steps)
    return ["", text] if text else []


def _api(need_token: bool = True, fallback_url: str | None = None, memory: str | None = None) -> Stash:
    """The memory at STASH_URL, as the library calls it; with ``memory``, its
    memory of that name (``/m/NAME``, the name quoted whole: the server
    refuses one that is not a memory's name)."""
    url = server_url(fallback_url)
    if memory is not None:
        url = f"{url.rstrip('/')}/m/{urllib.parse.quote(memory, safe='')}"
    return command_memory(url, token() if need_token else None, "STASH_URL")


def _identity() -> tuple[Stash, str | None]:
    """For the owner's verbs, which act on the identity whatever memory
    STASH_URL names: the server's root, and the memory STASH_URL's
    ``/m/NAME`` names (None: none, which is main)."""
    url = server_url()
    parts = urllib.parse.urlsplit(url)
    segments = parts.path.rstrip("/").split("/")
    if len(segments) >= 3 and segments[-2] == "m" and segments[-1]:
        root = urllib.parse.urlunsplit(parts._replace(path="/".join(segments[:-2])))
        return command_memory(root, token(), "STASH_URL"), urllib.parse.unquote(segments[-1])
    return command_memory(url, token(), "STASH_URL"), None


def command_memory(url: str, tok: str | None, source: str) -> Stash:
    """The library's :class:`Stash` as the stash command uses it: its
    messages name the command's variables and verbs, not the library's."""
    mem = Stash(url, tok, source=source, pin=None)
    mem._cli = True
    return mem


def refused(error: StashError, steps: Steps = SHELL) -> Failure:
    """A refusal of the library as this command (or ``stash mcp``, with its
    ``steps``) reports it: the server's message, then what the refusal
    carries to do next (the nap, the steps), named as ``steps`` names them;
    no answer from a Stash server is exit status 3."""
    if isinstance(error, Unreachable):
        return Failure(error.message, UNREACHABLE)
    body = error.body
    shown = [text for text in (nap_text(body.get("nap"), steps), *steps.orders(body.get("run"))) if text]
    extra = "\n\n".join(shown) if shown else None
    if error.code == "store.pin_mismatch":
        extra = (
            "This client last saw a longer or different log for this memory, so the server's copy was "
            "rolled back or replaced. If you restored it from a backup on purpose, accept the state it "
            f"has now with: {_prog()} unpin"
        )
    return Failure(error.message, REFUSED, extra, error.status or None, body or None)


# ---------------------------------------------------------------- the agent's verbs, as text
# Each calls the library and returns the lines to show; ``stash mcp`` answers
# its tools with the same lines, its next steps named as tool calls (``steps``).


def wake_lines(mem: Stash, part: int | None = None, T: int | None = None, steps: Steps = SHELL) -> list[str]:
    ans = mem.wake_part(part, T).answer
    out = []
    if _whole(ans.get("parts")) and ans["parts"] > 1:  # the same header as the server's text/plain part
        out.append(
            f"Your memory, part {ans.get('part')} of {ans['parts']}, oldest first "
            f"({plural(ans.get('T', 0), 'memory', 'memories')})."
        )
    out += list(ans.get("lines", []))
    if not ans.get("awake"):
        return out + ["Not awake yet.", *steps.orders(ans.get("run"))]
    out.append(ans.get("message") or "You are awake.")
    return out + steps.orders(ans.get("run")) + _nap_prompt(ans.get("nap"), steps)


def note_lines(mem: Stash, text: str, steps: Steps = SHELL) -> list[str]:
    noted = mem.note(text)
    return [f"Saved as #{noted.id}."] + _nap_prompt(noted.answer.get("nap"), steps)


def nap_lines(mem: Stash, block: str | None = None, text: str | None = None, steps: Steps = SHELL) -> list[str]:
    """Without ``block``, what is due; with it, ``text`` saved as its summary.
    What is given is sent, so the server refuses a ``text`` without ``block``."""
    return saved_text(mem.nap(block, text), block, steps)


def saved_text(saved: Saved, block: str | None, steps: Steps = SHELL) -> list[str]:
    """A nap's answer as text: what is due (asked without ``block``), else what was saved and what is next."""
    ans = saved.answer
    due = nap_text(ans.get("nap"), steps) if block is None else None
    if due:
        return [due]  # what is due: the prompt alone, as memo prints it
    message = ans.get("message") or (f"{ans['saved']} saved." if ans.get("saved") else "")
    out = [message] if message else []
    if ans.get("nap"):
        return out + _nap_prompt(ans["nap"], steps)
    if not message.startswith("Nothing"):
        out.append("Nothing left to compress.")
    return out


def batch_lines(mem: Stash, k: int, steps: Steps = SHELL) -> list[str]:
    """Up to ``k`` due blocks that can be written at once, and the command
    that answers them all."""
    batch = mem.batch(k)
    ans = batch.answer
    items = [it for it in ans.get("batch") or [] if isinstance(it, dict) and _block(it.get("block"))]
    if not items:
        return ["Nothing left to compress."]
    limit = items[0].get("max_bytes") if _whole(items[0].get("max_bytes")) else 280
    if len(items) == 1:
        out = [
            f"Compress this block into one line of at most {limit} bytes.",
            "Keep what has lasting effect, drop what does not. Invent nothing.",
            "",
        ]
    else:
        out = [
            f"Compress each of these {len(items)} blocks into one line of at most {limit} bytes.",
            "Keep what has lasting effect, drop what does not. Invent nothing. Each block stands alone, so they "
            "can be written in parallel (by subagents that only write lines and never call Stash).",
            "",
        ]
    for it in items:
        out += [f"#{it['block']}:", *("  " + x for x in it.get("source") or [] if isinstance(x, str)), ""]
    nap = ans.get("nap")
    after = nap["remaining"] + 1 - len(items) if isinstance(nap, dict) and _whole(nap.get("remaining")) else 0
    if after > 0:
        out.append(
            f"{after} compression{'s' if after != 1 else ''} will remain after these; ask for the next batch then."
        )
    return out + ["Send every line at once, in this order (all or nothing).", *steps.orders(ans.get("run"))]


def read_summaries(text: str) -> list[dict[str, Any]]:
    """``BLOCK LINE`` lines (blank lines skipped) as the summaries of a batch."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        block, _, summary = line.partition(" ")
        if not re.fullmatch(r"\d+-\d+", block) or not summary.strip():
            raise Failure(
                f"stash: line {n} must be a block id and its summary, like: 0-1 chose SQLite. Nothing was sent.", USAGE
            )
        out.append({"block": block, "text": summary.strip()})
    if not out:
        raise Failure("stash: no summaries given; send one 'BLOCK LINE' line per block. Nothing was sent.", USAGE)
    return out


def summaries_lines(mem: Stash, summaries: list[dict[str, Any]], steps: Steps = SHELL) -> list[str]:
    return summaries_text(mem.settle(summaries), steps)


def summaries_text(saved: Saved, steps: Steps = SHELL) -> list[str]:
    ans = saved.answer
    out = [ans.get("message") or ""]
    if ans.get("nap"):
        return out + _nap_prompt(ans["nap"], steps)
    return out + ["Nothing left to compress."]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, its plural (``many``, else ``word`` + s) unless n is 1."""
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def count_line(n: int) -> str:
    """OptMem's count line."""
    return "No match." if n == 0 else "1 match." if n == 1 else f"{n} matches."


def recall_lines(mem: Stash, q: str, before: int | None = None, steps: Steps = SHELL) -> list[str]:
    """The matches, oldest first, then OptMem's count line; when older matches
    were left out, the command that pages to them."""
    found = mem.recall(q, before=before)
    ans = found.answer
    matches = found.matches
    total = int(ans.get("total", len(matches)))
    count = count_line(total)
    if before is not None and total:
        count = count[:-1] + f" before #{before}."
    if isinstance(found.more, int):
        shown = "is" if len(matches) == 1 else "are"
        return matches + [
            f"{count} The newest {len(matches)} {shown} shown; the command below fetches the older ones.",
            *steps.orders(ans.get("run")),
        ]
    if total and not matches:
        return [f"{count} None fits in PART_CHARS bytes; raise PART_CHARS (config) to see them."]
    return matches + [count]


def recall_words_lines(mem: Stash, words: str, before: str | None = None, steps: Steps = SHELL) -> list[str]:
    """The matches, best first, each with its score, then the count line;
    when more were left out, the command that fetches the next page."""
    found = mem.recall(words=words, before=before)
    ans = found.answer
    matches = found.matches
    scores = list(ans.get("scores", []))
    total = int(ans.get("total", len(matches)))
    out = matches + [count_line(total)]
    if isinstance(found.more, str):
        shown = "is" if len(matches) == 1 else "are"
        out[-1] += f" The best {len(matches)} {shown} shown, best first; the command below fetches the next ones."
        out += steps.orders(ans.get("run"))
    elif total and not matches:
        out[-1] += " The next one does not fit in PART_CHARS bytes; raise PART_CHARS (config) to see it."
    if len(scores) == len(matches) and matches:
        out.insert(len(matches), "Scores, best first: " + " ".join(f"{x:.3f}" for x in scores))
    return out


def zoom_lines(mem: Stash, block: str, steps: Steps = SHELL) -> list[str]:
    return mem.zoom(block).lines


def forget_lines(mem: Stash, block: str, steps: Steps = SHELL) -> list[str]:
    """What was dropped, then the nap the answer carries: the first of the
    dropped summaries to write again."""
    forgot = mem.forget(block)
    dropped = forgot.dropped
    out = [
        f"Dropped {plural(len(dropped), 'summary', 'summaries')}: {', '.join(dropped)}. The log is untouched; "
        "the next naps write them again."
    ]
    if forgot.answer.get("nap"):
        return out + _nap_prompt(forgot.answer["nap"], steps)
    return out + [f"{steps.lead}{steps.nap()}"]


# ---------------------------------------------------------------- the library
#
# ``from stash import Stash`` (or ``from client import Stash`` for the file fetched from /client): the routes
# as typed methods, and the one implementation of each call: the verbs above and below, and ``stash mcp``,
# are argument parsing and rendering around these methods. Each call goes through :class:`Api`, so it has
# the client's retries, Idempotency-Keys and pins; a refusal raises the :class:`StashError` subclass of its
# code and status (:func:`error_class`), carrying the server's ``code``, ``status`` and ``message``. Most
# results also carry ``answer``, the server's whole answer, for what the typed fields leave out (its
# ``message`` and ``run`` steps, which the verbs print as they came; fields of later versions): not compared,
# not shown.


class StashError(Exception):
    """A refusal of the server, or no answer from one. ``code`` is the server's stable error code
    (API-REFERENCE.md, "Error codes"), ``status`` the HTTP status (0 when no server answered),
    ``message`` the server's sentence saying what to do next, ``body`` the whole error object."""

    def __init__(self, message: str, code: str = "", status: int = 0, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.body: dict[str, Any] = body or {}


class Unreachable(StashError):
    """No Stash server answered: connection, DNS, timeout, or something else at that address."""


class BadRequest(StashError):
    """400: the request is malformed."""


class Unauthorized(StashError):
    """401: the token is missing, invalid, revoked or expired (one answer for all)."""


class Forbidden(StashError):
    """403: the token's scope is too low for this route, or a quota would be passed."""


class NotFound(StashError):
    """404: no such route, grant, block or memory."""


class NotAllowed(StashError):
    """405: the route does not take that method."""


class Conflict(StashError):
    """409: the state does not allow it now (a nap for another block, a busy key epoch)."""


class NapNeeded(Conflict):
    """409 ``wake.needs_nap``: the wake needs a summary first; ``nap`` is the one to write."""

    @property
    def nap(self) -> Nap | None:
        return Nap.of(self.body.get("nap"))


class TooLarge(StashError):
    """413: the body is over the route's cap."""


class Misdirected(StashError):
    """421: a host of a fleet that does not serve this memory now; the fleet's router does."""


class Invalid(StashError):
    """422: valid JSON with an invalid value."""


class RateLimited(StashError):
    """429: too many requests; the client already waited and resent as told before raising this."""


class ServerError(StashError):
    """5xx: the server failed or its store is unavailable or damaged."""


_BY_STATUS: dict[int, type[StashError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: NotAllowed,
    409: Conflict,
    421: Misdirected,
    413: TooLarge,
    422: Invalid,
    429: RateLimited,
}
_BY_CODE: dict[str, type[StashError]] = {"wake.needs_nap": NapNeeded}


def error_class(code: str, status: int) -> type[StashError]:
    """The class a refusal with this ``code`` and HTTP ``status`` raises: by code where one has its own
    class, else by status (every 5xx a :class:`ServerError`)."""
    return _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else StashError)


def _ints(values: object) -> list[int]:
    return [int(v) for v in values] if isinstance(values, list) else []


def _strs(values: object) -> list[str]:
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


@dataclass(frozen=True)
class Nap:
    """A due compression: write one line of at most ``max_bytes`` bytes summarising ``source``."""

    block: str
    source: list[str]
    remaining: int
    max_bytes: int
    prompt: str

    @classmethod
    def of(cls, value: object) -> Nap | None:
        if not isinstance(value, dict) or not isinstance(value.get("block"), str):
            return None
        return cls(
            value["block"],
            _strs(value.get("source")),
            int(value.get("remaining") or 0),
            int(value.get("max_bytes") or 280),
            str(value.get("prompt", "")),
        )


@dataclass(frozen=True)
class Wake:
    """The whole wake, every part joined: ``lines`` oldest first; ``nap`` the compression due after it."""

    T: int
    lines: list[str]
    nap: Nap | None


@dataclass(frozen=True)
class WakePart:
    """One part of the wake: ``part`` of ``parts`` of the snapshot ``T``; ``awake`` on the last."""

    T: int
    part: int
    parts: int
    lines: list[str]
    awake: bool
    nap: Nap | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Noted:
    id: int
    nap: Nap | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Saved:
    """A nap's answer: ``saved`` the block written (for :meth:`Stash.settle`, the blocks; None when nothing was:
    already settled, or only asked what is due), ``nap`` the next."""

    saved: str | list[str] | None
    nap: Nap | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Batch:
    """Due blocks that can be written at once (``naps``), and the compression due first (``nap``)."""

    naps: list[Nap]
    nap: Nap | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Found:
    """A recall page: ``matches`` (regex: oldest first; words: best first, with ``scores``), ``total`` matches in
    all, ``more`` the ``before`` of the next page (a note id, or a words search's cursor) or None."""

    matches: list[str]
    total: int
    more: int | str | None
    scores: list[float] | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Zoomed:
    block: str
    lines: list[str]
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Forgot:
    dropped: list[str]
    nap: Nap | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Imported:
    first: int
    last: int
    pending: int


@dataclass(frozen=True)
class Sizes:
    """The memory's sizes (WAKE_LINES, ENTRY_CHARS, …) and their defaults."""

    sizes: dict[str, int]
    defaults: dict[str, int]
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Initialized:
    """A new identity: its owner ``token`` (shown this once; the :class:`Stash` that made it now uses it)
    and ``prompt``, the block for AGENTS.md."""

    user_id: str
    token: str
    prompt: str
    note: str | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Grant:
    id: int
    scope: str
    label: str | None
    created: str
    expires: str | None
    revoked: str | None
    live: bool
    last_used: str | None
    you: bool
    memory: str | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, g: dict[str, Any]) -> Grant:
        return cls(
            int(g["id"]),
            str(g["scope"]),
            g.get("label"),
            str(g.get("created", "")),
            g.get("expires"),
            g.get("revoked"),
            bool(g.get("live", not g.get("revoked"))),
            g.get("last_used"),
            bool(g.get("you")),
            g.get("memory"),
            g,
        )


@dataclass(frozen=True)
class Minted:
    """A new capability: ``token`` is shown this once; ``prompt`` is the block for that agent's AGENTS.md."""

    id: int
    scope: str
    token: str
    prompt: str
    memory: str | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Revoked:
    id: int
    revoked: str
    already: bool
    epoch: int | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Rotated:
    """The new owner token (shown this once; the :class:`Stash` that rotated now uses it, and its first use
    retires the old owner capability, ``retires``)."""

    id: int
    token: str
    retires: int
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Receipt:
    receipt: int
    ids: list[int]
    erased: list[int]
    dropped: int
    at: str

    @classmethod
    def of(cls, r: dict[str, Any]) -> Receipt:
        return cls(
            int(r["receipt"]), _ints(r.get("ids")), _ints(r.get("erased")), int(r.get("dropped", 0)), str(r.get("at"))
        )


@dataclass(frozen=True)
class Undone:
    """One slice of an undo: its ``receipt`` (None when the slice held nothing of the grant), and ``more``,
    the ``first`` of the next slice, or None when the range is done."""

    receipt: Receipt | None
    erased: list[int]
    dropped: int
    more: int | None
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class MemoryInfo:
    name: str
    T: int
    bytes: int | None
    created: str | None
    last_write: str | None
    grants: int
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, m: dict[str, Any]) -> MemoryInfo:
        return cls(
            str(m.get("name")),
            int(m.get("T") or 0),
            m.get("bytes"),
            m.get("created"),
            m.get("last_write"),
            int(m.get("grants") or 0),
            m,
        )


@dataclass(frozen=True)
class Unopened:
    """A memory an owner listing could not open (altered, rolled back, the owner not enrolled in it): its
    ``name``, the refusal's ``error`` code and ``message`` (what to do next)."""

    name: str
    error: str
    message: str

    @classmethod
    def of(cls, u: dict[str, Any]) -> Unopened:
        return cls(str(u.get("name")), str(u.get("error")), str(u.get("message", "")))


Row = TypeVar("Row")


class Listed(list[Row]):
    """An owner listing's rows, as a list, and ``unopened``: the memories it could not open, each named, so
    a damaged memory never hides in a listing that looks whole."""

    unopened: list[Unopened]

    def __init__(self, rows: list[Row], answer: dict[str, Any]) -> None:
        super().__init__(rows)
        self.unopened = [Unopened.of(u) for u in answer.get("unopened") or [] if isinstance(u, dict)]


@dataclass(frozen=True)
class Forked:
    """A new memory ``name`` holding the first ``at`` notes of memory ``source`` and ``summaries`` of its summaries."""

    name: str
    source: str
    at: int
    erased: int
    summaries: int
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Destroyed:
    """A memory (or with :meth:`Stash.destroy`, the whole identity) destroyed for good: ``memories`` the notes
    its log held (main's, for an identity), ``at`` when."""

    memory: str | None
    memories: int | None
    at: str
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Matched:
    """An erasure across memories: how many notes matched in each memory named, and in all; erased unless
    ``dry_run``; ``fingerprint`` a keyed fingerprint of the query, never the query."""

    memories: dict[str, int]
    total: int
    dry_run: bool
    at: str
    fingerprint: str
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Health:
    ok: bool
    version: str
    content_cipher: str
    file_cipher: str
    answer: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Archive:
    """An export: the ``.tar.gz`` bytes, its files by name, and its manifest, checked against them."""

    data: bytes = field(repr=False)
    members: dict[str, bytes] = field(repr=False)
    manifest: dict[str, Any]


class Stash:
    """One memory of a Stash server, called with one capability token.

    >>> mem = Stash("http://127.0.0.1:8080", os.environ["STASH_TOKEN"])   # doctest: +SKIP
    >>> mem.note("chose jade over chrome")                                # doctest: +SKIP
    Noted(id=0, nap=None)

    ``url`` may end in ``/m/NAME`` to address memory NAME. Writes the server
    deduplicates are sent with an Idempotency-Key and resent with the same
    key when an answer is lost; the log head is pinned (``pin=False`` turns
    it off; by default STASH_PIN=off does) so a memory rolled back behind the
    client's back is refused rather than served. ``source`` is how error
    messages name where the address came from."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        pin: bool | None = None,
        timeout: float = TIMEOUT,
        source: str = "Stash(url)",
    ) -> None:
        if not isinstance(url, str) or not url.strip().startswith(("http://", "https://")):
            shown = _shown(url) if isinstance(url, str) else type(url).__name__
            raise ValueError(
                f"Stash(url, token): url is the server's address and starts with http:// or "
                f"https://, like http://127.0.0.1:8080 (it is {shown!r})."
            )
        self.url = url.strip().rstrip("/")
        self._token = token
        self._pin = pin
        self.timeout = timeout
        self.source = source
        self._cli = False  # True when the stash command made it (command_memory)

    def _api(self) -> Api:
        return Api(self.url, self._token, source=self.source, pin=self._pin, cli=self._cli)

    def where(self) -> str:
        """The server as an error names it: with where its address came from."""
        return self._api().where()

    def _call(
        self,
        method: str,
        path: str,
        body: object = None,
        timeout: float | None = None,
        raw: bool = False,
        own: bool = True,
    ) -> Any:
        return self._api().call(method, path, body, timeout=timeout or self.timeout, raw=raw, own=own)

    def _answer(
        self, method: str, path: str, body: object = None, timeout: float | None = None, own: bool = True
    ) -> dict[str, Any]:
        ans = self._call(method, path, body, timeout, own=own)
        if not isinstance(ans, dict):
            raise Unreachable(
                f"stash: the server at {self.where()} did not answer a JSON object; "
                "is that the address of a Stash server?"
            )
        return ans

    def request(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        """One route of this memory (``"/wake"``), answered as a JSON object, as every call below is: what
        ``stash mcp``'s tools call (stash/tools/definitions.py)."""
        return self._answer(method, path, body)

    # -- an agent's calls

    def wake_part(self, part: int | None = None, T: int | None = None) -> WakePart:
        """One part of the wake (the first without ``part``); later parts name the ``T`` the first answered.
        The POST twin: no query string, so a broker that refuses them passes it."""
        ans = self._answer("POST", "/wake", {k: v for k, v in (("part", part), ("T", T)) if v is not None})
        return WakePart(
            int(ans.get("T") or 0),
            int(ans.get("part") or 1),
            int(ans.get("parts") or 1),
            _strs(ans.get("lines")),
            bool(ans.get("awake")),
            Nap.of(ans.get("nap")),
            ans,
        )

    def wake(self) -> Wake:
        """Every part of the wake, joined; raises :class:`NapNeeded` when a summary must be written first."""
        first = self.wake_part()
        T, lines, last = first.T, list(first.lines), first
        while not last.awake:
            last = self.wake_part(last.part + 1, T)
            lines += last.lines
        return Wake(T, lines, last.nap)

    def note(self, text: str) -> Noted:
        ans = self._answer("POST", "/note", {"text": text})
        return Noted(int(ans["id"]), Nap.of(ans.get("nap")), ans)

    def due(self) -> Nap | None:
        """The compression due now, if any."""
        return self.nap().nap

    def nap(self, block: str | None = None, text: str | None = None) -> Saved:
        """Save ``text`` as the summary of ``block`` (the due one); with neither, ask what is due. What is
        given is sent, so the server refuses a ``text`` without ``block`` (``nap.missing_block``)."""
        return self._saved(
            self._answer("POST", "/nap", {k: v for k, v in (("block", block), ("text", text)) if v is not None})
        )

    def batch(self, k: int = 16) -> Batch:
        """Up to ``k`` due blocks that can be written at once (then :meth:`settle` them)."""
        ans = self._answer("POST", "/nap", {"batch": k})
        naps = [n for n in (Nap.of(item) for item in ans.get("batch") or []) if n is not None]
        return Batch(naps, Nap.of(ans.get("nap")), ans)

    def naps(self, k: int = 16) -> list[Nap]:
        """Up to ``k`` due blocks that can be written at once (then :meth:`settle` them)."""
        return self.batch(k).naps

    def settle(self, summaries: dict[str, str] | list[dict[str, Any]]) -> Saved:
        """Save a batch's summaries, in order, all or nothing: block → line, or the route's own
        ``[{"block": ..., "text": ...}, ...]``, sent as given."""
        items = [{"block": b, "text": t} for b, t in summaries.items()] if isinstance(summaries, dict) else summaries
        return self._saved(self._answer("POST", "/nap", {"summaries": items}))

    def _saved(self, ans: dict[str, Any]) -> Saved:
        saved = ans.get("saved")
        return Saved(saved if isinstance(saved, (str, list)) else None, Nap.of(ans.get("nap")), ans)

    def recall(self, q: str | None = None, *, words: str | None = None, before: int | str | None = None) -> Found:
        """A regex search (``q``) or a word search (``words``) of the log: one page; ``before`` is the previous
        page's ``more``. The POST twin keeps the pattern (a note's words) out of every URL and access log."""
        if (q is None) == (words is None):
            raise ValueError("give exactly one of q (a regex) or words")
        body: dict[str, Any] = {"q": q} if q is not None else {"words": words}
        if before is not None:
            body["before"] = before
        ans = self._answer("POST", "/recall", body)
        more = ans.get("more")
        scores = ans.get("scores")
        matches = _strs(ans.get("matches"))
        return Found(
            matches,
            int(ans.get("total", len(matches))),
            more if isinstance(more, (int, str)) and not isinstance(more, bool) else None,
            [float(x) for x in scores] if isinstance(scores, list) else None,
            ans,
        )

    def zoom(self, block: str) -> Zoomed:
        ans = self._answer("POST", "/zoom", {"block": block})
        return Zoomed(str(ans.get("block", block)), _strs(ans.get("lines")), ans)

    def forget(self, block: str) -> Forgot:
        ans = self._answer("POST", "/forget", {"block": block})
        return Forgot(_strs(ans.get("dropped")), Nap.of(ans.get("nap")), ans)

    def config(self, changes: Mapping[str, object] | None = None) -> Sizes:
        """The sizes; with ``changes`` (name → whole number, None restores the default), set them first."""
        ans = self._answer("POST", "/config", dict(changes)) if changes is not None else self._answer("GET", "/config")
        return Sizes(dict(ans.get("sizes") or {}), dict(ans.get("defaults") or {}), ans)

    def import_(self, entries: list[tuple[str, str]]) -> Imported:
        """Append dated notes, oldest first: ``[(YYYY-MM-DD, text), ...]``, in batches under the body cap.
        A refusal of a later batch says in its message how many were imported already."""
        first: int | None = None
        last = pending = done = 0
        for batch in _batches([{"date": d, "text": t} for d, t in entries]):
            try:
                ans = self._answer("POST", "/import", {"entries": batch}, timeout=LONG_TIMEOUT)
            except StashError as e:
                if done:
                    e.message += (
                        f" (The first {plural(done, 'entry', 'entries')} "
                        f"{'was' if done == 1 else 'were'} imported already; import the rest from there.)"
                    )
                raise
            first = int(ans["first"]) if first is None else first
            last, pending = int(ans["last"]), int(ans["pending"])
            done += len(batch)
        return Imported(0 if first is None else first, last, pending)

    # -- an owner's calls

    def init(self, url: str | None = None, *, invite: str | None = None) -> Initialized:
        """Mint a new identity on this server (``POST /init``; ``url`` is the address written into its
        block, ``invite`` the operator's secret on a server that mints by invitation); this object uses its
        owner token from now on."""
        body = {k: v for k, v in (("url", url or None), ("invite", invite)) if v is not None}
        ans = self._answer("POST", "/init", body)
        self._token = str(ans["token"])
        note = ans.get("note")
        return Initialized(
            str(ans.get("user_id", "")),
            self._token,
            str(ans.get("prompt", "")),
            note if isinstance(note, str) else None,
            ans,
        )

    def grants(self) -> Listed[Grant]:
        """Every capability of every memory; ``unopened``: the memories whose capabilities could not be read."""
        ans = self._answer("GET", "/grants")
        return Listed([Grant.of(g) for g in ans.get("grants") or [] if isinstance(g, dict)], ans)

    def mint(
        self,
        scope: str,
        *,
        memory: str | None = None,
        label: str | None = None,
        expires: str | None = None,
        url: str | None = None,
    ) -> Minted:
        """A new capability of ``scope`` (read, append or full); ``url`` is the address its block names
        (default: the server's own)."""
        body: dict[str, Any] = {"scope": scope}
        for name, value in (("url", url), ("label", label), ("expires", expires), ("memory", memory)):
            if value is not None:
                body[name] = value
        ans = self._answer("POST", "/grants", body)
        return Minted(
            int(ans["id"]),
            str(ans.get("scope", scope)),
            str(ans["token"]),
            str(ans.get("prompt", "")),
            ans.get("memory", memory),
            ans,
        )

    def revoke(self, grant_id: int) -> Revoked:
        ans = self._answer("DELETE", f"/grants/{int(grant_id)}")
        return Revoked(int(ans["id"]), str(ans["revoked"]), bool(ans.get("already")), ans.get("epoch"), ans)

    def rotate(self) -> Rotated:
        """A new owner token; this object uses it from now on (its first use retires the old one)."""
        ans = self._answer("POST", "/rotate", {})
        self._token = str(ans["token"])
        return Rotated(int(ans["id"]), self._token, int(ans["retires"]), ans)

    def erase(self, ids: list[int]) -> Receipt:
        return Receipt.of(self._answer("POST", "/erase", {"ids": [int(i) for i in ids]}))

    def erasures(self) -> list[Receipt]:
        return [Receipt.of(r) for r in self._answer("GET", "/erasures").get("erasures") or []]

    def undo(self, *, grant: int | None = None, first: int | None = None, last: int | None = None) -> Undone:
        """One slice of erasing what capability ``grant`` wrote (or the ids ``first`` to ``last``); send the
        answer's ``more`` as ``first`` for the next slice."""
        ans = self._answer(
            "POST",
            "/erase/undo",
            {k: v for k, v in (("grant", grant), ("first", first), ("last", last)) if v is not None},
        )
        more = ans.get("more")
        return Undone(
            Receipt.of(ans) if ans.get("receipt") is not None else None,
            _ints(ans.get("erased")),
            int(ans.get("dropped", 0)),
            more if _whole(more) else None,
            ans,
        )

    def memories(self) -> Listed[MemoryInfo]:
        """Every memory of the identity; ``unopened``: those that could not be opened, each named."""
        ans = self._answer("GET", "/memories")
        return Listed([MemoryInfo.of(m) for m in ans.get("memories") or []], ans)

    def create(self, name: str) -> MemoryInfo:
        """A new, empty memory ``name``, served at ``/m/NAME``."""
        return MemoryInfo.of(self._answer("POST", "/memories", {"name": name}))

    def fork(self, source: str, name: str, *, at: int | None = None) -> Forked:
        """A new memory ``name`` holding the first ``at`` (default all) notes of memory ``source``. It opens
        ``source``, not this object's memory, so this memory's pin stays out of it."""
        body: dict[str, Any] = {"name": name} if at is None else {"name": name, "at": at}
        ans = self._answer("POST", f"/memories/{urllib.parse.quote(source, safe='')}/fork", body, own=False)
        return Forked(
            str(ans.get("name")),
            str(ans.get("source")),
            int(ans.get("at") or 0),
            int(ans.get("erased") or 0),
            int(ans.get("summaries") or 0),
            ans,
        )

    def delete(self, name: str) -> Destroyed:
        """Destroy memory ``name`` and every capability of it, for good."""
        ans = self._answer("DELETE", f"/memories/{urllib.parse.quote(name, safe='')}")
        return Destroyed(ans.get("memory"), ans.get("memories"), str(ans.get("at")), ans)

    def erase_matching(
        self,
        q: str | None = None,
        *,
        words: str | None = None,
        memories: list[str] | None = None,
        dry_run: bool = False,
    ) -> Matched:
        """Erase every note matching ``q`` (a regex) or ``words`` in each memory named (default all); with
        ``dry_run``, count only."""
        body: dict[str, Any] = {k: v for k, v in (("q", q), ("words", words)) if v is not None}
        if memories:
            body["memories"] = list(memories)
        if dry_run:
            body["dry_run"] = True
        ans = self._answer("POST", "/memories/erase", body)
        counts = {str(m.get("name")): int(m.get("erased") or 0) for m in ans.get("memories") or []}
        return Matched(
            counts,
            int(ans.get("total") or 0),
            bool(ans.get("dry_run")),
            str(ans.get("at")),
            str(ans.get("fingerprint")),
            ans,
        )

    def destroy(self) -> Destroyed:
        """Destroy the whole identity, every memory and every token of it, for good."""
        ans = self._answer("DELETE", "/store")
        return Destroyed(None, ans.get("memories"), str(ans.get("at")), ans)

    def health(self) -> Health:
        ans = self._answer("GET", "/health")
        return Health(
            bool(ans.get("ok")),
            str(ans.get("version", "?")),
            str(ans.get("content_cipher", "?")),
            str(ans.get("file_cipher", "?")),
            ans,
        )

    def archive(self) -> Archive:
        """The whole memory as OptMem's folder in a .tar.gz, its manifest checked against its files; an
        archive that fails the check raises :class:`ServerError` (status 0: the server answered 200)."""
        data = self._call("GET", "/export", timeout=LONG_TIMEOUT, raw=True)
        try:
            members = archive_members(data)
            return Archive(data, members, check_archive(members))
        except Failure as f:
            raise ServerError(f.message) from None

    def export(self, path: str | Path) -> Path:
        """The whole memory as OptMem's folder in a .tar.gz at ``path``, its manifest checked."""
        target = Path(path)
        target.write_bytes(self.archive().data)
        return target


# ---------------------------------------------------------------- verbs


def do_init(args: argparse.Namespace) -> int:
    """Mint a memory on the server named by URL (else STASH_URL, else
    --url). Standard output is only the two export lines, so that
    ``eval "$(stash init URL)"`` sets both in the calling shell; the token's
    note and the block for AGENTS.md go to standard error. The address
    written into the block is --url, else URL; with neither, the server
    chooses (its own --url, else the address it was called at)."""
    if not (args.server or os.environ.get("STASH_URL", "").strip() or args.url):
        raise Failure(
            f"stash: init needs the server's address: {_prog()} init URL, like {_prog()} init http://127.0.0.1:8080",
            USAGE,
        )
    url, source = address(args.server, args.url, explicit_is="the URL given to init", fallback_is="--url")
    mem = command_memory(url, None, source)
    public = (args.url or args.server or "").rstrip("/")
    made = mem.init(public or None)
    _out(f"export STASH_URL={shell_word(public or mem.url)}")
    _out(f"export STASH_TOKEN={shell_word(made.token)}")
    sys.stdout.flush()
    if made.answer.get("note"):
        _say(made.answer["note"])
        _say()
    _say("Paste this block at the top of your AGENTS.md:")
    _say()
    _say(made.prompt.rstrip("\n"))
    return 0


def do_wake(args: argparse.Namespace) -> int:
    if args.T is not None and args.part is None:
        raise Failure("stash: give the part before T, both as the previous part printed them.", USAGE)
    _out_lines(wake_lines(_api(), args.part, args.T))
    return 0


def do_note(args: argparse.Namespace) -> int:
    _out_lines(note_lines(_api(), _text(args.text, "note")))
    return 0


def do_nap(args: argparse.Namespace) -> int:
    if args.batch is not None or args.summaries is not None:
        if args.block is not None or (args.batch is not None and args.summaries is not None):
            raise Failure(
                f"stash: give one of: {_prog()} nap --batch K, {_prog()} nap --summaries FILE, "
                f"{_prog()} nap BLOCK - (the line on standard input).",
                USAGE,
            )
        if args.batch is not None:
            _out_lines(batch_lines(_api(), args.batch))
            return 0
        mem = _api()
        summaries = read_summaries(_read_text(args.summaries))
        saved = mem.settle(summaries)
        _out_lines(summaries_text(saved))
        return _saved_something(saved)
    text = None if args.block is None else _text(args.text, "summary")
    mem = _api()
    if text is None:
        _out_lines(nap_lines(mem))
        return 0
    saved = mem.nap(args.block, text)
    _out_lines(saved_text(saved, args.block))
    return _saved_something(saved)


def _saved_something(saved: Saved) -> int:
    """The exit status of a write that meant to save: non-zero, with a line
    on stderr, when the answer says nothing was saved (``saved`` null or
    empty), so a script or an agent that only reads the status does not go
    on as if its summaries were kept."""
    answer = saved.answer
    if answer.get("saved") or answer.get("settled"):  # settled: a resend of a block whose summary stands
        return OK
    sys.stdout.flush()
    sys.stderr.write("stash: nothing was saved (see the message above); answer what is due now.\n")
    return REFUSED


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise Failure(f"stash: cannot read {path} as UTF-8 text ({_reason(e)}).", USAGE) from None


_CURSOR = re.compile(r"w1(\.[0-9-]{1,300}){6}")  # a words search's page cursor, as the server writes it


def _stdin_line(value: str) -> str:
    """``value``, or for ``-`` the one line on stdin (its line break removed)."""
    return sys.stdin.read().rstrip("\n") if value == "-" else value


def do_recall(args: argparse.Namespace) -> int:
    if args.words:
        if args.before is not None and not _CURSOR.fullmatch(args.before):
            raise Failure("stash: --before takes the cursor the previous page of a words search printed.", USAGE)
        _out_lines(recall_words_lines(_api(), _stdin_line(args.regex), args.before))
        return 0
    before = args.before
    if before is not None:
        if not (before.isascii() and before.isdigit()):
            raise Failure("stash: --before takes a note id, like --before 40.", USAGE)
        before = int(before)
    _out_lines(recall_lines(_api(), _stdin_line(args.regex), before))
    return 0


def do_zoom(args: argparse.Namespace) -> int:
    _out_lines(zoom_lines(_api(), _stdin_line(args.block).strip()))
    return 0


def do_forget(args: argparse.Namespace) -> int:
    _out_lines(forget_lines(_api(), args.block))
    return 0


def _config_value(text: str) -> object:
    """A size's value as the server takes it: empty, ``null`` (the word the
    server's refusal offers) or ``default`` restore the default."""
    if text in ("", "null", "default"):
        return None
    try:
        return int(text)
    except ValueError:
        return text  # the server says which values it takes


def do_config(args: argparse.Namespace) -> int:
    mem = _api()
    changes: dict[str, object] | None = None
    if args.changes:
        changes = {}
        for item in args.changes:
            name, eq, value = item.partition("=")
            if not eq or not name:
                raise Failure(f"stash: {item!r} is not NAME=VALUE; an empty VALUE restores the default.", USAGE)
            changes[name.strip()] = _config_value(value.strip())
    answer = mem.config(changes)
    sizes, defaults = answer.sizes, answer.defaults
    for name, value in sizes.items():
        mark = "" if defaults.get(name) == value else f"  (default {defaults.get(name)})"
        _out(f"{name}={value}{mark}")
    return 0


def read_entries(path: str) -> list[dict[str, Any]]:
    """``YYYY-MM-DD text`` lines, oldest first; blank lines are skipped and a
    leading ``#i`` (OptMem's LOG.txt record) is accepted and dropped."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as err:
        raise Failure(f"stash: cannot read {path}: {err.strerror or err}.", USAGE) from None
    except UnicodeDecodeError:
        raise Failure(f"stash: {path} is not UTF-8 text.", USAGE) from None
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.rstrip()
        if not line.strip():
            continue
        m = _DATED.fullmatch(line.strip())
        if not m:
            raise Failure(f"stash: {path} line {n} is not 'YYYY-MM-DD text'; nothing was imported.", USAGE)
        entries.append({"date": m.group(1), "text": m.group(2)})
    if not entries:
        raise Failure(f"stash: {path} holds no 'YYYY-MM-DD text' lines; nothing was imported.", USAGE)
    return entries


def _batches(entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for e in entries:
        n = len(json.dumps(e, ensure_ascii=False).encode("utf-8")) + 2
        if out[-1] and (size + n > IMPORT_BATCH_BYTES or len(out[-1]) >= IMPORT_BATCH_ENTRIES):
            out.append([])
            size = 0
        out[-1].append(e)
        size += n
    return out


def _dated(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``{date, text}`` entries as :meth:`Stash.import_` takes them."""
    return [(e["date"], e["text"]) for e in entries]


def do_import(args: argparse.Namespace) -> int:
    mem = _api()
    entries = read_entries(args.file)
    done = mem.import_(_dated(entries))
    first, last, pending = done.first, done.last, done.pending
    _out(f"Imported {plural(len(entries), 'note')}, #{first} to #{last}.")
    if pending:
        _out(f"{plural(pending, 'compression')} {'is' if pending == 1 else 'are'} due, oldest first.")
        _out(f"Run: {_prog()} nap")
    return 0


def _grant_line(g: dict[str, Any]) -> str:
    parts = [f"#{g.get('id')}", str(g.get("scope", "?"))]
    if g.get("memory") not in (None, "main"):
        parts.append(f"memory {g['memory']}")
    if g.get("label"):
        parts.append(json.dumps(g["label"], ensure_ascii=False))
    for key in ("created", "expires", "revoked"):
        if g.get(key):
            parts.append(f"{key} {g[key]}")
    if g.get("last_used"):
        parts.append(f"last used {g['last_used']}")
    if g.get("expired") and not g.get("revoked"):
        parts.append("expired")
    elif not g.get("revoked") and "revoked" in g:
        parts.append("live")
    return "  ".join(parts)


def do_grants(args: argparse.Namespace) -> int:
    mem, here = _identity()
    words = args.words
    if not words:
        listed = mem.grants()
        for g in listed:
            _out(_grant_line(g.answer))
        _out_unopened(listed.unopened, "its capabilities are not listed")
        return 0
    if words[0] in ("read", "append", "full") and len(words) == 1:
        # The address this client calls goes into the agent's block, as init writes it.
        # Bound to the memory named, else to the one STASH_URL names (a capability minted there is for it).
        ans = mem.mint(words[0], memory=args.memory or here, label=args.label, expires=args.expires, url=mem.url).answer
        # The token stays the last line of standard output, for scripts; the agent's block goes beside it.
        if isinstance(ans.get("prompt"), str):
            _say(
                "Paste this block at the top of that agent's AGENTS.md"
                + (" (it says the capability is read-only):" if ans.get("scope") == "read" else ":")
            )
            _say()
            _say(ans["prompt"].rstrip("\n"))
            _say()
        bound = f", bound to memory {ans['memory']}" if ans.get("memory") not in (None, "main") else ""
        _out(
            f"Minted #{ans.get('id')}, scope {ans.get('scope', words[0])}{bound}. "
            "Its token is shown this once; hand it over as STASH_TOKEN:"
        )
        _out(str(ans.get("token")))
        return 0
    if words[0] == "revoke" and len(words) == 2:
        gid = words[1].lstrip("#")
        if not gid.isdigit():
            raise Failure(f"stash: revoke takes the grant's number, as listed by: {_prog()} grants", USAGE)
        ans = mem.revoke(int(gid)).answer
        if isinstance(ans, dict) and ans.get("already"):
            _out(f"#{gid} was revoked already (at {ans.get('revoked')}); nothing changed.")
            return 0
        _out(
            f"Revoked #{gid}: its token opens nothing from now on, and nothing written from now on opens with "
            "it even from old copies of the files."
        )
        if isinstance(ans, dict) and ans.get("also_revoked"):
            ended = ", ".join(f"#{i}" for i in ans["also_revoked"])
            _out(
                f"Also ended: {ended} (not used since the upgrade to key epochs); mint replacements with: "
                f"{_prog()} grants read|full"
            )
        return 0
    raise Failure(
        f"stash: grants takes nothing (list), read, append or full (mint), or revoke ID; the IDs are "
        f"listed by: {_prog()} grants",
        USAGE,
    )


def _out_unopened(unopened: list[Unopened], what: str) -> None:
    """Name each memory a listing could not open, after the rest, with its refusal."""
    for u in unopened:
        _out(f"{u.name}: could not be opened ({u.error}), {what}: {u.message}")


def _memory_line(m: MemoryInfo) -> str:
    return (
        f"{m.name}: {plural(m.T, 'note')}, {m.bytes} bytes, "
        f"created {m.created}, {plural(m.grants, 'capability', 'capabilities')}"
    )


def do_memories(args: argparse.Namespace) -> int:
    """The owner's memories (docs/DESIGN.md, "Memories"): each verb one route,
    at the server's root whatever memory STASH_URL names."""
    mem, _ = _identity()
    words = args.words
    quoted = [urllib.parse.quote(w, safe="") for w in words]
    if not words:
        listed = mem.memories()
        for m in listed:
            _out(_memory_line(m))
        _out_unopened(listed.unopened, "not served")
        return 0
    if words[0] == "create" and len(words) == 2:
        made = mem.create(words[1])
        _out(
            f"Created memory {made.name}. Its agents use STASH_URL={mem.url.rstrip('/')}/m/{quoted[1]}; "
            f"mint their capabilities with: {_prog()} grants full --memory {shlex.quote(words[1])}"
        )
        return 0
    if words[0] == "delete" and len(words) == 2:
        if not args.yes:
            raise Failure(
                f"stash: delete destroys memory {words[1]} and every capability of it, for good. "
                f"To go ahead: {_prog()} memories delete {shlex.quote(words[1])} --yes",
                USAGE,
            )
        gone = mem.delete(words[1])
        _out(
            f"Destroyed memory {gone.memory} (its log held {plural(gone.memories or 0, 'note')}) "
            f"at {gone.at}; its capabilities open nothing from now on."
        )
        return 0
    if words[0] == "fork" and len(words) == 3:
        forked = mem.fork(words[1], words[2], at=args.at)
        _out(
            f"Forked memory {forked.source} into memory {forked.name} with its first {plural(forked.at, 'note')} "
            f"and {plural(forked.summaries, 'summary', 'summaries')}; no capability of {forked.source} opens it."
        )
        return 0
    if words[0] == "erase" and len(words) == 1:
        if (args.q is None) == (args.words_query is None):
            raise Failure(
                f"stash: memories erase takes --q REGEX or --words WORDS. See: {_prog()} memories --help", USAGE
            )
        done = mem.erase_matching(args.q, words=args.words_query, memories=args.memory, dry_run=bool(args.dry_run))
        for name, count in done.memories.items():
            verb = ("matches" if count == 1 else "match") if done.dry_run else "erased"
            _out(f"memory {name}: {plural(count, 'note')} {verb}")
        _out(
            f"Total {done.total} at {done.at}; query fingerprint {done.fingerprint}."
            + (" Nothing was erased (dry run)." if done.dry_run else "")
        )
        return 0
    raise Failure(
        f"stash: memories takes nothing (list), create NAME, delete NAME --yes, fork SOURCE NAME "
        f"[--at N] or erase --q REGEX. See: {_prog()} memories --help",
        USAGE,
    )


def _receipt_line(r: Receipt) -> str:
    ids = ", ".join(f"#{i}" for i in r.ids)
    dropped = plural(r.dropped, "summary", "summaries")
    return f"receipt {r.receipt}  {r.at}  {ids}  ({dropped} dropped)"


def do_erase(args: argparse.Namespace) -> int:
    ids = []
    for word in args.ids:
        word = word.lstrip("#")
        if not (word.isascii() and word.isdigit()):
            raise Failure("stash: erase takes note ids as the wake prints them, like #12 or 12.", USAGE)
        ids.append(int(word))
    receipt = _api().erase(ids)
    fresh, asked = len(receipt.erased), len(receipt.ids or set(ids))
    before = asked - fresh
    again = f" ({before} {'was' if before == 1 else 'were'} erased before)" if before else ""
    _out(
        f"Erased {fresh} of {plural(asked, 'note')}{again}. "
        f"{'Its line now reads' if asked == 1 else 'Their lines now read'} [erased] everywhere."
    )
    _out(_receipt_line(receipt))
    if receipt.dropped:
        _out(f"Run: {_prog()} nap")
    return 0


def do_undo(args: argparse.Namespace) -> int:
    """POST /erase/undo until the range is done, one bounded slice per call."""
    mem = _api()
    first: int | None = args.first
    erased = dropped = 0
    while True:
        done = mem.undo(grant=args.grant, first=first, last=args.last)
        erased += len(done.erased)
        dropped += done.dropped
        if done.receipt is not None:
            _out(_receipt_line(done.receipt))
        if done.more is None:
            break
        first = done.more
    _out(f"Erased {plural(erased, 'note')}; {plural(dropped, 'summary', 'summaries')} dropped.")
    if dropped:
        _out(f"Run: {_prog()} nap")
    return 0


def do_erasures(args: argparse.Namespace) -> int:
    receipts = _api().erasures()
    for r in receipts:
        _out(_receipt_line(r))
    if not receipts:
        _out("No erasure receipts: nothing has been erased in this memory.")
    return 0


def do_rotate(args: argparse.Namespace) -> int:
    mem, _ = _identity()
    rotated = mem.rotate()
    ans = rotated.answer
    # The new token's first use is what ends the old one: present it now (the object moved to it).
    try:
        mem.grants()
        ended = f"owner capability #{ans.get('retires')} ended"
    except StashError:
        ended = (
            f"owner capability #{ans.get('retires')} ends at the new token's first use (it could not be used just now)"
        )
    _out(
        f"Rotated: {ended}, #{ans.get('id')} is the owner now. "
        "The new token is shown this once; the old one opens nothing once it has been used. Save it:"
    )
    _out(f"export STASH_TOKEN={shell_word(ans['token'])}")
    if isinstance(ans.get("message"), str):
        _out(ans["message"])
    if ans.get("also_revoked"):
        ended = ", ".join(f"#{i}" for i in ans["also_revoked"])
        _out(
            f"Also ended: {ended} (not used since the upgrade to key epochs); mint replacements with: "
            f"{_prog()} grants read|full"
        )
    return 0


def do_destroy(args: argparse.Namespace) -> int:
    mem, here = _identity()
    if here is not None:
        raise Failure(
            f"stash: destroy ends the whole identity, every memory of it, and STASH_URL names memory "
            f"{here}. To delete only that memory: {_prog()} memories delete {shlex.quote(here)} --yes",
            USAGE,
        )
    if not args.yes:
        raise Failure(
            "stash: destroy deletes the whole identity, every memory and every token of it, for good. "
            f"To go ahead: {_prog()} destroy --yes",
            USAGE,
        )
    gone = mem.destroy()
    held = gone.memories
    what = f"main's log held {plural(held, 'note')}" if isinstance(held, int) else "main's log could not be read"
    _out(f"Destroyed the identity ({what}) at {gone.at}. Every token of it now opens nothing.")
    return 0


# ---------------------------------------------------------------- OptMem folders and export archives
#
# OptMem keeps a memory in one folder: LOG.txt holds memory #i as the fixed
# 320-byte record "#i DATE TEXT", space padded, newline terminated; TREE/<size>
# holds the summary of block [k*size, (k+1)*size) as 288-byte record k, each
# level a dense prefix; config holds "NAME = value" lines ("#" starts a
# comment). A Stash export is that folder under memory/, beside README.txt
# and manifest.json.

OPTMEM_LOG_REC = 320
OPTMEM_TREE_REC = 288
OPTMEM_ENTRY_MAX = 280
OPTMEM_SIZES = ("WAKE_LINES", "WAKE_CHARS", "ENTRY_CHARS", "PART_CHARS", "PART_LINES")
ERASED_TEXT = "[erased]"
MANIFEST = "manifest.json"
MAX_ERASE_IDS = 10_000  # the server's cap per POST /erase
_LOG_RECORD = re.compile(r"#(\d+) (\d{4}-\d{2}-\d{2})(?: (.*))?", re.S)


def _line_problem(text: str) -> str | None:
    """Why Stash would refuse or change this note or summary text (the
    server's rules for a line), or None."""
    for ch in text:
        if ch in "\u2028\u2029" or unicodedata.category(ch) == "Cc":
            return f"contains the control character U+{ord(ch):04X}"
    if not text.strip():
        return "is empty"
    if text != text.strip():
        return "begins or ends with whitespace, which Stash would drop"
    n = len(text.encode("utf-8"))
    if n > OPTMEM_ENTRY_MAX:
        return f"is {n} bytes, over the {OPTMEM_ENTRY_MAX}-byte limit"
    return None


def _record_text(rec: bytes, width: int, where: str) -> str:
    """One fixed-width record's content: exactly ``width`` bytes ending in
    its only newline, UTF-8, padding spaces removed."""
    if len(rec) != width or rec[-1:] != b"\n" or b"\n" in rec[:-1]:
        raise Failure(
            f"stash: {where} is not one {width}-byte line: a record shorter or longer than {width} "
            "bytes shifts every record after it. Nothing was imported.",
            USAGE,
        )
    try:
        return rec[:-1].decode("utf-8").rstrip(" ")
    except UnicodeDecodeError:
        raise Failure(f"stash: {where} is not UTF-8 text. Nothing was imported.", USAGE) from None


def read_optmem_log(path: str) -> tuple[list[dict[str, Any]], list[int]]:
    """Every note of an OptMem LOG.txt as ``{"date", "text"}``, oldest
    first, and the ids of those that read ``[erased]``. Each record is checked
    against the format and against what the server would accept, so a bad one
    is named before anything is sent."""
    try:
        f = open(path, "rb")
    except OSError as err:
        raise Failure(f"stash: cannot read {path}: {err.strerror or err}. Nothing was imported.", USAGE) from None
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()  # noqa: UP017 - Python 3.8+
    entries: list[dict[str, Any]] = []
    erased: list[int] = []
    prev = None
    with f:
        while True:
            i = len(entries)
            rec = f.read(OPTMEM_LOG_REC)
            if not rec:
                break
            start = i * OPTMEM_LOG_REC
            where = f"LOG.txt record #{i} (bytes {start} to {start + len(rec) - 1})"
            if len(rec) < OPTMEM_LOG_REC and not rec.endswith(b"\n"):
                raise Failure(
                    f"stash: {where} is cut short: {len(rec)} of {OPTMEM_LOG_REC} bytes, as an "
                    "interrupted write leaves it (OptMem ignores such a tail). To drop it: "
                    f"truncate -s {start} {shlex.quote(path)}. Nothing was imported.",
                    USAGE,
                )
            line = _record_text(rec, OPTMEM_LOG_REC, where)
            m = _LOG_RECORD.fullmatch(line)
            if not m or not m.group(3):
                raise Failure(f"stash: {where} is not '#{i} YYYY-MM-DD text'. Nothing was imported.", USAGE)
            if int(m.group(1)) != i:
                raise Failure(
                    f"stash: {where} is numbered #{m.group(1)}; the record at that place must be #{i}. "
                    "Nothing was imported.",
                    USAGE,
                )
            date, text = m.group(2), m.group(3)
            try:
                datetime.date.fromisoformat(date)
            except ValueError:
                raise Failure(
                    f"stash: {where}: {date} is not a real calendar date. Nothing was imported.", USAGE
                ) from None
            if date > today:
                raise Failure(
                    f"stash: {where}: {date} is in the future (today is {today} UTC). Nothing was imported.", USAGE
                )
            if prev is not None and date < prev:
                raise Failure(
                    f"stash: {where}: {date} is earlier than the note before it ({prev}); "
                    "a log is oldest first. Nothing was imported.",
                    USAGE,
                )
            problem = _line_problem(text)
            if problem:
                raise Failure(f"stash: {where}: the note {problem}. Nothing was imported.", USAGE)
            if text == ERASED_TEXT:
                erased.append(i)
            entries.append({"date": date, "text": text})
            prev = date
    return entries, erased


def _level_size(name: str) -> int | None:
    if not (name.isascii() and name.isdigit()) or name != str(int(name)):
        return None
    size = int(name)
    return size if size >= 2 and size & (size - 1) == 0 else None


def read_optmem_tree(folder: str, T: int) -> dict[int, list[str | None]]:
    """``{size: [summary of block k, ...]}`` from TREE/. A blank record (what
    OptMem calls a corrupt write) reads as None: not written. A record for a
    block the log does not complete is refused."""
    tree_dir = os.path.join(folder, "TREE")
    if not os.path.isdir(tree_dir):
        return {}
    out: dict[int, list[str | None]] = {}
    for name in sorted(os.listdir(tree_dir)):
        size = _level_size(name)
        if size is None:
            raise Failure(
                f"stash: TREE/{name} is not a level of the tree (those are named 2, 4, 8, ...). "
                "Move it out of the folder. Nothing was imported.",
                USAGE,
            )
        path = os.path.join(tree_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as err:
            raise Failure(
                f"stash: cannot read TREE/{name}: {err.strerror or err}. Nothing was imported.", USAGE
            ) from None
        n = -(-len(data) // OPTMEM_TREE_REC)
        complete = T // size
        if n > complete:
            lo = complete * size
            raise Failure(
                f"stash: TREE/{name} holds {plural(n, 'summary', 'summaries')}, but the log's "
                f"{plural(T, 'note')} complete only {plural(complete, 'block')} of {size}: "
                f"record {complete} would be block {lo}-{lo + size - 1}, "
                "which is not complete. Nothing was imported.",
                USAGE,
            )
        texts: list[str | None] = []
        for k in range(n):
            lo = k * size
            where = f"TREE/{name} record {k} (block {lo}-{lo + size - 1})"
            text = _record_text(data[k * OPTMEM_TREE_REC : (k + 1) * OPTMEM_TREE_REC], OPTMEM_TREE_REC, where)
            if text:
                problem = _line_problem(text)
                if problem:
                    raise Failure(f"stash: {where}: the summary {problem}. Nothing was imported.", USAGE)
            texts.append(text or None)
        out[size] = texts
    return out


def read_optmem_config(folder: str) -> dict[str, int]:
    """The sizes an OptMem config file sets, read as OptMem reads them."""
    path = os.path.join(folder, "config")
    if not os.path.exists(path):
        return {}
    out: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise Failure(
            f"stash: cannot read config: {getattr(err, 'strerror', None) or err}. Nothing was imported.", USAGE
        ) from None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#")[0].strip()
        if "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        name = name.upper()
        if name not in OPTMEM_SIZES:
            raise Failure(
                f"stash: config line {n}: {name} is not a size (those are {', '.join(OPTMEM_SIZES)}). "
                "Nothing was imported.",
                USAGE,
            )
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise Failure(
                f"stash: config line {n}: {name} must be a positive whole number, not {value!r}. Nothing was imported.",
                USAGE,
            )
        if name == "ENTRY_CHARS" and int(value) > OPTMEM_ENTRY_MAX:
            raise Failure(
                f"stash: config line {n}: ENTRY_CHARS is at most {OPTMEM_ENTRY_MAX}. Nothing was imported.", USAGE
            )
        out[name] = int(value)
    return out


def listing_digest(files: list[dict[str, Any]]) -> str:
    """A manifest's ``digest``: SHA-256 of what ``sha256sum`` prints for the
    listed files, one ``<hex>  <path>`` line each, paths in byte order."""
    ordered = sorted(files, key=lambda f: f["path"].encode("utf-8"))
    return hashlib.sha256("".join(f"{f['sha256']}  {f['path']}\n" for f in ordered).encode("utf-8")).hexdigest()


def _safe_parts(name: str, what: str) -> list[str]:
    """A relative path's parts, refusing anything that could land outside
    the folder it is unpacked into."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or "\\" in name or ":" in name or not parts or ".." in parts:
        raise Failure(
            f"stash: {what} names the path {name!r}, which could land outside its folder; refused, nothing was written."
        )
    return parts


def check_manifest(raw: bytes, sha_of: Any) -> dict[str, Any]:
    """Check every file a manifest lists: ``sha_of(path)`` returns its
    ``(bytes, sha256 hex)`` or None when it is missing. Then the digest over
    the listing. Returns the manifest."""
    try:
        doc = json.loads(raw.decode("utf-8"))
        files = doc["files"]
        for f in files:
            if not (isinstance(f["path"], str) and isinstance(f["bytes"], int) and isinstance(f["sha256"], str)):
                raise TypeError
    except (ValueError, KeyError, TypeError):
        raise Failure(f"stash: {MANIFEST} is not a Stash export manifest; nothing was trusted.") from None
    for f in files:
        _safe_parts(f["path"], MANIFEST)
        got = sha_of(f["path"])
        if got is None:
            raise Failure(f"stash: {f['path']} is listed in {MANIFEST} but missing: the export is incomplete.")
        if got != (f["bytes"], f["sha256"]):
            raise Failure(
                f"stash: {f['path']} does not match {MANIFEST} ({got[0]} bytes, SHA-256 {got[1][:16]}..., "
                f"where the manifest says {f['bytes']} bytes, {f['sha256'][:16]}...): it was damaged or "
                "changed after the export."
            )
    if doc.get("digest") != listing_digest(files):
        raise Failure(
            f"stash: the digest in {MANIFEST} does not match its list of files: the manifest was "
            "damaged or changed after the export."
        )
    checked: dict[str, Any] = doc
    return checked


def _file_sha(path: str) -> tuple[int, str] | None:
    h = hashlib.sha256()
    n = 0
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                n += len(chunk)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise Failure(f"stash: cannot read {path}: {err.strerror or err}.") from None
    return n, h.hexdigest()


def check_folder(root: str) -> dict[str, Any]:
    """Check an unpacked export against its manifest.json."""
    try:
        with open(os.path.join(root, MANIFEST), "rb") as f:
            raw = f.read()
    except OSError as err:
        raise Failure(f"stash: cannot read {MANIFEST}: {err.strerror or err}.") from None
    return check_manifest(raw, lambda p: _file_sha(os.path.join(root, *p.split("/"))))


def archive_members(data: bytes) -> dict[str, bytes]:
    """The regular files of a tar.gz, by path; links, devices, absolute or
    climbing paths and duplicates are refused."""
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for m in tar:
                parts = _safe_parts(m.name, "the archive")
                if m.isdir():
                    continue
                if not m.isfile():
                    raise Failure(
                        f"stash: the archive holds {m.name!r}, which is not a plain file (a link or "
                        "device); refused, nothing was written."
                    )
                name = "/".join(parts)
                if name in out:
                    raise Failure(f"stash: the archive holds {name!r} twice; refused, nothing was written.")
                member = tar.extractfile(m)
                if member is None:
                    raise Failure(
                        f"stash: the archive holds {name!r}, which cannot be read; refused, nothing was written."
                    )
                out[name] = member.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error):
        raise Failure("stash: the server's answer is not a readable tar.gz archive; nothing was written.") from None
    return out


def check_archive(members: dict[str, bytes]) -> dict[str, Any]:
    if MANIFEST not in members:
        raise Failure(
            f"stash: the archive has no {MANIFEST}; this server's export cannot be checked. Nothing was written."
        )
    doc = check_manifest(
        members[MANIFEST], lambda p: (len(members[p]), hashlib.sha256(members[p]).hexdigest()) if p in members else None
    )
    listed = {f["path"] for f in doc["files"]} | {MANIFEST}
    extra = sorted(set(members) - listed)
    if extra:
        raise Failure(f"stash: the archive holds {extra[0]!r}, which {MANIFEST} does not list; nothing was written.")
    return doc


def unpack(members: dict[str, bytes], target: str, force: bool) -> None:
    """Write the members into ``target``: first into a fresh folder inside
    it, checked against the manifest there, then moved into place, so a
    failure leaves no half-written export. Only what the archive names is
    replaced."""
    if os.path.lexists(target) and not os.path.isdir(target):
        raise Failure(f"stash: {target} exists and is not a folder; name another.", USAGE)
    if os.path.isdir(target) and os.listdir(target) and not force:
        raise Failure(
            f"stash: {target} is not empty; name an empty or new folder, or add --force to replace "
            "what the export holds there.",
            USAGE,
        )
    os.makedirs(target, mode=0o700, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".stash-export-", dir=target)
    try:
        for name, data in members.items():
            path = os.path.join(stage, *name.split("/"))
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        check_folder(stage)
        for top in sorted({name.split("/")[0] for name in members}):
            dest = os.path.join(target, top)
            if os.path.isdir(dest) and not os.path.islink(dest):
                shutil.rmtree(dest)
            elif os.path.lexists(dest):
                os.unlink(dest)
            os.replace(os.path.join(stage, top), dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _export_summary(doc: dict[str, Any]) -> str:
    summaries = sum(int(n) for n in doc.get("summaries", {}).values())
    return (
        f"{plural(int(doc.get('memories') or 0), 'note')} ({doc.get('erased', 0)} erased), "
        f"{plural(summaries, 'summary', 'summaries')}, "
        f"{doc.get('pending', 0)} due; manifest digest {str(doc.get('digest'))[:16]}... checked"
    )


def do_export(args: argparse.Namespace) -> int:
    target = args.target or "stash-export.tar.gz"
    as_archive = target == "-" or target.endswith((".tar.gz", ".tgz"))
    if as_archive and target != "-" and os.path.exists(target) and not args.force:
        raise Failure(f"stash: {target} exists; name another file or add --force.", USAGE)
    if not as_archive:
        if os.path.lexists(target) and not os.path.isdir(target):
            raise Failure(f"stash: {target} exists and is not a folder; name another.", USAGE)
        if os.path.isdir(target) and os.listdir(target) and not args.force:
            raise Failure(
                f"stash: {target} is not empty; name an empty or new folder, or add --force to "
                "replace what the export holds there.",
                USAGE,
            )
    archive = _api().archive()
    data, members, doc = archive.data, archive.members, archive.manifest
    if target == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        return 0
    if as_archive:
        tmp = f"{target}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        _out(
            f"Wrote {target} ({len(data)} bytes): {_export_summary(doc)}. It unpacks to memory/, which OptMem "
            f"reads: tar xzf {shlex.quote(target)} && MEMORY_DIR=memory memo wake"
        )
        return 0
    unpack(members, target, args.force)
    _out(
        f"Exported to {target}: {_export_summary(doc)}. OptMem reads it: "
        f"MEMORY_DIR={shlex.quote(os.path.join(target, 'memory'))} memo wake"
    )
    return 0


def _memory_folder(path: str) -> tuple[str, str | None]:
    """(the folder holding LOG.txt, the export root holding it under memory/ or None)."""
    if os.path.isfile(os.path.join(path, "LOG.txt")):
        return path, None
    inner = os.path.join(path, "memory")
    if os.path.isfile(os.path.join(inner, "LOG.txt")):
        return inner, path
    raise Failure(
        f"stash: {path} holds no LOG.txt, nor memory/LOG.txt: name an OptMem memory folder (like "
        "~/.optmem/memory) or a folder written by stash export. Nothing was imported.",
        USAGE,
    )


def _read_files(folder: str) -> list[str]:
    """The files of a memory folder that an import reads, relative to it."""
    names = ["LOG.txt"] + (["config"] if os.path.exists(os.path.join(folder, "config")) else [])
    tree = os.path.join(folder, "TREE")
    if os.path.isdir(tree):
        names += [f"TREE/{n}" for n in sorted(os.listdir(tree))]
    return names


def _memories_held(mem: Stash) -> int:
    """How many notes the memory holds (a wake that is refused means some)."""
    try:
        return mem.wake_part(1).T
    except Conflict:
        return -1


class _Interleaved(Failure):
    """Another writer's notes landed among the folder's: no advice on
    finishing the move applies any more."""


def _after(error: Failure | StashError, note: str) -> Failure:
    """The refusal as this command reports it, ``note`` added to its message."""
    f = refused(error) if isinstance(error, StashError) else error
    f.message = f.message.rstrip() + " " + note
    return f


def import_stages(T: int, tree: dict[int, list[str | None]]) -> list[int]:
    """How many notes to have imported before each round of settling, so
    that every summary the folder holds that can be carried over is.

    The server takes summaries strictly in pending order (by size, then
    position), so a block the folder lacks, once complete, blocks everything
    after it in that order for good. Summary P of size s (block k) can be
    carried iff no missing block before it in that order is complete when P
    is: none of its own level before k, none of a smaller size ending at or
    before P's end. It is settled in the round just before the next missing
    block completes after P does."""
    first_gap: dict[int, int] = {}
    completions: list[int] = []
    size = 2
    while size <= T:
        texts = tree.get(size, [])
        have = [k < len(texts) and texts[k] is not None for k in range(T // size)]
        first_gap[size] = have.index(False) if False in have else T // size
        completions += [(k + 1) * size for k, ok in enumerate(have) if not ok]
        size *= 2
    completions.sort()
    stops = {T}
    below = T + 1  # the earliest end of a missing block of a smaller size
    for size in sorted(first_gap):
        for k in range(first_gap[size]):
            hi = (k + 1) * size
            if hi < below:
                after = bisect.bisect_right(completions, hi)
                stops.add(completions[after] - 1 if after < len(completions) else T)
        if first_gap[size] < T // size:
            below = min(below, (first_gap[size] + 1) * size)
    return sorted(stops)


NAP_BATCH = 256  # most summaries one POST /nap {"summaries": [...]} settles


def settle_from_tree(mem: Stash, tree: dict[int, list[str | None]], T: int, settled: dict[int, int]) -> int:
    """Settle, with the folder's summaries, every block due at ``T`` in the
    server's order (by size, then position) up to the first one the folder
    lacks, ``NAP_BATCH`` per request; returns how many were saved.
    ``settled[size]`` counts what this move settled so far (each level a
    dense prefix) and is kept up to date. The server checks the order too:
    if its first due block is not the one expected here (another writer), it
    stops rather than guess."""
    todo: list[dict[str, Any]] = []
    size = 2
    while size <= T:
        texts = tree.get(size, [])
        for k in range(settled.get(size, 0), T // size):
            text = texts[k] if k < len(texts) else None
            if text is None:
                break
            todo.append({"block": f"{k * size}-{(k + 1) * size - 1}", "text": text})
        else:
            size *= 2
            continue
        break
    # A block the folder lacks ends the run: everything after it in the
    # server's order waits for that one. The loop above stops at the first
    # gap of the smallest level that has one; larger levels wait for it.
    if not todo:
        return 0
    due = mem.due()
    if not due or due.block != todo[0]["block"]:
        return 0
    saved = 0
    for start in range(0, len(todo), NAP_BATCH):
        chunk = todo[start : start + NAP_BATCH]
        if mem.settle(chunk).saved != [s["block"] for s in chunk]:
            break  # another writer settled some meanwhile: stop rather than guess
        for s in chunk:
            lo, _, last = s["block"].partition("-")
            n = int(last) + 1 - int(lo)
            settled[n] = settled.get(n, 0) + 1
        saved += len(chunk)
    return saved


def do_import_optmem(args: argparse.Namespace) -> int:
    folder, root = _memory_folder(args.dir)
    doc: dict[str, Any] | None = None
    if root is not None and os.path.exists(os.path.join(root, MANIFEST)):
        try:
            doc = check_folder(root)
        except Failure as f:
            raise _after(
                f,
                "Nothing was imported. (If you changed the folder on purpose, import its memory/ "
                f"folder: {_prog()} import-optmem {shlex.quote(folder)})",
            ) from None
        listed = {f["path"] for f in doc["files"]}
        unlisted = [n for n in _read_files(folder) if f"memory/{n}" not in listed]
        if unlisted:
            raise Failure(
                f"stash: memory/{unlisted[0]} is not listed in {MANIFEST}: it was added after the "
                "export. Nothing was imported.",
                USAGE,
            )
    entries, erased = read_optmem_log(os.path.join(folder, "LOG.txt"))
    T = len(entries)
    if not T:
        raise Failure(f"stash: {os.path.join(folder, 'LOG.txt')} holds no notes; nothing was imported.", USAGE)
    tree = read_optmem_tree(folder, T)
    sizes = read_optmem_config(folder)
    if doc is not None and isinstance(doc.get("config"), dict):
        # A Stash export keeps the sizes OptMem does not read (WAKE_CHARS) in its manifest only.
        sizes = {**{k: v for k, v in doc["config"].items() if k in OPTMEM_SIZES and _whole(v) and v >= 1}, **sizes}
    in_folder = sum(1 for texts in tree.values() for t in texts if t is not None)

    mem = _api(memory=args.memory)
    held = _memories_held(mem)
    if held:
        raise Failure(
            "stash: this memory is not empty; import-optmem moves a whole OptMem memory into an empty "
            f"one, so that it wakes to the same document. Start one with: {_prog()} init "
            f"(or append only its notes, without summaries: {_prog()} import "
            f"{shlex.quote(os.path.join(folder, 'LOG.txt'))}). Nothing was imported."
        )
    if erased:
        try:
            mem.erasures()
        except Forbidden:
            raise Failure(
                f"stash: the folder has {plural(len(erased), 'erased note')} "
                f"(#{erased[0]} first); "
                f"re-creating {'it' if len(erased) == 1 else 'them'} erased takes the owner's token. "
                "Nothing was imported."
            ) from None
    # The memory takes the folder's sizes; ENTRY_CHARS waits until the end,
    # since it also limits the summaries carried over.
    early = {name: sizes.get(name) for name in OPTMEM_SIZES if name != "ENTRY_CHARS"}
    early["ENTRY_CHARS"] = None
    try:
        mem.config(early)
    except StashError as e:
        raise _after(e, "(The folder's config could not be carried over.) Nothing was imported.") from None

    done = carried = 0
    settled: dict[int, int] = {}
    try:
        for stop in import_stages(T, tree):
            landed = mem.import_(_dated(entries[done:stop]))
            first, last = landed.first, landed.last
            if first != done:
                raise _Interleaved(
                    f"stash: another writer added notes meanwhile, so the folder's #{done} to "
                    f"#{stop - 1} landed at #{first} to #{last} and its summaries no longer fit; "
                    "nothing more was done."
                )
            done = stop
            ids = [i for i in erased if first <= i <= last]
            for k in range(0, len(ids), MAX_ERASE_IDS):
                mem.erase(ids[k : k + MAX_ERASE_IDS])
            carried += settle_from_tree(mem, tree, stop, settled)
        if "ENTRY_CHARS" in sizes:
            mem.config({"ENTRY_CHARS": sizes["ENTRY_CHARS"]})
        nap = mem.due()
    except (Failure, StashError) as f:
        if not done or isinstance(f, _Interleaved):
            raise
        still = [i for i in erased if i < done]
        erase = (
            f"; erase what still reads [erased] as text with: {_prog()} erase {' '.join(map(str, still))}"
            if still
            else ""
        )
        log = shlex.quote(os.path.join(folder, "LOG.txt"))
        rest = (
            f"append the rest with: tail -c +{done * OPTMEM_LOG_REC + 1} {log} > rest.txt && {_prog()} import "
            "rest.txt; "
            if done < T
            else ""
        )
        raise _after(
            f,
            f"(The folder's first {plural(done, 'note')} {'is' if done == 1 else 'are'} "
            f"imported and {plural(carried, 'summary', 'summaries')} carried over. "
            f"To finish, {rest}answer what is due with {_prog()} nap{erase}; and set the sizes with "
            f"{_prog()} config.)",
        ) from None
    due = nap.remaining + 1 if nap else 0
    again = f", {len(erased)} of them erased again" if erased else ""
    _out(f"Imported {plural(T, 'note')}, #0 to #{T - 1}, with {'its date' if T == 1 else 'their dates'}{again}.")
    _out(
        f"Carried over {carried} of the folder's {plural(in_folder, 'summary', 'summaries')}; "
        f"{plural(due, 'compression')} {'is' if due == 1 else 'are'} due."
    )
    if sizes:
        _out("Sizes carried over: " + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ".")
    if due:
        _out(f"Run: {_prog()} nap")
    return 0


def do_unpin(args: argparse.Namespace) -> int:
    url, tok = server_url(), token()
    if forget_pin(url, tok):
        _out("Forgot the pinned head of this memory; the next answer pins the state the server has now.")
    else:
        _out("No head was pinned for this memory.")
    return 0


def do_health(args: argparse.Namespace) -> int:
    health = _api(need_token=False).health()
    state = "ok" if health.ok else "not ok"
    _out(
        f"{state}: Stash {health.version} at {_shown(server_url())}; "
        f"content cipher {health.content_cipher}, file cipher {health.file_cipher}"
    )
    return 0 if health.ok else 1


def _text(words: list[str], what: str) -> str:
    text = " ".join(words)
    if text == "-":
        text = sys.stdin.read().rstrip("\n")
        if not text.strip():
            raise Failure(
                f"stash: the {what} read from standard input is empty; give the line there, as the "
                f"printed here-document does (<<'{DELIMITER}', the line, then {DELIMITER}). A line that "
                f"is exactly {DELIMITER} ends it early: reword that line.",
                USAGE,
            )
    if not text.strip():
        raise Failure(f"stash: the {what} is empty; give one line of text, on standard input with -.", USAGE)
    return text


# ---------------------------------------------------------------- argument parsing


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit; report like every other refusal
        raise Failure(f"stash: {message}. See: {_prog()} --help", USAGE)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="stash",
        description="Client of a Stash memory server. Reads STASH_URL and STASH_TOKEN from the environment.",
        epilog="Start every session with: stash wake. Exit status: 0 done, 1 the server refused (its "
        "message on stderr), 2 a usage mistake, 3 no Stash server answered.",
    )
    json_help = "print the server's raw JSON answer (one document per line) instead of text"
    p.add_argument("--json", action="store_true", help=json_help)
    sub = p.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    def verb(name: str, func: Any) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=VERBS[name], description=VERBS[name])
        sp.set_defaults(func=func)
        # after the verb too (stash wake --json); SUPPRESS keeps a --json given before it
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
        return sp

    sp = verb("init", do_init)
    sp.add_argument("server", nargs="?", metavar="URL", help="the server to mint on (default: STASH_URL)")
    sp.add_argument(
        "--url",
        help="the public address to write into the AGENTS.md block, when it differs "
        "from URL (and to call, when neither URL nor STASH_URL is given)",
    )
    sp = verb("wake", do_wake)
    sp.add_argument("part", nargs="?", type=int, help="part to read (default 1)")
    sp.add_argument("T", nargs="?", type=int, help="the snapshot T the first part named")
    sp = verb("note", do_note)
    sp.add_argument("text", nargs="+", help="one line (- reads it from stdin)")
    sp = verb("nap", do_nap)
    sp.add_argument("block", nargs="?", help="the due block, like 0-1 (omit to see what is due)")
    sp.add_argument("text", nargs="*", help="the one-line summary")
    sp.add_argument(
        "--batch",
        type=int,
        metavar="K",
        help="list up to K (1 to 256) due blocks that can be written at once, and the command that answers them all",
    )
    sp.add_argument(
        "--summaries",
        metavar="FILE",
        help="settle a batch: one 'BLOCK LINE' line per block, in the order listed (- reads stdin); all or nothing",
    )
    sp = verb("recall", do_recall)
    sp.add_argument(
        "regex", help="case-insensitive regular expression, or with --words the words (- reads it from stdin, one line)"
    )
    sp.add_argument(
        "--words",
        action="store_true",
        help="search by words instead: each word matches as the "
        "prefix of a word, whatever its case or accents; best first",
    )
    sp.add_argument(
        "--before",
        metavar="ID",
        help="only notes before this id: the next older page, as the "
        "previous answer names it (with --words: the cursor it names)",
    )
    sp = verb("zoom", do_zoom)
    sp.add_argument("block", help="a block of the wake, like 16-31 (- reads it from stdin)")
    sp = verb("forget", do_forget)
    sp.add_argument("block", help="the summary to drop, like 16-31")
    sp = verb("config", do_config)
    sp.add_argument("changes", nargs="*", metavar="NAME=VALUE")
    sp = verb("import", do_import)
    sp.add_argument("file", help="file of 'YYYY-MM-DD text' lines, oldest first (- for stdin)")
    sp = verb("grants", do_grants)
    sp.add_argument("words", nargs="*", metavar="read|append|full|revoke ID")
    sp.add_argument("--label", help="when minting: what the capability is for (at most 64 bytes)")
    sp.add_argument(
        "--expires",
        metavar="TIME",
        help="when minting: an RFC 3339 UTC time from which it opens nothing, like 2027-01-31T18:00:00Z",
    )
    sp.add_argument("--memory", metavar="NAME", help="when minting: the memory it is bound to (default main)")
    sp = verb("memories", do_memories)
    sp.add_argument("words", nargs="*", metavar="create NAME|delete NAME|fork SOURCE NAME|erase")
    sp.add_argument("--yes", action="store_true", help="confirm a delete: the memory cannot be recovered")
    sp.add_argument("--at", type=int, metavar="N", help="fork: how many of the source's first notes (default all)")
    sp.add_argument("--q", metavar="REGEX", help="erase: every note whose line matches this recall regex")
    sp.add_argument(
        "--words",
        dest="words_query",
        metavar="WORDS",
        help="erase: every note holding these words (a words search) instead",
    )
    sp.add_argument(
        "--memory", action="append", metavar="NAME", help="erase: only in this memory (repeat it; default every memory)"
    )
    sp.add_argument("--dry-run", action="store_true", help="erase: count, erase nothing")
    sp = verb("erase", do_erase)
    sp.add_argument("ids", nargs="+", metavar="ID", help="note ids, as the wake prints them (#12 or 12)")
    verb("erasures", do_erasures)
    sp = verb("undo", do_undo)
    sp.add_argument("--grant", type=int, metavar="ID", help="erase what this capability wrote (its id in grants)")
    sp.add_argument("--first", type=int, metavar="I", help="first note id of the range (default 0)")
    sp.add_argument("--last", type=int, metavar="J", help="last note id of the range (default: the newest)")
    verb("rotate", do_rotate)
    sp = verb("destroy", do_destroy)
    sp.add_argument("--yes", action="store_true", help="confirm: the identity and its memories cannot be recovered")
    sp = verb("export", do_export)
    sp.add_argument(
        "target",
        nargs="?",
        metavar="DIR|FILE",
        help="a folder to unpack into, or a FILE ending in .tar.gz or .tgz to keep the archive whole "
        "(default stash-export.tar.gz; - for stdout)",
    )
    sp.add_argument(
        "--force", action="store_true", help="overwrite FILE, or replace what the export holds in a non-empty DIR"
    )
    sp = verb("import-optmem", do_import_optmem)
    sp.add_argument(
        "dir",
        metavar="DIR",
        help="an OptMem memory folder (with LOG.txt) or a folder written by "
        "stash export (with memory/LOG.txt and manifest.json)",
    )
    sp.add_argument(
        "--memory",
        metavar="NAME",
        help="into this memory of the owner's (made first with: stash "
        "memories create NAME) instead of the one STASH_URL names",
    )
    sp = verb("health", do_health)
    verb("unpin", do_unpin)
    return p


def utf8_streams() -> None:
    """Notes are UTF-8 (``→``, ``ü``, emoji): write and read them as
    UTF-8 whatever the locale says, as OptMem does, rather than die on the
    first character an ASCII or Latin-1 terminal cannot encode."""
    for stream in (sys.stdout, sys.stderr, sys.stdin):
        try:
            stream.reconfigure(  # type: ignore[union-attr]  # absent on a replaced stream: caught below
                encoding="utf-8", errors="replace" if stream is not sys.stdin else "strict"
            )
        except (AttributeError, ValueError, OSError):  # not a text stream (replaced, closed): leave it
            pass


def interruptible() -> None:
    """Ctrl-C stops this command, whatever its parent did to SIGINT: a
    process inherits an ignored SIGINT (a non-interactive shell's ``cmd &``,
    a CI runner), and a client that ignored it could be stopped by nothing
    short of SIGKILL. Only the main thread may set a handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def closed_pipe() -> int:
    """The reader of standard output went away (``stash … | head``): stop
    quietly. Standard output is pointed at /dev/null first, or the
    interpreter's own flush at exit would fail on the closed pipe again and
    print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (replaced, closed): nothing left to flush
        pass
    return CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    interruptible()
    utf8_streams()
    p = parser()
    try:
        if argv[:1] and argv[0] in PACKAGE_VERBS:
            raise Failure(
                f"stash: {argv[0]} runs only from the installed package, not this one-file client "
                f"(it has the HTTP verbs alone): from a checkout, python3 -m venv .venv && "
                f".venv/bin/pip install '.[mcp]', then .venv/bin/stash {argv[0]}",
                USAGE,
            )
        args = p.parse_args(argv)
        if not getattr(args, "func", None):
            p.print_help(sys.stderr)
            return USAGE
        _JSON["on"] = bool(args.json)
        if args.verb == "nap" and args.block is not None and not args.text:
            raise Failure(
                f"stash: nap {args.block} needs the summary; give it on stdin:\n{SHELL.lead}"
                f"{SHELL.nap(args.block if _block(args.block) else '<lo-hi>')}",
                USAGE,
            )
        status: int = args.func(args)
        return status
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (Failure, StashError) as error:
        f = refused(error) if isinstance(error, StashError) else error
        if _JSON["on"] and f.body is not None:
            _emit_json(f.body)
        sys.stdout.flush()
        sys.stderr.write(f.message.rstrip("\n") + "\n")
        if f.extra:
            sys.stderr.write("\n" + f.extra.rstrip("\n") + "\n")
        return f.code
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        return closed_pipe()
    except UnicodeDecodeError:
        sys.stderr.write("stash: the input is not UTF-8 text; convert it (iconv -t UTF-8) and try again.\n")
        return USAGE
    except Exception as e:  # never a traceback: it could carry a memory's text
        if os.environ.get("STASH_DEBUG"):  # unless asked for, on this machine (CONTRIBUTING, "Debugging")
            traceback.print_exc()
        sys.stderr.write(
            f"stash: unexpected error ({type(e).__name__}); nothing more is shown, since a trace could "
            "hold the text of notes. Try again; if it persists, report it with the command you ran.\n"
        )
        return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
