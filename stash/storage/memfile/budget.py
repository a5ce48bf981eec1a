"""How many memories each capability imported today: the counter behind
``stash serve --import-per-day`` (stash/service/quotas.py).

One meta row, ``import_budget``, sealed under the rows key like every value
(it names grant ids and counts, so a plain file shows neither), holding
``{"day": "YYYY-MM-DD", "grants": {id: count}}`` for one UTC day only: the
first import of a new day starts it afresh. It is read and written inside
the import's own transaction, so two concurrent imports cannot both slip
under the limit. It is a limit, not a record: a row that no longer opens
(sealed before a key epoch change) counts as empty.
"""

from __future__ import annotations

import json

from ...crypto import aead
from .base import FileBase
from .rows import RowCodec

BUDGET_META = "import_budget"


class ImportBudget:
    """The import counter of ``file``, sealed by ``codec``."""

    def __init__(self, file: FileBase, codec: RowCodec) -> None:
        self.file = file
        self.codec = codec

    def _budget(self, day: str) -> dict[str, int]:
        row = self.file.conn.execute("SELECT value FROM meta WHERE name = ?", (BUDGET_META,)).fetchone()
        if row is None:
            return {}
        try:
            doc = json.loads(
                aead.open_sealed(self.file.rows_key, bytes.fromhex(row[0]), self.codec.aad("meta", BUDGET_META))
            )
        except (ValueError, aead.Unsealable):
            return {}
        if not isinstance(doc, dict) or doc.get("day") != day or not isinstance(doc.get("grants"), dict):
            return {}
        return {str(k): int(v) for k, v in doc["grants"].items()}

    def imported_on(self, day: str, grant: int) -> int:
        """How many memories capability ``grant`` imported on UTC ``day``."""
        return self._budget(day).get(str(grant), 0)

    def count_import(self, day: str, grant: int, n: int) -> None:
        """Add ``n`` to ``grant``'s imports of ``day`` (call inside the import's transaction)."""
        grants = self._budget(day)
        grants[str(grant)] = grants.get(str(grant), 0) + n
        plain = json.dumps({"day": day, "grants": grants}, sort_keys=True).encode()
        self.file.put_meta(BUDGET_META, aead.seal(self.file.rows_key, plain, self.codec.aad("meta", BUDGET_META)).hex())
