"""Main and a second memory of one identity, as a test reaches each
(docs/DESIGN.md, "Memories"), so that one test body runs for both (the
``memory`` fixture, tests/conftest.py): the owner's address of a route, the
body that mints a capability bound to the memory, the memory's folder, the
store id its rows are bound to, and the secret a token is filed under in its
key ring, for opening a copy offline with the project's own key code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stash.crypto import tokens
from stash.storage import memories
from stash.storage.keyring import Keyring
from stash.storage.memories import MAIN, SUBFOLDER

SECOND = "bravo"
MEMORIES = (MAIN, SECOND)


@dataclass(frozen=True)
class Memory:
    """One memory of an identity: ``main`` (the user's folder itself) or
    another, reached under ``/m/{name}`` and kept in ``users/<id>/m/<name>/``."""

    name: str

    @property
    def is_main(self) -> bool:
        return self.name == MAIN

    def __str__(self) -> str:
        return self.name

    def at(self, route: str) -> str:
        """The owner's address of ``route`` on this memory. A capability bound
        to it uses the root, which acts on the memory it is bound to."""
        return route if self.is_main else f"/m/{self.name}{route}"

    def grant(self, scope: str, **body: Any) -> dict[str, Any]:
        """The body of ``POST /grants`` minting a capability bound to this memory."""
        return {"scope": scope, **body} if self.is_main else {"scope": scope, "memory": self.name, **body}

    def create(self, client: Any, owner: str) -> None:
        """Make the memory with ``client`` (an Api or an Http); main is made with the identity."""
        if not self.is_main:
            resp = client.post("/memories", owner, json={"name": self.name})
            assert resp.status_code == 201, resp.text

    def create_in(self, vault: Any, owner: str) -> None:
        """Make the memory through ``vault`` (a Vault in this process), as
        ``POST /memories`` does."""
        if not self.is_main:
            from stash.service import memories as service

            with vault.session(owner, "owner") as s:
                service.create(vault, s, self.name)

    def folder(self, user_folder: Path) -> Path:
        """This memory's folder inside ``user_folder`` (a live user's folder or a copy of one)."""
        return user_folder if self.is_main else user_folder / SUBFOLDER / self.name

    def store(self, user_id: str) -> str:
        """The id every row and file of this memory is bound to."""
        return memories.store_id(user_id, self.name)

    def filed(self, user_folder: Path, token: str) -> tokens.Token:
        """``token`` as this memory's key ring files it, read from ``user_folder``
        (a copy will do): a capability's is itself; the owner's, in a memory
        but main, is the secret derived from its token and the memory's salt
        in main's key ring (storage/memories/__init__.py, ``owner_secret``)."""
        tok = tokens.parse(token)
        assert tok is not None, "not a token"
        if self.is_main:
            return tok
        main = Keyring(user_folder / "keyring.db", tok.user_id)
        ring = Keyring(self.folder(user_folder) / "keyring.db", self.store(tok.user_id))
        try:
            grant = main.find(tok.tag)
            if grant is None or grant.scope != "owner":
                return tok
            salt = memories.salt_of(main.conn, memories.number_of(ring.conn))
            assert salt is not None, f"main's key ring holds no salt for memory {self.name}"
            return tokens.Token(tok.user_id, memories.owner_secret(tok.secret, salt))
        finally:
            ring.close()
            main.close()


MAIN_MEMORY = Memory(MAIN)
"""The default of a helper that runs in main unless told which memory."""
