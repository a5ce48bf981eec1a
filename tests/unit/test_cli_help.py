"""`stash --help` names every verb: the client's and the host verbs that the
one-file client does not carry."""

from __future__ import annotations

import subprocess
import sys

from stash import client
from stash.cli.main import HOST_VERBS
from tests.support.installed import OUTSIDE


def test_help_lists_the_client_verbs_and_the_host_verbs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stash", "--help"], capture_output=True, text=True, timeout=60, cwd=OUTSIDE
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    missing = [v for v in [*client.VERBS, *HOST_VERBS] if v not in words]
    assert missing == [], done.stdout
