"""``stash serve --replicate``'s watch over ``stash replicate``: started
beside the server, started again whenever it exits while the server runs,
and stopped last, after the server has drained its requests (deploy/README.md,
"Replicated host")."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from ..web.settings import DATA

RESTART_PAUSE_S = 0.5
POLL_S = 0.2


class Replicator:
    """One ``stash replicate`` child at a time, for the server's life."""

    def __init__(self, data_dir: Path, replica: str) -> None:
        self._argv = [sys.executable, "-m", "stash", "replicate", DATA.flag, str(data_dir), replica]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._thread = threading.Thread(target=self._watch, name="replicate-watch", daemon=True)

    def start(self) -> Replicator:
        self._spawn()
        self._thread.start()
        return self

    def _spawn(self) -> None:
        with self._lock:
            if not self._stop.is_set():
                self.child = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            child = self.child
            if child is not None and child.poll() is not None and not self._stop.is_set():
                print(
                    f"stash: the replication supervisor (stash replicate) exited with {child.returncode}; "
                    "starting it again",
                    file=sys.stderr,
                    flush=True,
                )
                self.restarts += 1
                if self._stop.wait(RESTART_PAUSE_S):
                    return
                self._spawn()

    def stop(self, timeout: float) -> int | None:
        """Let it ship what the server wrote last (Litestream's shutdown
        sync, bounded), then end it: its exit status, 0 when everything
        written was shipped (None: it was not running)."""
        with self._lock:
            self._stop.set()
        child = self.child
        if child is None or child.poll() is not None:
            return None
        child.terminate()
        try:
            return child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            return None
