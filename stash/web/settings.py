"""What one server process is configured with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..crypto.keys import DEFAULT_KDF, KdfParams


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
