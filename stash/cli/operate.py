"""``stash backup``, ``stash verify``, ``stash migrate`` and ``stash compact``: operator verbs run
on the server's host against its data folder, never over HTTP. Backup needs no token; verify
checks one user's store whole when ``--token`` is given (the capability read
from ``$STASH_TOKEN``, never from the command line); migrate converts, and
compact rewrites, each memory a given token opens."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..web.settings import DATA, FILE_CIPHER
from ..web.settings import QUOTA_BYTES as QUOTA

if TYPE_CHECKING:
    from ..service.ops.verify import Report

INCOMPLETE = 3
"""The exit status of an operator verb that left work undone: ``stash restore``
restored nobody or skipped someone, ``stash migrate`` left a memory as
SQLCipher, ``stash compact`` left a memory as it was. A failover or deploy
script must not take it for success."""

# A write that starts under the quota may end above it by its own size: a file
# over twice the quota is no store's (verify refuses to copy it).
OVERSIZE_FACTOR = 2


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _data(arg: str) -> Path:
    return Path(os.path.expanduser(arg)).resolve()


ERASURE_NOTE = (
    "stash: a backup keeps what was erased after it was taken, and what capabilities revoked after it "
    "could read, for as long as the backup is kept (the deploy timer keeps 14 daily ones); after a "
    'restore, re-apply the erasures made since (SECURITY.md, "Backups, restores and erasures").'
)


def _print_report(report: Report) -> None:
    status = "ok  " if report.ok else "FAIL"
    words = "; ".join(report.problems if not report.ok else report.facts)
    print(f"{report.user_id}  {status}  {words}", flush=True)
    for warning in report.warnings:  # not damage: verify still passes (SECURITY.md, "Clocks")
        print(f"{report.user_id}  WARN  {warning}", flush=True)


def backup_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="stash backup",
        description=(
            "Copy every user's files into DEST while the server keeps serving, then check each copy. "
            "Needs no token. DEST must not exist or be empty, and lie outside the data folder."
        ),
    )
    p.add_argument("dest", help="the new backup folder")
    # The data folder is stash serve's, by the same flag and variable.
    p.add_argument(
        DATA.flag,
        default=os.environ.get(DATA.env_var, DATA.default),
        help=f"the data folder (default: ${DATA.env_var} or {DATA.default})",
    )
    args = p.parse_args(argv)
    from ..service.ops.backup import BackupRefused, backup
    from ..service.ops.verify import Failed

    try:
        results = backup(_data(args.data), _data(args.dest))
    except (BackupRefused, Failed) as e:
        print(f"stash backup: refused: {e}.", file=sys.stderr)
        return 2
    failed = 0
    for copied, report in results:
        if report is None:
            print(f"{copied.user_id}  skip  {copied.note}", flush=True)
            continue
        _print_report(report)
        failed += not report.ok
    done = sum(1 for c, _ in results if c.copied)
    print(
        f"stash backup: {done} {'user' if done == 1 else 'users'} copied, {failed} "
        f"{'copy' if failed == 1 else 'copies'} failed their check."
    )
    print(ERASURE_NOTE)
    return 1 if failed else 0


def verify_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="stash verify",
        description=(
            "Check every user file of a data folder or a backup: that it opens, authenticates and agrees with "
            "its digest. Without --token only what needs no key; with --token, that user's store whole."
        ),
    )
    p.add_argument(
        "dir",
        nargs="?",
        default=os.environ.get(DATA.env_var, DATA.default),
        help=f"a data folder or backup (default: ${DATA.env_var} or {DATA.default})",
    )
    p.add_argument(
        "--token",
        action="store_true",
        help="also check everything the capability in $STASH_TOKEN opens (its user only)",
    )
    p.add_argument(
        "--backup",
        action="store_true",
        help="DIR must be a finished stash backup (its backup.json complete and agreeing with its files)",
    )
    p.add_argument(
        QUOTA.flag,
        type=int,
        default=_env_int(QUOTA.env_var, QUOTA.default),
        metavar="BYTES",
        help=f"the server's {QUOTA.flag}: a file over twice this is refused, not copied "
        f"(default: ${QUOTA.env_var} or {QUOTA.default})",
    )
    args = p.parse_args(argv)
    from ..crypto import tokens
    from ..service.ops.backup import check_manifest
    from ..service.ops.verify import Failed, unknown_entries, verify

    token = None
    parsed: tokens.Token | None = None
    if args.token:
        token = os.environ.get("STASH_TOKEN")
        parsed = tokens.parse(token or "")
        if parsed is None:
            print(
                "stash verify: --token reads a capability from $STASH_TOKEN, which does not hold one.", file=sys.stderr
            )
            return 2
    folder = _data(args.dir)
    try:
        reports = verify(folder, token, OVERSIZE_FACTOR * args.quota_bytes)
    except Failed as e:
        print(f"stash verify: {e}.", file=sys.stderr)
        return 2
    for report in reports:
        _print_report(report)
    failed = sum(not r.ok for r in reports)
    # Whole-folder checks, after the users: a backup's manifest, and what users/ holds that is no user's.
    for problem in check_manifest(folder, required=args.backup):
        print(f"backup  FAIL  {problem}", flush=True)
        failed += 1
    strange = unknown_entries(folder)
    if strange:
        shown = ", ".join(repr(n)[:80] for n in strange[:10]) + (" and more" if len(strange) > 10 else "")
        print(
            f"users/  FAIL  holds entries that are not users' folders: {shown} (never replicated or restored; "
            "look at them, then remove them)",
            flush=True,
        )
        failed += 1
    if parsed is not None and not any(r.user_id == parsed.user_id for r in reports):
        print("stash verify: the token's user has no store here.", file=sys.stderr)
        failed += 1
    print(f"stash verify: {len(reports)} {'user' if len(reports) == 1 else 'users'} checked, {failed} failed.")
    print(ERASURE_NOTE)
    return 1 if failed else 0


def _given_tokens(path: str | None) -> list[str]:
    """The capabilities migrate or compact may use: $STASH_TOKEN, and one a line from
    ``path`` ('-': standard input), never from the command line."""
    lines = [os.environ.get("STASH_TOKEN", "")]
    if path == "-":
        lines += sys.stdin.read().splitlines()
    elif path:
        lines += Path(path).read_text(encoding="utf-8").splitlines()
    return [t.strip() for t in lines if t.strip()]


def _folder_verb_args(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The options every verb that works through a data folder's memories
    with given tokens shares (migrate, compact), added after its own."""
    p.add_argument(
        DATA.flag,
        default=os.environ.get(DATA.env_var, DATA.default),
        help=f"the data folder (default: ${DATA.env_var} or {DATA.default})",
    )
    p.add_argument(
        "--tokens",
        default=None,
        metavar="FILE",
        help="capabilities to use, one a line ('-': standard input), besides $STASH_TOKEN",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to retry a memory a running server keeps open (default 30)",
    )
    return p.parse_args(argv)


