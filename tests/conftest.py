"""Shared fixtures: a real data folder and the real app in process."""

from __future__ import annotations

import compileall
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import installed

# The package the tests run is the installed one, pinned before anything imports it; and every process a test
# starts gets no PYTHONPATH that would put another copy first (tests/support/installed.py).
PACKAGE = installed.pin()
os.environ.pop("PYTHONPATH", None)

from stash.web.app import create_app  # noqa: E402 - after the pin
from stash.web.tracelog import debugging  # noqa: E402
from tests.support.api import Api, make_settings  # noqa: E402
from tests.support.memories import MEMORIES, Memory  # noqa: E402
from tests.support.seaweedfs import SeaweedFS  # noqa: E402

# SQLite syncs every commit to disk, which was half of what a test of the
# memory model spent. No test is about surviving a power cut (a kill -9 loses
# the process, not the page cache), so the tests' folders live on a RAM-backed
# filesystem where there is one; the files are the same real SQLite files.
# TMPDIR (which the servers a test starts inherit) set by hand wins.
_RAM = Path("/dev/shm")
if "TMPDIR" not in os.environ and _RAM.is_dir() and os.access(_RAM, os.W_OK | os.X_OK):
    os.environ["TMPDIR"] = str(_RAM)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again

# Every `stash` client a test runs pins the heads it sees (stash/client.py);
# keep those pins in a folder of this test run, not in the user's ~/.config.
os.environ.setdefault("STASH_PINS", os.path.join(tempfile.mkdtemp(prefix="stash-test-pins-"), "pins.json"))


def pytest_configure(config) -> None:
    """Compile the bytecode of the package under test and of the tests once,
    before the workers start. The tests start hundreds of real ``stash``
    servers and clients, and where PYTHONDONTWRITEBYTECODE is set (as in CI)
    none of them may write a ``.pyc``: each would compile every module it
    imports again, about a second of CPU per server and half one per client.
    ``compileall`` writes the files whatever that variable says (pip wrote an
    installed wheel's already; an editable install's are the checkout's)."""
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist), once
        for folder in (PACKAGE, installed.CHECKOUT / "tests"):
            compileall.compile_dir(str(folder), quiet=1)
        if config.getoption("numprocesses", None):
            rewrite_tests_once(config)


def rewrite_tests_once(config) -> None:
    """Write pytest's assertion-rewritten bytecode of every test module and
    conftest once, for the xdist workers to read. Each worker imports every
    test module to collect it, and pytest rewrites a module's asserts on
    import (about 6 s of CPU for the whole suite), keeping the result only
    where bytecode may be written, which PYTHONDONTWRITEBYTECODE forbids: so
    under CI each worker rewrote all of it. pytest finds these files as it
    finds its own and checks each against its source's hash. Its functions
    for it are private: under a pytest without them, each worker rewrites
    as before."""
    try:
        from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc, assertstate_key, get_cache_dir

        state = config.stash[assertstate_key]
    except (ImportError, KeyError):  # another pytest, or --assert=plain
        return
    for path in sorted((installed.CHECKOUT / "tests").rglob("*.py")):
        if path.name.startswith("test_") or path.name == "conftest.py":
            cache = get_cache_dir(path)
            cache.mkdir(exist_ok=True)
            source_hash, code = _rewrite_test(path, config)
            _write_pyc(state, code, source_hash, cache / (path.name[:-3] + PYC_TAIL))


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker more than the cores. Part of every e2e test
    is spent waiting for a real server, a client or a killed process, and
    a third worker on two cores keeps both busy meanwhile (measured: 349 s
    with two workers, 327 s with three, the same suite on the same machine)."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(scope="session", autouse=True)
def outside_the_checkout() -> Iterator[None]:
    """Tests run in a working directory outside the checkout, so every
    process one starts does too, named or not (tests/support/installed.py). Set once
    the tests are collected: an xdist worker resolves the paths it was given
    from where it started."""
    before = os.getcwd()
    os.chdir(installed.OUTSIDE)
    yield
    os.chdir(before)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One real S3-compatible server (SeaweedFS) for every test of the
    session that needs one; each takes its own bucket (``seaweedfs.bucket()``)."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture(params=["sqlcipher", "none"])
def file_cipher(request) -> str:
    return request.param


@pytest.fixture(params=MEMORIES)
def memory(request) -> Memory:
    """The memory an owner guarantee is tested in: main, and a second memory
    of the same identity (tests/support/memories.py), so one body runs for both."""
    return Memory(request.param)


@pytest.fixture
def api(data_dir: Path):
    client = Api(create_app(make_settings(data_dir)))
    yield client
    client.close()


@pytest.fixture
def owner(api: Api) -> str:
    return api.init()["token"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under STASH_DEBUG (CONTRIBUTING, "Debugging"), a failed test's report
    ends with the log of every real server the test process started: their
    whole traces, since STASH_DEBUG reaches them through the environment."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and debugging():
        from tests.support.server import STARTED

        for server in {id(s): s for s in STARTED}.values():
            if server.log_text():
                report.sections.append((f"stash serve log ({server.log.name})", server.log_text()[-20_000:]))
