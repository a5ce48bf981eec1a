"""Who may open which memory: identities, capability checks, sessions.

A request's key material lives only inside :meth:`Vault.session`: the KEK is
derived, the master key unwrapped, the memory file opened with keys derived
from it, and on exit every reference is dropped. Nothing is cached across
requests. (Python cannot promise to zero freed memory; no key is kept in any
structure that outlives the request.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import Damaged, Forbidden, Unauthorized
from ..crypto import aead, keys, tokens
from ..storage.files import UserFiles, available_file_cipher
from ..storage.keyring import Keyring, open_keyring
from ..storage.memfile import MemoryFile
from .memory import Memory

RANK = {"read": 0, "full": 1, "owner": 2}


@dataclass
class Session:
    user_id: str
    scope: str
    grant_id: int
    memory: Memory
    keyring: Keyring


@dataclass(frozen=True)
class Identity:
    user_id: str
    token: str
    file_cipher: str


class Vault:
    """All users' stores under one data directory."""

    def __init__(self, data_dir: Path, kdf: keys.KdfParams = keys.DEFAULT_KDF, file_cipher: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.kdf = kdf
        self.file_cipher = file_cipher or available_file_cipher()
        (self.data_dir / "users").mkdir(parents=True, exist_ok=True, mode=0o700)

    def create_identity(self) -> Identity:
        """A new user: folder, key ring with the owner grant, empty memory file."""
        for _ in range(8):
            user_id = tokens.new_user_id()
            files = UserFiles(self.data_dir, user_id)
            try:
                files.create_folder()
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 2**64 ids
            raise RuntimeError("could not allot a user id")
        token, secret = tokens.mint(user_id)
        master = keys.new_master_key()
        ring = Keyring.create(files.keyring, user_id, self.file_cipher)
        try:
            ring.add(scope="owner", tag=tokens.lookup_tag(user_id, secret), secret=secret, master=master, kdf=self.kdf)
        finally:
            ring.close()
        MemoryFile(files.memory, user_id, master, self.file_cipher, create=True).close()
        return Identity(user_id, token, self.file_cipher)

    def _authenticate(self, token_text: str | None) -> tuple[tokens.Token, UserFiles, Keyring, object]:
        """Token to (token, files, key ring, grant) — or 401 without any key
        work: checksum, then the user's folder, then the grant's tag."""
        token = tokens.parse(token_text) if token_text else None
        if token is None:
            raise Unauthorized()
        files = UserFiles(self.data_dir, token.user_id)
        try:
            ring = open_keyring(files.keyring, token.user_id)
        except FileNotFoundError:
            raise Unauthorized() from None
        try:
            grant = ring.find(tokens.lookup_tag(token.user_id, token.secret))
        except Exception:
            ring.close()
            raise Damaged("The key ring of this store is unreadable; restore it from a backup.") from None
        if grant is None or grant.wrapped is None:
            ring.close()
            raise Unauthorized()
        return token, files, ring, grant

    def check_token(self, token_text: str | None) -> None:
        """Refuse a token that cannot be live (the cheap part of :meth:`session`)."""
        _, _, ring, _ = self._authenticate(token_text)
        ring.close()

    @contextlib.contextmanager
    def session(self, token_text: str | None, need: str) -> Iterator[Session]:
        token, files, ring, grant = self._authenticate(token_text)
        try:
            try:
                master = ring.unwrap(grant, token.secret)
            except aead.Unsealable:
                raise Damaged(
                    "This capability's key is damaged or was altered, so nothing was opened; "
                    "ask the owner for a new capability."
                ) from None
            # The scope is read only after the unwrap authenticated it.
            if RANK[grant.scope] < RANK[need]:
                raise Forbidden(
                    f"This capability is scoped {grant.scope}; this route needs {need}. "
                    "Ask the owner for a capability with that scope.",
                    code="auth.scope",
                )
            cipher = ring.meta("file_cipher") or "none"
            mf = MemoryFile(files.memory, token.user_id, master, cipher)
            del master
            try:
                yield Session(token.user_id, grant.scope, grant.id, Memory(mf), ring)
            finally:
                mf.close()
        finally:
            ring.close()
