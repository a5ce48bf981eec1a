"""Shared fixtures: a real data folder and the real app in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from stash.web.app import create_app
from tests.helpers import Api, make_settings


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture(params=["sqlcipher", "none"])
def file_cipher(request) -> str:
    return request.param


@pytest.fixture
def api(data_dir: Path):
    client = Api(create_app(make_settings(data_dir)))
    yield client
    client.close()


@pytest.fixture
def owner(api: Api) -> str:
    return api.init()["token"]
