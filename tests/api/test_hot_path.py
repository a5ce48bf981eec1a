"""The work one authenticated call does (issue 27, item 4): its token is
parsed once and its lookup tag derived once, however many checks use them;
a call that changed nothing in the key ring writes nothing to it."""

from __future__ import annotations

import pytest

from stash.crypto import tokens
from stash.storage import keyring as keyring_module
from tests.helpers import Api


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times a token was parsed and a lookup tag derived (the
    functions as every module reaches them: through the tokens module)."""
    calls = {"parse": 0, "lookup_tag": 0}
    parse, lookup_tag = tokens.parse, tokens.lookup_tag

    def counting_parse(text: str) -> tokens.Token | None:
        calls["parse"] += 1
        return parse(text)

    def counting_tag(user_id: str, secret: bytes) -> bytes:
        calls["lookup_tag"] += 1
        return lookup_tag(user_id, secret)

    monkeypatch.setattr(tokens, "parse", counting_parse)
    monkeypatch.setattr(tokens, "lookup_tag", counting_tag)
    return calls


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/wake", None),
    ("POST", "/note", {"text": "counted"}),
    ("GET", "/zoom?block=0-1", None),
    ("GET", "/grants", None),
])
def test_a_call_parses_its_token_once_and_derives_its_tag_once(api: Api, owner: str, counted: dict[str, int],
                                                               method: str, path: str, body: dict | None):
    for text in ("one", "two"):  # a block to zoom into
        assert api.post("/note", token=owner, json={"text": text}).status_code == 200
    api.post("/nap", token=owner, json={"block": "0-1", "text": "both"})
    api.get("/wake", token=owner)  # the tag index has this user's tags now, as on every later request
    counted.update(parse=0, lookup_tag=0)
    resp = api.send(method, path, {"Authorization": f"Bearer {owner}"}, **({} if body is None else {"json": body}))
    assert resp.status_code == 200, resp.text
    assert counted == {"parse": 1, "lookup_tag": 1}


def test_a_refused_token_is_parsed_once(api: Api, owner: str, counted: dict[str, int]):
    forged = owner[:-1] + ("A" if owner[-1] != "A" else "B")  # its checksum no longer matches
    assert api.get("/wake", token=forged).status_code == 401
    assert counted["parse"] == 1 and counted["lookup_tag"] == 0


def test_a_wake_writes_nothing_to_the_key_ring(api: Api, owner: str, monkeypatch: pytest.MonkeyPatch):
    assert api.post("/note", token=owner, json={"text": "first"}).status_code == 200
    api.get("/wake", token=owner)  # the day's last-used mark is written once a day per process
    writes: list[str] = []
    advance = keyring_module.Keyring.advance_head

    def counting_advance(self: keyring_module.Keyring, *args: object, **kw: object) -> bool:
        writes.append("advance_head")
        return advance(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(keyring_module.Keyring, "advance_head", counting_advance)
    assert api.get("/wake", token=owner).status_code == 200
    assert writes == []
    assert api.post("/note", token=owner, json={"text": "second"}).status_code == 200
    assert writes == ["advance_head"]
