"""``stash serve``: run the server with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from ..crypto.keys import DEFAULT_KDF, KdfParams

DEFAULT_DATA = "~/.stash/data"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_SHUTDOWN_S = 30.0
MAX_WORKERS = 64
APP_FACTORY = "stash.web.app:app_from_env"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stash serve", description="Run the Stash server.")
    p.add_argument("--data", default=os.environ.get("STASH_DATA", DEFAULT_DATA),
                   help=f"data folder (default: $STASH_DATA or {DEFAULT_DATA})")
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
    p.add_argument("--kdf-time", type=int, default=DEFAULT_KDF.time_cost, help="argon2id passes for new grants")
    p.add_argument("--kdf-memory", type=int, default=DEFAULT_KDF.memory_kib, help="argon2id KiB for new grants")
    p.add_argument("--file-cipher", choices=("sqlcipher", "none"), default=None,
                   help="whole-file cipher for new stores (default: sqlcipher where it imports)")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes sharing the port and the data folder (default 1)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_S, metavar="SECONDS",
                   help="on SIGTERM, how long in-flight requests may take to finish "
                        f"(default {DEFAULT_SHUTDOWN_S:g})")
    return p


def _drained(signum, frame) -> None:
    """The stop signal, raised again once the server has finished: nothing left to do."""


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    import uvicorn

    from ..storage.files import available_file_cipher
    from ..web.metrics import clear_snapshots
    from ..web.settings import SETTINGS_ENV, Settings, to_env

    if args.file_cipher == "sqlcipher" and available_file_cipher() != "sqlcipher":
        print("stash: --file-cipher sqlcipher, but sqlcipher3 does not import here.", file=sys.stderr)
        return 2
    invite = os.environ.get(args.invite_secret_env) if args.init == "invite" else None
    if args.init == "invite" and not invite:
        print(f"stash: --init invite needs the secret in ${args.invite_secret_env}.", file=sys.stderr)
        return 2
    if not 1 <= args.workers <= MAX_WORKERS:
        print(f"stash: --workers must be 1 to {MAX_WORKERS}.", file=sys.stderr)
        return 2
    data = Path(os.path.expanduser(args.data)).resolve()
    settings = Settings(
        data_dir=data,
        kdf=KdfParams(args.kdf_time, args.kdf_memory, 1),
        file_cipher=args.file_cipher,
        init=args.init,
        invite_secret=invite,
        operator_token=os.environ.get(args.metrics_token_env) or None,
        public_url=args.url,
        init_per_minute=args.init_per_minute,
        auth_failures_per_minute=args.auth_failures_per_minute,
        workers=args.workers,
    )
    clear_snapshots(data)
    os.environ[SETTINGS_ENV] = to_env(settings, args.invite_secret_env, args.metrics_token_env)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    print(f"stash: data in {data}", flush=True)
    cipher = args.file_cipher or available_file_cipher()
    print(f"stash: file cipher {cipher}; {args.workers} worker(s) listening on http://{args.host}:{args.port}",
          flush=True)
    # Every worker, one or many, builds its app from the same environment
    # variable, so a multi-worker server runs exactly the code a single one does.
    # uvicorn drains in-flight requests on SIGTERM or SIGINT, then raises the
    # signal again under the handler it found; this one lets a drained server
    # exit 0 instead of dying by the signal (or a KeyboardInterrupt traceback).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _drained)
    uvicorn.run(APP_FACTORY, factory=True, host=args.host, port=args.port, workers=args.workers,
                access_log=False, log_level="warning", server_header=False, proxy_headers=False,
                timeout_graceful_shutdown=args.shutdown_timeout)
    return 0