def _tokens_and_folder(verb: str, args: argparse.Namespace) -> tuple[list[str], Path] | None:
    """The given tokens and the data folder of such a verb, or None once
    it has said on stderr why it cannot start."""
    try:
        given = _given_tokens(args.tokens)
    except (OSError, UnicodeDecodeError):
        print(f"{verb}: --tokens names a file that cannot be read.", file=sys.stderr)
        return None
    folder = _data(args.data)
    if not (folder / "users").is_dir():
        print(f"{verb}: the data folder has no users/ folder; check --data.", file=sys.stderr)
        return None
    return given, folder


def migrate_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="stash migrate",
        description=(
            "Convert every memory of every user of a data folder from SQLCipher files to plain SQLite files, which "
            "Litestream can replicate (every row stays sealed with XChaCha20-Poly1305), then check each user as "
            "stash verify does. A memory converts only with a token that opens it (the file key comes from its "
            "secret): $STASH_TOKEN and --tokens. Run it with the server stopped, or beside it: each memory moves "
            "under its lock, and its requests wait. A run that was killed is finished by running it again."
        ),
    )
    p.add_argument(FILE_CIPHER.flag, required=True, choices=["none"], help="the cipher to move to: none")
    args = _folder_verb_args(p, argv)
    from ..service.ops.migrate import migrate

    got = _tokens_and_folder("stash migrate", args)
    if got is None:
        return 2
    results = migrate(got[1], got[0], args.wait)
    counts = {"converted": 0, "plain": 0, "left": 0}
    failed = 0
    for user in results:
        for m in user.memories:
            counts[m.outcome] += 1
            print(f"{m.user_id}  {m.memory}  {m.outcome}{'  ' + m.note if m.note else ''}", flush=True)
        if user.report is not None:
            _print_report(user.report)
            failed += not user.report.ok
    print(
        f"stash migrate: {counts['converted']} converted, {counts['plain']} already plain, {counts['left']} "
        f"left as SQLCipher, {failed} failed their check, in {len(results)} "
        f"{'user' if len(results) == 1 else 'users'}."
    )
    if failed:
        return 1
    if counts["left"]:
        print(
            "stash migrate: not every memory is plain yet (see the 'left' lines); give a token that opens "
            "each, or run again once the server lets go of them.",
            file=sys.stderr,
        )
        return INCOMPLETE
    return 0


def compact_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="stash compact",
        description=(
            "Re-seal the summaries that earlier releases padded to one size into their 32-byte buckets, store their "
            "memory rows short (each rebuilt byte for byte when read, so the log's digest and every pin stay valid), "
            "then rewrite each memory file without the room they left (SQLite's VACUUM), then check each user as "
            "stash verify does. Servers of earlier releases cannot read a row stored short. A memory "
            "is compacted only with a full or owner token that opens it: $STASH_TOKEN and --tokens. Run it with the "
            "server stopped, or beside it: each memory is worked on under its lock, and its requests wait. A run that "
            "was killed is finished by running it again."
        ),
    )
    args = _folder_verb_args(p, argv)
    from ..service.ops.compact import compact

    got = _tokens_and_folder("stash compact", args)
    if got is None:
        return 2
    results = compact(got[1], got[0], args.wait)
    counts = {"compacted": 0, "left": 0}
    failed = 0
    for user in results:
        for m in user.memories:
            counts[m.outcome] += 1
            done = (
                f"  {m.resealed} summaries re-sealed, {m.shortened} rows stored short, "
                f"{m.before:,} -> {m.after:,} bytes"
                if m.outcome == "compacted"
                else ""
            )
            print(f"{m.user_id}  {m.memory}  {m.outcome}{done}{'  ' + m.note if m.note else ''}", flush=True)
        if user.report is not None:
            _print_report(user.report)
            failed += not user.report.ok
    print(
        f"stash compact: {counts['compacted']} compacted, {counts['left']} left as they were, {failed} failed "
        f"their check, in {len(results)} {'user' if len(results) == 1 else 'users'}."
    )
    if failed:
        return 1
    if counts["left"]:
        print(
            "stash compact: not every memory was compacted (see the 'left' lines); give a token that opens "
            "each, or run again once the server lets go of them.",
            file=sys.stderr,
        )
        return INCOMPLETE
    return 0
