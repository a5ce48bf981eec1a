"""An identity made offline with the project's own Vault and ``stash verify``
run on its folder: what the tests of verify, compact and the formats share."""

from __future__ import annotations

import os
from pathlib import Path

from stash.cli.main import main
from stash.service.access import Vault
from tests.support.api import CHEAP_KDF
from tests.support.files.raw import raw_memory_file
from tests.support.memories import MAIN_MEMORY, Memory


class Store:
    """An identity whose ``memory`` holds ``n`` notes: its owner ``token``, a
    read capability bound to that memory (``reader``), and the memory's
    folder and master key."""

    def __init__(self, data: Path, cipher: str, n: int = 6, memory: Memory = MAIN_MEMORY) -> None:
        self.data, self.cipher, self.memory = data, cipher, memory
        vault = Vault(data, kdf=CHEAP_KDF, file_cipher=cipher)
        ident = vault.create_identity()
        self.token, self.user_id = ident.token, ident.user_id
        memory.create_in(vault, self.token)
        with vault.session(self.token, "owner", memory=memory.name) as s:
            self.master = bytes(s.master)
            for k in range(n):
                s.open_memory().note(f"osprey memory {k}")
            self.reader = vault.mint_grant(s, "read")[1]
        self.folder = memory.folder(data / "users" / self.user_id)
        self.vault = vault

    def note(self, n: int) -> None:
        with self.vault.session(self.token, "full", memory=self.memory.name) as s:
            for k in range(n):
                s.open_memory().note(f"later osprey {k}")

    def raw(self):
        """The memory file as someone holding it and its key would open it,
        with the log's guards dropped."""
        return raw_memory_file(self.folder, self.master, self.cipher)


def run(capsys, data: Path, token: str | None = None, backup: bool = False) -> tuple[int, str]:
    args = ["verify", str(data), *(["--backup"] if backup else [])]
    old = os.environ.get("STASH_TOKEN")
    if token is not None:
        os.environ["STASH_TOKEN"] = token
        args.append("--token")
    try:
        code = main(args)
    finally:
        if old is None:
            os.environ.pop("STASH_TOKEN", None)
        else:
            os.environ["STASH_TOKEN"] = old
    out = capsys.readouterr()
    text = out.out + out.err
    assert str(data) not in text and "/tmp" not in text
    if token is not None:
        assert token.split("_")[2] not in text
    return code, text


def line_of(text: str, user_id: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith(user_id)]
    return line
