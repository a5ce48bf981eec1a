"""End-to-end fixtures: one real ``stash serve`` for the session, an httpx
client, and the ``stash`` client in both of its forms (tests/support/server.py)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import loopback
from tests.support.fleet_drill import Fleet, running_fleet
from tests.support.seaweedfs import SeaweedFS
from tests.support.server import HTTP_TIMEOUT, Cli, Http, Server, cli_env, path_with, python_bin, start_server
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("e2e-server"))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def base_url(server: Server) -> str:
    return server.url


@pytest.fixture
def http(base_url: str) -> Iterator[Http]:
    h = Http(base_url)
    yield h
    h.close()


@pytest.fixture
def token(http: Http) -> str:
    return http.init()["token"]


@pytest.fixture(scope="session")
def client_file(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client as a user installs it: ``curl -o stash "$STASH_URL/client" && chmod +x stash``."""
    folder = python_bin(tmp_path_factory.mktemp("client-bin"))
    resp = loopback.get(base_url + "/client", timeout=HTTP_TIMEOUT)
    assert resp.status_code == 200, resp.text
    path = folder / "stash"
    path.write_bytes(resp.content)
    path.chmod(0o755)
    return path


@pytest.fixture(params=["module", "file"])
def cli(request, base_url: str, token: str, client_file: Path, tmp_path: Path) -> Cli:
    """The client in both of its forms: ``python -m stash`` (the package, with
    no ``stash`` on PATH) and the file served at ``GET /client`` on PATH as
    ``stash``."""
    if request.param == "module":
        path = path_with(python_bin(tmp_path / "bin"))
        return Cli([sys.executable, "-m", "stash"], cli_env(base_url, token, path))
    path = path_with(client_file.parent)
    return Cli([sys.executable, str(client_file)], cli_env(base_url, token, path))


@pytest.fixture(scope="session")
def has_curl() -> bool:
    return shutil.which("curl") is not None


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[TcpProxy]:
    """The way into the session's SeaweedFS, which a fleet test may cut."""
    way = TcpProxy(seaweedfs.s3_port)
    yield way
    way.close()


@pytest.fixture
def fleet(tmp_path: Path, seaweedfs: SeaweedFS, proxy: TcpProxy) -> Iterator[Fleet]:
    """The drill's fleet (tests/support/fleet_drill.py), replicating through ``proxy``."""
    with running_fleet(tmp_path, seaweedfs, proxy) as running:
        yield running
