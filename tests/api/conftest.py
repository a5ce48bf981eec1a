"""Fixtures local to the API tests."""

from __future__ import annotations

import pytest

from stash.web.app import create_app
from tests.api.support import Mem
from tests.helpers import Api, make_settings


@pytest.fixture
def mem(api: Api, owner: str) -> Mem:
    return Mem(api, owner)


@pytest.fixture(scope="module")
def module_api(tmp_path_factory):
    """One server for a module whose tests only send refused requests: each
    such test proves it changed nothing, so sharing the memory is safe and
    saves building a user per case."""
    client = Api(create_app(make_settings(tmp_path_factory.mktemp("data"))))
    yield client
    client.close()
