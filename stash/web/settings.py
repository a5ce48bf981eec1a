"""What one server process is configured with, and how it reaches a worker.

``stash serve --workers N`` starts N processes that each build the app from
the environment variable :data:`SETTINGS_ENV`. It carries the settings as JSON
without any secret: the invite secret and the metrics token stay in their own
environment variables, named in the JSON, and each worker reads them itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..crypto.keys import DEFAULT_KDF, KdfParams
from ..service.quotas import DEFAULT_BYTES, DEFAULT_MEMORIES
from .jsonio import BODY_CAP, IMPORT_BODY_CAP

SETTINGS_ENV = "STASH_SERVE_SETTINGS"


@dataclass
class Settings:
    data_dir: Path
    kdf: KdfParams = DEFAULT_KDF
    file_cipher: str | None = None  # None: SQLCipher where it imports
    init: str = "open"  # "open" | "invite" | "off"
    invite_secret: str | None = field(default=None, repr=False)
    operator_token: str | None = field(default=None, repr=False)
    public_url: str | None = None
    init_per_minute: int = 10
    auth_failures_per_minute: int = 30
    trusted_proxies: tuple[str, ...] = ()  # networks whose X-Forwarded-For is believed; none by default
    max_body: int = BODY_CAP  # bytes, every route but POST /import
    max_import_body: int = IMPORT_BODY_CAP  # bytes, POST /import
    id_prefixes: tuple[str, ...] = ()  # /init mints user ids starting with one of these (a shard); () is any
    workers: int = 1
    user_concurrency: int = 4  # requests one user may have in flight per process (fairshare.py)
    user_slow: int = 1  # slow requests (recall, import, export) one user may have in flight per process
    slow_slots: int = 2  # slow requests in flight per process, all users together
    quota_memories: int = DEFAULT_MEMORIES  # memories one identity may hold
    quota_bytes: int = DEFAULT_BYTES  # bytes one identity's folder may take before writes are refused
    init_per_day: int = 50  # identities one address may mint per 24 hours
    header_timeout: float = 10.0  # seconds for a request's head to arrive (timeouts.py)
    idle_timeout: float = 5.0  # seconds a kept-alive connection may idle between requests
    keep_open: float = 5.0  # seconds a user's files stay open after its last request (storage/pool.py); 0: never
    replicate: str | None = None  # the replica `stash replicate` streams every store to; None: not replicated


def to_env(settings: Settings, invite_secret_env: str, metrics_token_env: str) -> str:
    """The settings as JSON for :data:`SETTINGS_ENV`: every field but the two
    secrets, which travel as the names of the variables that hold them."""
    return json.dumps({
        "data_dir": str(settings.data_dir),
        "kdf": [settings.kdf.time_cost, settings.kdf.memory_kib, settings.kdf.lanes],
        "file_cipher": settings.file_cipher,
        "init": settings.init,
        "invite_secret_env": invite_secret_env if settings.invite_secret else None,
        "metrics_token_env": metrics_token_env if settings.operator_token else None,
        "public_url": settings.public_url,
        "init_per_minute": settings.init_per_minute,
        "auth_failures_per_minute": settings.auth_failures_per_minute,
        "workers": settings.workers,
        "trusted_proxies": list(settings.trusted_proxies),
        "max_body": settings.max_body,
        "max_import_body": settings.max_import_body,
        "id_prefixes": list(settings.id_prefixes),
        "user_concurrency": settings.user_concurrency,
        "user_slow": settings.user_slow,
        "slow_slots": settings.slow_slots,
        "quota_memories": settings.quota_memories,
        "quota_bytes": settings.quota_bytes,
        "init_per_day": settings.init_per_day,
        "header_timeout": settings.header_timeout,
        "idle_timeout": settings.idle_timeout,
        "keep_open": settings.keep_open,
        "replicate": settings.replicate,
    })


def from_env() -> Settings:
    raw = json.loads(os.environ[SETTINGS_ENV])

    def secret(name: str | None) -> str | None:
        return (os.environ.get(name) or None) if name else None

    return Settings(
        data_dir=Path(raw["data_dir"]),
        kdf=KdfParams(*raw["kdf"]),
        file_cipher=raw["file_cipher"],
        init=raw["init"],
        invite_secret=secret(raw["invite_secret_env"]),
        operator_token=secret(raw["metrics_token_env"]),
        public_url=raw["public_url"],
        init_per_minute=raw["init_per_minute"],
        auth_failures_per_minute=raw["auth_failures_per_minute"],
        workers=raw["workers"],
        trusted_proxies=tuple(raw["trusted_proxies"]),
        max_body=raw["max_body"],
        max_import_body=raw["max_import_body"],
        id_prefixes=tuple(raw["id_prefixes"]),
        user_concurrency=raw["user_concurrency"],
        user_slow=raw["user_slow"],
        slow_slots=raw["slow_slots"],
        quota_memories=raw["quota_memories"],
        quota_bytes=raw["quota_bytes"],
        init_per_day=raw["init_per_day"],
        header_timeout=raw["header_timeout"],
        idle_timeout=raw["idle_timeout"],
        keep_open=raw["keep_open"],
        replicate=raw["replicate"],
    )
