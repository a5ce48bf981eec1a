"""What one server process is configured with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..crypto.keys import DEFAULT_KDF, KdfParams
from .jsonio import BODY_CAP, IMPORT_BODY_CAP


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
