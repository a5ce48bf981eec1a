"""The server serves its protocol (issue 12 item 3) and names itself in its
OpenAPI document (item 4): GET /skill and GET /reference are public Markdown,
byte for byte the files of this repository, and refusals that refer to the
reference name its URL on this server, never a file path."""

from __future__ import annotations

from pathlib import Path

from stash.web.app import create_app
from tests.helpers import Api, assert_error, make_settings

REPO = Path(__file__).resolve().parents[2]


def test_skill_and_reference_are_served_as_markdown(api: Api) -> None:
    for path, file in (("/skill", REPO / "skill" / "SKILL.md"), ("/reference", REPO / "API-REFERENCE.md")):
        resp = api.get(path)
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/markdown; charset=utf-8"
        assert resp.text == file.read_text(encoding="utf-8")
    assert_error(api.get("/skill?x=1"), 400, "request.unknown_field")


def test_refusals_name_the_reference_url_of_this_server(api: Api, owner: str) -> None:
    for resp in (api.get("/no-such-route"), api.delete("/wake")):
        message = assert_error(resp, resp.status_code)["message"]
        assert "http://stash.test/reference" in message and ".md" not in message
    bad = assert_error(api.post("/recall", owner, json={"q": "a{2,1}"}), 422, "recall.bad_pattern")
    assert "$STASH_URL/reference#recall-syntax" in bad["message"] and ".md" not in bad["message"]


def test_the_block_points_at_the_served_docs(api: Api) -> None:
    block = api.post("/init", json={"url": "https://stash.example"}).json()["prompt"]
    assert '"$STASH_URL/skill"' in block and "$STASH_URL/reference" in block
    assert "SKILL.md" not in block and "API-REFERENCE.md" not in block and "?" not in block


def test_openapi_names_its_public_url_as_server(tmp_path: Path) -> None:
    public = Api(create_app(make_settings(tmp_path / "a", public_url="https://memory.example")))
    try:
        assert public.get("/openapi.json").json()["servers"] == [{"url": "https://memory.example"}]
    finally:
        public.close()
    called = Api(create_app(make_settings(tmp_path / "b")))
    try:
        assert called.get("/openapi.json").json()["servers"] == [{"url": "http://stash.test"}]
        odd = called.get("/openapi.json", headers={"Host": "evil.example/$(reboot)"})
        assert "servers" not in odd.json()
    finally:
        called.close()
