"""A child process that notes to one user as fast as it can over HTTP until a
stop file appears (or a bounded time passes), printing every acknowledged
memory at once as ``ID TEXT``. The token comes in STASH_TEST_TOKEN.

    python _noter.py URL LABEL STOPFILE
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx

LIFETIME_S = 60


def main() -> int:
    url, label, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    headers = {"Authorization": f"Bearer {os.environ['STASH_TEST_TOKEN']}"}
    deadline = time.monotonic() + LIFETIME_S
    k = 0
    with httpx.Client(base_url=url, timeout=30.0) as client:
        while not stop.exists() and time.monotonic() < deadline:
            text = f"{label} note {k}"
            resp = client.post("/note", json={"text": text}, headers=headers)
            if resp.status_code != 200:
                sys.stderr.write(f"refused {resp.status_code} {resp.text[:200]}\n")
                return 1
            sys.stdout.write(f"{resp.json()['id']} {text}\n")
            sys.stdout.flush()
            k += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
