"""``stash serve``: run the server with uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import re
import resource
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from types import FrameType

from ..web.options import ENV_PREFIX, ConfigError, Option
from ..web.settings import DATA, OPTIONS, Settings
from .supervise import Replicator

OPEN_FILES = 8192  # see _room_for_open_files
APP_FACTORY = "stash.web.app:app_from_env"

__all__ = ["ConfigError", "env_name", "main", "parse", "parser", "settings_from"]


def env_name(dest: str) -> str:
    """The environment variable of the option whose ``dest`` this is."""
    return next((o.env_var for o in OPTIONS if o.dest == dest), ENV_PREFIX + dest.upper())


def _help(o: Option) -> str:
    default = o.default_text().replace("`", "")
    shown = "" if o.default is None and o.shown_default is None else f" (default: {default})"
    return (o.help + shown).replace("%", "%%")


def parser() -> argparse.ArgumentParser:
    """``stash serve``'s parser, one argument per declared option (stash/web/settings.py)."""
    renamed = ", ".join(f"{o.flag}, which is {o.env_var}" for o in OPTIONS if o.env)
    p = argparse.ArgumentParser(
        prog="stash serve",
        description="Run the Stash server.",
        epilog=f"Every option can also come from the environment as {ENV_PREFIX}<OPTION> (a repeatable one as a "
        f"comma- or space-separated list), except {renamed}. A flag beats the variable.",
    )
    for o in OPTIONS:
        if o.repeat:
            p.add_argument(o.flag, action="append", default=None, metavar=o.metavar, help=_help(o))
        else:
            p.add_argument(
                o.flag, type=o.kind, default=o.default, choices=o.choices or None, metavar=o.metavar, help=_help(o)
            )
    return p


