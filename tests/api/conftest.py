"""Fixtures local to the API tests.

The apps run their lifespan (``Api``, tests/support/api.py), as a served one does. The
modules of :data:`KEPT_OPEN` run twice over the ``api`` and ``module_api``
fixtures: with a memory's files closed after every request, and kept open
between requests as ``stash serve`` does by default (``--keep-open``,
storage/sqlite/pool.py); the others run with files closed only, which keeps the
suite within its time. ``STASH_TESTS_KEEP_OPEN=all`` runs every module both
ways (about twice the time of tests/api)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stash.web.app import create_app
from tests.api.support import Mem
from tests.support.api import Api, make_settings

KEPT_OPEN = {"test_api_routes", "test_api_idempotency", "test_capabilities", "test_api_scopes"}
KEEP_OPEN_SECONDS = 5.0  # stash serve's default


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    both = os.environ.get("STASH_TESTS_KEEP_OPEN") == "all" or metafunc.module.__name__.rsplit(".", 1)[-1] in KEPT_OPEN
    if "keep_open" in metafunc.fixturenames and both:
        metafunc.parametrize(
            "keep_open", [0.0, KEEP_OPEN_SECONDS], ids=["closed", "kept-open"], indirect=True, scope="module"
        )


@pytest.fixture(scope="module")
def keep_open(request: pytest.FixtureRequest) -> float:
    """Seconds the app keeps a memory's files open after a request."""
    return float(getattr(request, "param", 0.0))


@pytest.fixture
def api(data_dir: Path, keep_open: float):
    client = Api(create_app(make_settings(data_dir, keep_open=keep_open)))
    yield client
    client.close()


@pytest.fixture
def mem(api: Api, owner: str) -> Mem:
    return Mem(api, owner)


@pytest.fixture(scope="module")
def module_api(tmp_path_factory, keep_open: float):
    """One server for a module whose tests only send refused requests: each
    such test proves it changed nothing, so sharing the memory is safe and
    saves building a user per case."""
    client = Api(create_app(make_settings(tmp_path_factory.mktemp("data"), keep_open=keep_open)))
    yield client
    client.close()
