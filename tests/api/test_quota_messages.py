"""What a quota refusal tells whom (API-REFERENCE.md, "Quotas"): the quotas
count every memory of an identity together, and only the owner learns the
numbers; a capability bound to one memory learns nothing of the identity's
other memories from a refusal (how many memories they hold, how much disk
they take), only the operator's limit. Each of read-write scopes in main and
in a second memory."""

from __future__ import annotations

import re

import pytest

from stash.web.app import create_app
from tests.support.api import Api, assert_error, make_settings

QUOTA = 40
DATE = "2026-01-05"


def numbers(message: str) -> list[str]:
    return re.findall(r"\d[\d,]*", message)


@pytest.mark.parametrize("where", ["main", "bravo"])
@pytest.mark.parametrize("scope", ["full", "append"])
def test_a_bound_capability_learns_nothing_of_the_other_memories(data_dir, where: str, scope: str) -> None:
    api = Api(create_app(make_settings(data_dir, quota_memories=QUOTA)))
    try:
        owner = api.init()["token"]
        ok = api.post("/memories", owner, json={"name": "bravo"})
        assert ok.status_code == 201, ok.text
        other = "bravo" if where == "main" else "main"
        prefix = "" if other == "main" else f"/m/{other}"
        entries = [{"date": DATE, "text": f"the other memory's {k}"} for k in range(QUOTA - 3)]
        assert api.post(f"{prefix}/import", owner, json={"entries": entries}).status_code == 200
        token = api.post("/grants", owner, json={"scope": scope, "memory": where}).json()["token"]
        for k in range(3):
            assert api.post("/note", token, json={"text": f"its own {k}"}).status_code == 200
        body = assert_error(api.post("/note", token, json={"text": "one too many"}), 403, "quota.memories")
        assert numbers(body["message"]) == [f"{QUOTA:,}"], body["message"]
        # The owner is told how many the identity holds together and how many more fit.
        here = "" if where == "main" else f"/m/{where}"
        body = assert_error(api.post(f"{here}/note", owner, json={"text": "mine"}), 403, "quota.memories")
        assert f"{QUOTA:,} notes together" in body["message"] and "0 more fit" in body["message"]
    finally:
        api.close()


@pytest.mark.parametrize("where", ["main", "bravo"])
def test_a_bound_capability_is_told_no_size(data_dir, where: str) -> None:
    api = Api(create_app(make_settings(data_dir, quota_bytes=1)))
    try:
        owner = api.init()["token"]
        assert api.post("/memories", owner, json={"name": "bravo"}).status_code == 201
        token = api.post("/grants", owner, json={"scope": "full", "memory": where}).json()["token"]
        body = assert_error(api.post("/note", token, json={"text": "any"}), 403, "quota.bytes")
        assert numbers(body["message"]) == [], body["message"]
        body = assert_error(api.post("/note", owner, json={"text": "any"}), 403, "quota.bytes")
        assert "MiB" in body["message"]
    finally:
        api.close()
