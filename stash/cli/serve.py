"""``stash serve``: run the server with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ..crypto.keys import DEFAULT_KDF, KdfParams
from ..service.quotas import DEFAULT_BYTES, DEFAULT_MEMORIES
from ..web.jsonio import BODY_CAP, IMPORT_BODY_CAP

DEFAULT_DATA = "~/.stash/data"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
MIN_BODY = 4096  # a note or nap body at the largest ENTRY_CHARS, every character \u-escaped, is under 2 KiB
MAX_BODY = 1 << 30
DEFAULT_SHUTDOWN_S = 30.0
MAX_WORKERS = 64
MAX_SLOTS = 1024
OPEN_FILES = 8192  # see _room_for_open_files
APP_FACTORY = "stash.web.app:app_from_env"

ENV_PREFIX = "STASH_"
# STASH_URL is the client's: the server it calls. The server's own public
# address gets a name of its own, so a shell set up for the client cannot
# silently put that address into a local server's /init prompt.
ENV_NAMES = {"url": "STASH_PUBLIC_URL"}


class ConfigError(Exception):
    """A setting that cannot be served; the message says which and why."""


def env_name(dest: str) -> str:
    return ENV_NAMES.get(dest, ENV_PREFIX + dest.upper())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stash serve", description="Run the Stash server.",
        epilog="Every option can also come from the environment as STASH_<OPTION> (STASH_PORT, "
               "STASH_TRUSTED_PROXY=a,b, ...), except --url, which is STASH_PUBLIC_URL. A flag beats the variable.")
    p.add_argument("--data", default=DEFAULT_DATA, help=f"data folder (default: {DEFAULT_DATA})")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--url", default=None, help="public address written into /init's AGENTS.md block")
    p.add_argument("--init", choices=("open", "invite", "off"), default="open",
                   help="who may mint identities: anyone (rate-limited), holders of the invite secret, nobody")
    p.add_argument("--invite-secret-env", default="STASH_INVITE_SECRET", metavar="VAR",
                   help="environment variable holding the invite secret for --init invite")
    p.add_argument("--metrics-token-env", default="STASH_METRICS_TOKEN", metavar="VAR",
                   help="environment variable holding the bearer token for /metrics (unset: loopback only)")
    p.add_argument("--init-per-minute", type=int, default=10, help="identities one address may mint per minute")
    p.add_argument("--auth-failures-per-minute", type=int, default=30,
                   help="failed authentications one address may make per minute before 429")
    p.add_argument("--trusted-proxy", action="append", default=None, metavar="CIDR",
                   help="a reverse proxy network whose X-Forwarded-For is believed; repeat for several "
                        "(default: none, the TCP peer is the client)")
    p.add_argument("--max-body", type=int, default=BODY_CAP, metavar="BYTES",
                   help=f"largest request body, every route but /import (default {BODY_CAP})")
    p.add_argument("--max-import-body", type=int, default=IMPORT_BODY_CAP, metavar="BYTES",
                   help=f"largest POST /import body (default {IMPORT_BODY_CAP})")
    p.add_argument("--user-id-prefix", action="append", default=None, metavar="HEX",
                   help="mint only user ids starting with this hex prefix (this host's shard of a fleet); "
                        "repeat for several (default: any id)")
    p.add_argument("--user-concurrency", type=int, default=4, metavar="N",
                   help="requests one memory may have in progress at once per worker; more get 429 (default 4)")
    p.add_argument("--user-slow", type=int, default=1, metavar="N",
                   help="slow requests (recall, import, export) one memory may have in progress per worker "
                        "(default 1)")
    p.add_argument("--slow-slots", type=int, default=2, metavar="N",
                   help="slow requests in progress per worker, all memories together; more get 429 (default 2)")
    p.add_argument("--quota-memories", type=int, default=DEFAULT_MEMORIES, metavar="N",
                   help=f"memories one identity may hold (default {DEFAULT_MEMORIES})")
    p.add_argument("--quota-bytes", type=int, default=DEFAULT_BYTES, metavar="BYTES",
                   help=f"disk one identity may take before its writes are refused (default {DEFAULT_BYTES})")
    p.add_argument("--init-per-day", type=int, default=50, metavar="N",
                   help="identities one address may mint per 24 hours (default 50)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="seconds a request's head (request line and headers) may take to arrive (default 10)")
    p.add_argument("--idle-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="seconds a kept-alive connection may idle between requests (default 5)")
    p.add_argument("--keep-open", type=float, default=5.0, metavar="SECONDS",
                   help="seconds a memory's files stay open in a worker after its last request, for the next "
                        "one to reuse; 0 closes them after every request (default 5)")
    p.add_argument("--kdf-time", type=int, default=DEFAULT_KDF.time_cost, help="argon2id passes for new grants")
    p.add_argument("--kdf-memory", type=int, default=DEFAULT_KDF.memory_kib, help="argon2id KiB for new grants")
    p.add_argument("--file-cipher", choices=("sqlcipher", "none"), default=None,
                   help="whole-file cipher for new stores (default: sqlcipher where it imports; none with "
                        "--replicate)")
    p.add_argument("--replicate", default=None, metavar="REPLICA",
                   help="also stream every store to REPLICA with Litestream (stash replicate): a folder, a URL, "
                        "or a JSON file of replica settings; new stores are then plain files, rows still sealed")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes sharing the port and the data folder (default 1)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_S, metavar="SECONDS",
                   help="on SIGTERM, how long in-flight requests may take to finish "
                        f"(default {DEFAULT_SHUTDOWN_S:g})")
    return p


def parse(argv: list[str], environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """The options from ``argv``, each falling back to its environment
    variable (:func:`env_name`), then to its default. An empty variable counts
    as unset. A repeatable option takes its variable as a comma- or
    space-separated list, and any flag of it replaces the whole list."""
    p = parser()
    lists: dict[str, list[str]] = {}
    for action in p._actions:  # argparse offers no public walk over its options
        if not action.option_strings or action.dest == "help":
            continue
        name = env_name(action.dest)
        value = environ.get(name, "").strip()
        if not value:
            continue
        if isinstance(action, argparse._AppendAction):
            lists[action.dest] = [v for v in re.split(r"[\s,]+", value) if v]
            continue
        try:
            converted = action.type(value) if callable(action.type) else value
        except ValueError:
            p.error(f"${name} is {value[:40]!r}, not a valid {action.metavar or action.dest}.")
        if action.choices and converted not in action.choices:
            p.error(f"${name} is {value[:40]!r}; choose from {', '.join(action.choices)}.")
        action.default = converted
    args = p.parse_args(argv)
    for dest, values in lists.items():
        if getattr(args, dest) is None:
            setattr(args, dest, values)
    return args


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] = os.environ):
    """The server's Settings from parsed options and the secrets' variables;
    :class:`ConfigError` for anything the server could not honour."""
    from ..crypto import tokens
    from ..storage.files import available_file_cipher
    from ..web.forwarded import parse_network
    from ..web.pages import is_safe_address
    from ..web.settings import Settings

    if args.file_cipher == "sqlcipher" and available_file_cipher() != "sqlcipher":
        raise ConfigError("--file-cipher sqlcipher, but sqlcipher3 does not import here.")
    if args.replicate is not None:
        from ..service.replica import ReplicaError, Target, litestream_binary

        if args.file_cipher == "sqlcipher":
            raise ConfigError("--replicate needs --file-cipher none: Litestream cannot read SQLCipher files.")
        try:
            Target.parse(args.replicate)
            litestream_binary()
        except ReplicaError as e:
            raise ConfigError(f"--replicate: {e}.") from None
    invite = environ.get(args.invite_secret_env) if args.init == "invite" else None
    if args.init == "invite" and not invite:
        raise ConfigError(f"--init invite needs the secret in ${args.invite_secret_env}.")
    if args.url is not None and not is_safe_address(args.url.rstrip("/")):
        raise ConfigError("--url must be a plain http(s) address, like https://stash.example.org.")
    proxies = []
    for text in args.trusted_proxy or ():
        try:
            proxies.append(str(parse_network(text)))
        except ValueError:
            raise ConfigError(f"--trusted-proxy {text[:60]!r} is not an address or a network like 10.0.0.0/8 "
                              "(with no host bits set).") from None
    for flag, value in (("--max-body", args.max_body), ("--max-import-body", args.max_import_body)):
        if not MIN_BODY <= value <= MAX_BODY:
            raise ConfigError(f"{flag} must be from {MIN_BODY} to {MAX_BODY} bytes.")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise ConfigError(f"--workers must be 1 to {MAX_WORKERS}.")
    for flag, value in (("--user-concurrency", args.user_concurrency), ("--user-slow", args.user_slow),
                        ("--slow-slots", args.slow_slots)):
        if not 1 <= value <= MAX_SLOTS:
            raise ConfigError(f"{flag} must be 1 to {MAX_SLOTS}.")
    for flag, value in (("--quota-memories", args.quota_memories), ("--quota-bytes", args.quota_bytes),
                        ("--init-per-day", args.init_per_day)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1.")
    for flag, seconds in (("--header-timeout", args.header_timeout), ("--idle-timeout", args.idle_timeout)):
        if not 0.1 <= seconds <= 3600:
            raise ConfigError(f"{flag} must be from 0.1 to 3600 seconds.")
    if not 0 <= args.keep_open <= 3600:
        raise ConfigError("--keep-open must be from 0 to 3600 seconds.")
    prefixes = tuple(dict.fromkeys(text.lower() for text in args.user_id_prefix or ()))
    for prefix in prefixes:
        if not tokens.is_id_prefix(prefix):
            raise ConfigError(f"--user-id-prefix {prefix[:20]!r} must be 1 to 4 hex digits, like a or 3f.")
    return Settings(
        data_dir=Path(os.path.expanduser(args.data)).resolve(),
        kdf=KdfParams(args.kdf_time, args.kdf_memory, 1),
        file_cipher="none" if args.replicate is not None else args.file_cipher,
        init=args.init,
        invite_secret=invite,
        operator_token=environ.get(args.metrics_token_env) or None,
        public_url=args.url,
        init_per_minute=args.init_per_minute,
        auth_failures_per_minute=args.auth_failures_per_minute,
        trusted_proxies=tuple(proxies),
        max_body=args.max_body,
        max_import_body=args.max_import_body,
        id_prefixes=prefixes,
        workers=args.workers,
        user_concurrency=args.user_concurrency,
        user_slow=args.user_slow,
        slow_slots=args.slow_slots,
        quota_memories=args.quota_memories,
        quota_bytes=args.quota_bytes,
        init_per_day=args.init_per_day,
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        keep_open=args.keep_open,
        replicate=args.replicate,
    )


def _room_for_open_files() -> None:
    """Raise this process's open-file limit (inherited by its workers) to
    :data:`OPEN_FILES`, or the hard limit where that is lower: each worker
    keeps up to storage/pool.py's MAX_IDLE connections open between requests,
    three descriptors each, beside its clients' sockets; the usual soft
    limit of 1,024 would be met under load long before the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _drained(signum, frame) -> None:
    """The stop signal, raised again once the server has finished: nothing left to do."""


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        settings = settings_from(args)
    except ConfigError as err:
        print(f"stash: {err}", file=sys.stderr)
        return 2
    import uvicorn

    from ..storage.files import available_file_cipher
    from ..web.metrics import prepare_multiprocess
    from ..web.settings import SETTINGS_ENV, to_env

    # Every file and folder the server makes is its own alone (0600 in 0700), whatever umask it was started
    # with; the workers inherit this.
    os.umask(0o077)
    _room_for_open_files()
    if args.workers > 1:
        os.environ.update(prepare_multiprocess(settings.data_dir))
    os.environ[SETTINGS_ENV] = to_env(settings, args.invite_secret_env, args.metrics_token_env)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    print(f"stash: data in {settings.data_dir}", flush=True)
    cipher = settings.file_cipher or available_file_cipher()
    print(f"stash: file cipher {cipher}; {args.workers} worker(s) listening on http://{args.host}:{args.port}",
          flush=True)
    if settings.trusted_proxies:
        print(f"stash: client address from X-Forwarded-For of {', '.join(settings.trusted_proxies)}", flush=True)
    # Every worker, one or many, builds its app from the same environment
    # variable, so a multi-worker server runs exactly the code a single one does.
    # uvicorn drains in-flight requests on SIGTERM or SIGINT, then raises the
    # signal again under the handler it found; this one lets a drained server
    # exit 0 instead of dying by the signal (or a KeyboardInterrupt traceback).
    # uvicorn's own proxy handling stays off: the app resolves the client
    # itself (stash.web.forwarded), the same way in tests as in production.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _drained)
    from ..web.timeouts import HeaderTimeoutProtocol

    replicator = _start_replicator(settings)
    try:
        uvicorn.run(APP_FACTORY, factory=True, host=args.host, port=args.port, workers=args.workers,
                    access_log=False, log_level="warning", server_header=False, proxy_headers=False,
                    timeout_graceful_shutdown=args.shutdown_timeout, http=HeaderTimeoutProtocol,
                    timeout_keep_alive=settings.idle_timeout)
    finally:
        _stop_replicator(replicator)
    return 0


def _start_replicator(settings) -> subprocess.Popen | None:
    """``stash replicate`` beside the server, in its process group (a stop
    of the service stops both), when --replicate names a replica."""
    if settings.replicate is None:
        return None
    print("stash: replicating every store with Litestream (stash replicate)", flush=True)
    return subprocess.Popen([sys.executable, "-m", "stash", "replicate", "--data", str(settings.data_dir),
                             settings.replicate], stdin=subprocess.DEVNULL)


def _stop_replicator(child: subprocess.Popen | None) -> None:
    """Let it ship what the server wrote last, then end it."""
    if child is None or child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
