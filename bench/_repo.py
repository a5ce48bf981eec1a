"""Imported first by every bench script: puts the repository root on
``sys.path``, so ``python bench/<script>.py`` finds this checkout's ``stash`` and
``tests/support/server.py``, the one server launcher of the tests and of bench/."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