def parse(argv: list[str], environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """The options from ``argv``, each falling back to its environment
    variable (:func:`env_name`), then to its default. An empty variable counts
    as unset. A repeatable option takes its variable as a comma- or
    space-separated list, and any flag of it replaces the whole list."""
    p = parser()
    fallback: dict[str, object] = {}
    lists: dict[str, list[str]] = {}
    for o in OPTIONS:
        value = environ.get(o.env_var, "").strip()
        if not value:
            continue
        if o.repeat:
            lists[o.dest] = [v for v in re.split(r"[\s,]+", value) if v]
            continue
        try:
            converted = o.kind(value)
        except ValueError:
            p.error(f"${o.env_var} is {value[:40]!r}, not a valid {o.metavar or o.dest}.")
        if o.choices and converted not in o.choices:
            p.error(f"${o.env_var} is {value[:40]!r}; choose from {', '.join(o.choices)}.")
        fallback[o.dest] = converted
    p.set_defaults(**fallback)
    args = p.parse_args(argv)
    for dest, values in lists.items():
        if getattr(args, dest) is None:
            setattr(args, dest, values)
    return args


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Settings:
    """The server's Settings from parsed options and the secrets' variables;
    :class:`ConfigError` for anything the server could not honour. Every
    check is the options' own but one: whether this host can give the file
    cipher asked for, which only the storage layer knows."""
    from ..storage.sqlite.connections import available_file_cipher
    from ..web import settings

    if args.file_cipher == "sqlcipher" and available_file_cipher() != "sqlcipher":
        raise ConfigError("--file-cipher sqlcipher, but sqlcipher3 does not import here.")
    if (args.placement is None) != (args.fleet_host is None):
        raise ConfigError("--placement and --fleet-host go together: the fleet's placement file and this host's name.")
    if args.placement is not None:
        if args.replicate is not None or args.user_id_prefix:
            raise ConfigError(
                "--placement gives this host its shards and its replica: leave out --user-id-prefix and --replicate."
            )
        if args.file_cipher == "sqlcipher":
            raise ConfigError("--placement needs --file-cipher none: a fleet replicates with Litestream.")
        from ..service.ops.replica import ReplicaError, litestream_binary

        try:
            litestream_binary()
        except ReplicaError as e:
            raise ConfigError(f"--placement: {e}.") from None
    if args.replicate is not None:
        from ..service.ops.replica import ReplicaError, Target, litestream_binary

        if args.file_cipher == "sqlcipher":
            raise ConfigError("--replicate needs --file-cipher none: Litestream cannot read SQLCipher files.")
        try:
            Target.parse(args.replicate).environment(environ)
            litestream_binary()
        except ReplicaError as e:
            raise ConfigError(f"--replicate: {e}.") from None
    made = settings.settings_from(vars(args), environ)
    # A replicated host's new stores are plain files (their rows stay sealed): Litestream reads them with its
    # own keyless SQLite. So are a fleet host's, which replicates as soon as it holds a shard.
    if made.replicate is not None or made.placement is not None:
        return dataclasses.replace(made, file_cipher="none")
    return made


def _room_for_open_files() -> None:
    """Raise this process's open-file limit (inherited by its workers) to
    :data:`OPEN_FILES`, or the hard limit where that is lower: each worker
    keeps up to storage/sqlite/pool.py's MAX_IDLE connections open between requests,
    three descriptors each, beside its clients' sockets; the usual soft
    limit of 1,024 would be met under load long before the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def startup_problem(settings: Settings) -> str | None:
    """What would stop the server once it said it listens, as one sentence
    saying what to do, or None: the data folder must be a folder this user
    can make and write in, and the address must be free to bind. Checked
    before anything is printed, so "listening" is printed only by a server
    that can listen and store (a bind race with another process after this
    check is still uvicorn's to report)."""
    from ..storage.private_files import private_folder

    data = settings.data_dir
    try:
        private_folder(data)
        if not data.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        probe = tempfile.NamedTemporaryFile(dir=data, prefix=".stash-probe-")
        probe.close()
    except OSError as err:
        return (
            f"cannot use the data folder {data} ({err.strerror or type(err).__name__}); "
            f"give {DATA.flag} a folder this user can create and write in."
        )
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT is no obstacle
            s.bind((settings.host, settings.port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return (
                f"port {settings.port} on {settings.host} is already in use (another server?); stop it or "
                f"choose another port with --port."
            )
        return (
            f"cannot listen on {settings.host}:{settings.port} ({err.strerror or type(err).__name__}); "
            f"check --host and --port."
        )
    return None


SHUTTING_DOWN = "stash: shutting down: no new connections; finishing the requests in flight"


class _ShutdownOnly(logging.Filter):
    """uvicorn's warnings and errors, and of its info lines only the one that
    says a stop signal was taken, reworded as ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if record.getMessage() == "Shutting down":
            record.msg, record.args = SHUTTING_DOWN, ()
            return True
        return False


def shutdown_logging() -> dict[str, object]:
    """uvicorn's logging: its warnings, and one line when shutdown starts
    (main prints the line when it ends); every other info line of uvicorn's
    (started, waiting for startup...) says nothing an operator acts on."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"shutdown": {"()": _ShutdownOnly}},
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(message)s"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "plain",
                "filters": ["shutdown"],
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
            "uvicorn.access": {"level": "WARNING"},
        },
    }


def _drained(signum: int, frame: FrameType | None) -> None:
    """The stop signal, raised again once the server has finished: nothing left to do."""


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        settings = settings_from(args)
    except ConfigError as err:
        print(f"stash: {err}", file=sys.stderr)
        return 2
    problem = startup_problem(settings)
    if problem is not None:
        print(f"stash: {problem}", file=sys.stderr)
        return 2
    fleet = None
    if settings.placement is not None:
        from ..fleet.host import Host

        try:
            fleet = Host.start(settings)
        except ValueError as err:  # PlacementError, or a replica Litestream cannot take
            print(f"stash: --placement {settings.placement}: {err}.", file=sys.stderr)
            return 2
        settings = fleet.settings
    import uvicorn

    from ..storage.sqlite.connections import available_file_cipher
    from ..web.metrics import prepare_multiprocess, remove_multiprocess
    from ..web.settings import SETTINGS_ENV, to_env

    # Every file and folder the server makes is its own alone (0600 in 0700), whatever umask it was started
    # with; the workers inherit this.
    os.umask(0o077)
    _room_for_open_files()
    counters = None
    if settings.workers > 1:
        env, counters = prepare_multiprocess(settings.data_dir)
        os.environ.update(env)
    os.environ[SETTINGS_ENV] = to_env(settings, {o.dest: getattr(args, o.dest) for o in OPTIONS if o.secret})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    print(f"stash: data in {settings.data_dir}", flush=True)
    if counters is not None and settings.data_dir in counters.parents:
        print(
            "stash: warning: no memory-backed folder (/dev/shm) apart from the data folder for the workers' "
            "metrics; they share its disk, and a full disk stops the workers",
            file=sys.stderr,
            flush=True,
        )
    cipher = settings.file_cipher or available_file_cipher()
    print(
        f"stash: file cipher {cipher}; {settings.workers} worker(s) listening on "
        f"http://{settings.host}:{settings.port}",
        flush=True,
    )
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

    # uvicorn annotates its timeouts as int, but takes seconds as a float (asyncio's call_later).
    replicator = None
    if fleet is None:
        replicator = _start_replicator(settings)
    else:
        data_dir = settings.data_dir
        fleet.replicate(lambda replica: Replicator(data_dir, replica).start(), _stop_replicator)
    try:
        uvicorn.run(
            APP_FACTORY,
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            access_log=False,
            log_config=shutdown_logging(),
            log_level=None,
            server_header=False,
            proxy_headers=False,
            http=HeaderTimeoutProtocol,
            timeout_keep_alive=settings.idle_timeout,  # type: ignore[arg-type]
            timeout_graceful_shutdown=settings.shutdown_timeout,  # type: ignore[arg-type]
        )
    finally:
        if fleet is not None:
            fleet.stop()
        else:
            _stop_replicator(replicator)
        if counters is not None:
            remove_multiprocess(counters)
    print("stash: stopped; every request in flight was answered or timed out", file=sys.stderr, flush=True)
    return 0


def _start_replicator(settings: Settings) -> Replicator | None:
    """``stash replicate`` beside the server, in its process group (a stop
    of the service stops both), watched and started again if it exits, when
    --replicate names a replica."""
    if settings.replicate is None:
        return None
    print("stash: replicating every store with Litestream (stash replicate)", flush=True)
    return Replicator(settings.data_dir, settings.replicate).start()


def _stop_replicator(replicator: Replicator | None) -> int | None:
    """Let it ship what the server wrote last, for at most
    :data:`~stash.service.ops.replica.SHUTDOWN_SYNC_S` plus a margin, then
    end it: 0 when everything was shipped (:meth:`Replicator.stop`)."""
    if replicator is None:
        return None
    from ..service.ops.replica import SHUTDOWN_SYNC_S
    from .replicate import STOP_MARGIN_S

    return replicator.stop(SHUTDOWN_SYNC_S + 2 * STOP_MARGIN_S)
