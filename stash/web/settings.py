"""What one server process is configured with, and how it reaches a worker.

Every field of :class:`Settings` is declared by its ``stash serve`` option
(:mod:`stash.web.options`): adding an option is adding one field here, and the
parser, its environment variable, its checks, what workers inherit and
deploy/README.md's reference table follow from it.

``stash serve --workers N`` starts N processes that each build the app from
the environment variable :data:`SETTINGS_ENV`. It carries the settings as JSON
without any secret: the invite secret and the metrics token stay in their own
environment variables, named in the JSON, and each worker reads them itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..crypto import tokens
from ..crypto.keys import DEFAULT_KDF, KdfParams
from ..service.quotas import DEFAULT_BYTES, DEFAULT_IMPORT_PER_DAY, DEFAULT_IMPORT_PER_REQUEST, DEFAULT_MEMORIES
from .forwarded import parse_network
from .jsonio import BODY_CAP, IMPORT_BODY_CAP
from .options import Option, build, declared, decode, encode, option, parts
from .pages import is_safe_address

SETTINGS_ENV = "STASH_SERVE_SETTINGS"
MIN_BODY = 4096  # a note or nap body at the largest ENTRY_CHARS, every character \u-escaped, is under 2 KiB
BODY_CEILING = 1 << 30
MAX_WORKERS = 64
MAX_SLOTS = 1024


def _folder(text: str) -> Path:
    return Path(os.path.expanduser(text)).resolve()


def _file(text: str) -> str:
    return str(_folder(text))


def _public_url(url: str) -> str:
    if not is_safe_address(url.rstrip("/")):
        raise ValueError("must be a plain http(s) address, like https://stash.example.org.")
    return url


def _network(text: str) -> str:
    try:
        return str(parse_network(text))
    except ValueError:
        raise ValueError("is not an address or a network like 10.0.0.0/8 (with no host bits set).") from None


def _id_prefix(text: str) -> str:
    if not tokens.is_id_prefix(text.lower()):
        raise ValueError("must be 1 to 4 hex digits, like a or 3f.")
    return text.lower()


@dataclass
class Settings:
    """Everything a server process is configured with, each field declared by
    its ``stash serve`` option in the order --help and the reference list
    them. Built in code (tests, benches), a field left out takes the setting
    its option's default makes."""

    data_dir: Path = option(
        "--data",
        "~/.stash/data",
        "data folder",
        metavar="DIR",
        convert=_folder,
        required=True,
        doc="the data folder; each user is `users/<user_id>/` holding `keyring.db` and `memory.db` (and two "
        "empty lock files, `lock` and `gate`, for `stash backup`, and `grants.stamp`, the tag index's hint), "
        "and once the user has recalled, `recall.db`: the recall cache, sealed pieces of the rendered log "
        "that can be deleted at any time (the next recall rebuilds it). Every file the server creates is "
        "0600 and every folder 0700, whatever the umask it was started with (it sets its own to 077, and "
        "creates database files 0600 before SQLite opens them, whose `-wal` and `-shm` take that mode)",
    )
    host: str = option("--host", "127.0.0.1", "address to listen on", metavar="ADDRESS")
    port: int = option("--port", 8080, "port to listen on", metavar="PORT")
    # STASH_URL is the client's: the server it calls. The server's own public
    # address gets a name of its own, so a shell set up for the client cannot
    # silently put that address into a local server's /init prompt.
    public_url: str | None = option(
        "--url",
        None,
        "public address written into /init's AGENTS.md block",
        metavar="URL",
        env="STASH_PUBLIC_URL",
        convert=_public_url,
        doc="the public address written into `/init`'s `prompt` when the request has no `url`, and into the "
        "landing page's quickstart; a plain `http(s)://host[:port][/path]` (letters, digits, `.-_~%/` in "
        "the path), anything else refuses to start (exit 2)",
    )
    workers: int = option(
        "--workers",
        1,
        "server processes sharing the port and the data folder",
        metavar="N",
        low=1,
        high=MAX_WORKERS,
        doc="server processes sharing the port and the data folder (see [Several workers](#several-workers))",
    )
    shutdown_timeout: float = option(
        "--shutdown-timeout",
        30.0,
        "on SIGTERM, how long in-flight requests may take to finish",
        metavar="SECONDS",
        doc="on SIGTERM or SIGINT, how long requests in flight may take to finish before their connections are closed",
    )
    init: str = option(
        "--init",
        "open",
        "who may mint identities: anyone (rate-limited), holders of the invite secret, nobody",
        choices=("open", "invite", "off"),
        doc="who may mint identities: anyone (rate limited), holders of the invite secret, nobody",
    )
    invite_secret: str | None = option(
        "--invite-secret-env",
        "STASH_INVITE_SECRET",
        "environment variable holding the invite secret for --init invite",
        metavar="VAR",
        secret=True,
        when=("init", "invite"),
        doc="the environment variable holding the invite secret; `--init invite` without it set refuses to "
        "start (exit 2)",
    )
    operator_token: str | None = option(
        "--metrics-token-env",
        "STASH_METRICS_TOKEN",
        "environment variable holding the bearer token for /metrics (unset: loopback only)",
        metavar="VAR",
        secret=True,
        doc="the environment variable holding the bearer token for `/metrics`; unset or empty: loopback only",
    )
    init_per_minute: int = option("--init-per-minute", 10, "identities one address may mint per minute", metavar="N")
    init_per_day: int = option(
        "--init-per-day",
        50,
        "identities one address may mint per 24 hours",
        metavar="N",
        low=1,
        doc="identities one address may mint per 24 hours; then `429 quota.identities` with `Retry-After`",
    )
    auth_failures_per_minute: int = option(
        "--auth-failures-per-minute",
        30,
        "failed authentications one address may make per minute before 429",
        metavar="N",
    )
    trusted_proxies: tuple[str, ...] = option(
        "--trusted-proxy",
        (),
        "a reverse proxy network whose X-Forwarded-For is believed; repeat for several",
        metavar="CIDR",
        convert=_network,
        doc="a network (`10.0.0.0/8`) or one address (`127.0.0.1`, `::1`) of reverse proxies whose "
        "`X-Forwarded-For` is believed; with none, the TCP peer is the client. Host bits under the prefix "
        "(`10.0.0.1/8`) refuse to start (exit 2). See "
        "[client address](../API-REFERENCE.md#limits-and-rate-limiting)",
    )
    id_prefixes: tuple[str, ...] = option(
        "--user-id-prefix",
        (),
        "mint only user ids starting with this hex prefix (this host's shard of a fleet); repeat for several",
        metavar="HEX",
        convert=_id_prefix,
        shown_default="any id",
        doc="mint only user ids that start with this prefix (1 to 4 hex digits); for a fleet sharded by user "
        "id: each host mints only ids its shard serves "
        "([Scale-out](#6-scale-out-a-fleet-sharded-by-user-id))",
    )
    placement: str | None = option(
        "--placement",
        None,
        "this host is one of a fleet: the fleet's placement file, watched for a newer one",
        metavar="FILE",
        convert=_file,
        doc="this host is one of a fleet sharded by user id, and `FILE` is the fleet's placement "
        "([the fleet](#6-scale-out-a-fleet-sharded-by-user-id)). The host serves and mints only the users of the "
        "shards the placement gives `--fleet-host` (any other user's request is `421 fleet.elsewhere`), moves the "
        "folders of any other users to `released/e<epoch>/` in the data folder, and replicates to its shards' "
        "replica (none for a standby). It adopts the placement into `placement.json` in the data folder, watches "
        "`FILE` (about once a second) and adopts a newer epoch while it runs; an older epoch than the one adopted "
        "refuses to start (exit 2) and is ignored while running. Replaces `--user-id-prefix` and `--replicate`, "
        "which it derives (given together, it refuses to start); new memory files are plain files, as with "
        "`--replicate`",
    )
    fleet_host: str | None = option(
        "--fleet-host",
        None,
        "this host's name in the placement's hosts (with --placement)",
        metavar="NAME",
        doc="this host's name among the placement's `hosts`; required with `--placement`, and only with it. An MCP "
        "host's OAuth steps (which carry no token) that reach this host but belong to another are sent on to it",
    )
    max_body: int = option(
        "--max-body",
        BODY_CAP,
        "largest request body, every route but /import",
        metavar="BYTES",
        low=MIN_BODY,
        high=BODY_CEILING,
        doc="the largest request body on every route but `POST /import`",
    )
    max_import_body: int = option(
        "--max-import-body",
        IMPORT_BODY_CAP,
        "largest POST /import body",
        metavar="BYTES",
        low=MIN_BODY,
        high=BODY_CEILING,
        doc="the largest `POST /import` body",
    )
    quota_memories: int = option(
        "--quota-memories",
        DEFAULT_MEMORIES,
        "notes one identity may hold, all its memories together",
        metavar="N",
        low=1,
        doc="notes one identity may hold, all its memories together (erased ones count for nothing); a note "
        "or import that would pass it is `403 quota.memories`, whole",
    )
    max_memories: int = option(
        "--max-memories",
        100,
        "memories (named logs) one identity may hold",
        metavar="N",
        low=1,
        high=10_000,
        doc="memories (named logs, `POST /memories`) one identity may hold, `main` included; one more is "
        "`409 memory.too_many`",
    )
    quota_bytes: int = option(
        "--quota-bytes",
        DEFAULT_BYTES,
        "disk one identity may take before its writes are refused",
        metavar="BYTES",
        low=1,
        doc="disk one identity's folder may take; once it does, notes and imports are `403 quota.bytes` (a "
        "write that starts under it may end above it by its own size). Naps, forgets and config still "
        "work, so the memory stays usable read-only",
    )
    import_per_request: int = option(
        "--import-per-request",
        DEFAULT_IMPORT_PER_REQUEST,
        "notes one POST /import of a full capability may add",
        metavar="N",
        low=1,
        doc="notes one `POST /import` by a full capability may add; more is `403 quota.import_request`, "
        "whole. The owner's imports are not bounded",
    )
    import_per_day: int = option(
        "--import-per-day",
        DEFAULT_IMPORT_PER_DAY,
        "notes one full capability may import per UTC day",
        metavar="N",
        low=1,
        doc="notes one full capability may import per UTC day, all its requests together; then `403 "
        "quota.import_day`, whole, until the next UTC day. Notes written by `POST /note` are not counted. "
        "So one capability owes its memory at most this many naps a day by import, and its owner can undo them all "
        "([the owner's way back](../API-REFERENCE.md#post-eraseundo))",
    )
    user_concurrency: int = option(
        "--user-concurrency",
        4,
        "requests one memory may have in progress at once per worker; more get 429",
        metavar="N",
        low=1,
        high=MAX_SLOTS,
        doc="requests one memory may have in progress at once in a worker; more get `429 busy.user` (see "
        "[fair shares](../API-REFERENCE.md#limits-and-rate-limiting))",
    )
    user_slow: int = option(
        "--user-slow",
        1,
        "slow requests (recall, import, export) one memory may have in progress per worker",
        metavar="N",
        low=1,
        high=MAX_SLOTS,
        doc="slow requests (recall, import, export) one memory may have in progress in a worker; more get "
        "`429 busy.slow`",
    )
    slow_slots: int = option(
        "--slow-slots",
        2,
        "slow requests in progress per worker, all memories together; more get 429",
        metavar="N",
        low=1,
        high=MAX_SLOTS,
        doc="slow requests in progress in a worker, all memories together; more get `429 busy.server`",
    )
    header_timeout: float = option(
        "--header-timeout",
        10.0,
        "seconds a request's head (request line and headers) may take to arrive",
        metavar="SECONDS",
        low=0.1,
        high=3600,
        doc="how long a request's head (request line and headers) may take to arrive, from the connection's "
        "opening or the request's first byte; a slower client's connection is closed without an answer "
        "(slowloris)",
    )
    idle_timeout: float = option(
        "--idle-timeout",
        5.0,
        "seconds a kept-alive connection may idle between requests",
        metavar="SECONDS",
        low=0.1,
        high=3600,
        doc="how long a kept-alive connection may idle between requests before the server closes it",
    )
    keep_open: float = option(
        "--keep-open",
        5.0,
        "seconds a memory's files stay open in a worker after its last request, for the "
        "next one to reuse; 0 closes them after every request",
        metavar="SECONDS",
        low=0,
        high=3600,
        doc="how long a worker keeps a memory's two files open after its last request, so the next request "
        "reuses them instead of opening, checking and closing them again; 0 closes them after every "
        "request. Between requests each file's WAL is folded in once the file has been quiet for half a "
        "second, by the worker's own thread (the answer never waits for it); a file changed meanwhile "
        "by anything but another worker's commit through SQLite (which SQLite reads afresh itself) is "
        "opened afresh, a worker keeps at most 256 files "
        "open (the key rings and memory files of 128 memories; `stash serve` raises its open-file limit to "
        "8,192 where the hard limit allows), each with at most 512 KiB of page cache, and all are closed "
        "when it stops. What an open memory file holds in the worker's memory is its file key "
        "([SECURITY.md](../SECURITY.md#what-the-server-holds-between-requests))",
    )
    kdf: KdfParams = parts(
        DEFAULT_KDF,
        Option(
            "--kdf-time",
            None,
            "argon2id passes for new grants",
            metavar="N",
            part="time_cost",
            doc="argon2id passes for capabilities minted from now on",
        ),
        Option(
            "--kdf-memory",
            None,
            "argon2id KiB for new grants",
            metavar="KIB",
            part="memory_kib",
            doc="argon2id memory (KiB) for capabilities minted from now on",
        ),
    )
    file_cipher: str | None = option(
        "--file-cipher",
        None,
        "whole-file cipher for new stores",
        choices=("sqlcipher", "none"),
        shown_default="`sqlcipher` where `sqlcipher3` imports, else `none`",
        doc="whole-file cipher for new memories; asking for `sqlcipher` where it does not import refuses to "
        "start (exit 2); `none` whenever `--replicate` is given",
    )
    replicate: str | None = option(
        "--replicate",
        None,
        "also stream every store to REPLICA with Litestream (stash replicate): a folder, a "
        "URL, or a JSON file of replica settings; new stores are then plain files, rows still sealed",
        metavar="REPLICA",
        doc="stream every user's key ring and memory file to `REPLICA` with Litestream (`stash replicate` runs "
        "beside the server): a folder, an `sftp://` or `s3://` URL, or a JSON file of replica settings. New "
        "stores are then plain SQLite files whose rows stay sealed; SQLCipher stores already there are "
        "reported as not replicated; with `--file-cipher sqlcipher`, or where `litestream` is not installed, "
        "it refuses to start (exit 2). See [stash replicate](#stash-replicate)",
    )
    word_index: str = option(
        "--word-index",
        "on",
        "keep the sealed word index beside the recall cache (recall.db) for words searches",
        choices=("on", "off"),
        doc="`on`: words searches (`/recall` with `words`) keep and read a sealed word index in each memory's "
        "`recall.db` (about 49 bytes per memory on bench text, see bench/README.md); `off`: no index is "
        "written and every words search builds it from the whole log, slower than any regex recall (tens "
        "of seconds at a million memories). Existing index pieces are left unread while off",
    )
    oauth_code_seconds: int = option(
        "--oauth-code-seconds",
        50,
        "how long an MCP host's authorization code lives",
        metavar="SECONDS",
        low=1,
        high=55,
        doc="how long an MCP host's OAuth authorization code may wait for its redemption; a code not "
        "redeemed by then takes the capability it stood for with it, within a second more (so within "
        "60 s of the owner's approval)",
    )
    oauth_registrations_per_hour: int = option(
        "--oauth-registrations-per-hour",
        20,
        "MCP hosts one address may register per hour (POST /register)",
        metavar="N",
        low=1,
    )
    oauth_loopback_clients: str = option(
        "--oauth-loopback-clients",
        "off",
        "fetch MCP hosts' client metadata documents from loopback (tests only)",
        choices=("off", "on"),
        doc="`on`: a Client ID Metadata Document may be fetched from a loopback address, over http too; for "
        "tests, never on a server anyone else reaches. `off`: https only, and never from a loopback, "
        "private, link-local or other non-global address",
    )


OPTIONS: list[Option] = declared(Settings)
DATA = next(o for o in OPTIONS if o.field == "data_dir")  # stash backup and verify take the same folder
QUOTA_BYTES = next(o for o in OPTIONS if o.field == "quota_bytes")  # stash verify refuses files over twice it
FILE_CIPHER = next(o for o in OPTIONS if o.field == "file_cipher")  # stash migrate converts stores to `none`
PLACEMENT = next(o for o in OPTIONS if o.field == "placement")  # stash fleet's commands take the same file


def settings_from(parsed: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
    """The Settings each option's parsed value (by its ``dest``) makes;
    :class:`stash.web.options.ConfigError` for anything the server could not
    honour."""
    return build(Settings, parsed, environ)


def to_env(settings: Settings, secret_envs: Mapping[str, str]) -> str:
    """The settings as JSON for :data:`SETTINGS_ENV`: every field but the
    secrets, which travel as the names of the variables that hold them
    (``secret_envs``, by the option's ``dest``: ``{"invite_secret_env": ...}``)."""
    return json.dumps(encode(settings, secret_envs))


def from_env() -> Settings:
    return decode(Settings, json.loads(os.environ[SETTINGS_ENV]), os.environ)
