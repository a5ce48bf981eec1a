"""The server serves its protocol (issue 12 item 3) and names itself in its
OpenAPI document (item 4): GET /skill and GET /reference are public Markdown,
byte for byte the files of this repository, and refusals that refer to the
reference name its URL on this server, never a file path."""

from __future__ import annotations

from pathlib import Path

from stash.web.app import create_app
from tests.support.api import Api, assert_error, make_settings

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
    first_part = """curl -sS -H "Accept: text/plain" "$STASH_URL/reference" -d '{"part": 1}'"""
    assert '"$STASH_URL/skill"' in block and first_part in block
    assert "SKILL.md" not in block and "API-REFERENCE.md" not in block and "?" not in block


PART_BYTES = 20_000  # what a wake part holds by default: the most an agent's harness is handed at once


def test_the_reference_comes_in_parts_an_agent_reads_whole(api: Api) -> None:
    """Each part at most 20,000 bytes; part 1 says which part holds each
    section; each part but the last ends with the order (POST, no query
    string) that fetches the next; the parts' bodies, in order, are the
    whole reference, byte for byte."""
    whole = (REPO / "API-REFERENCE.md").read_text(encoding="utf-8")
    assert len(whole.encode()) > 5 * PART_BYTES  # what makes parts needed
    bodies, k = [], 1
    while True:
        resp = api.post("/reference", json={"part": k})
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/markdown; charset=utf-8"
        text = resp.text
        assert len(text.encode()) <= PART_BYTES, (k, len(text.encode()))
        lines = text.splitlines(keepends=True)
        assert lines[0].startswith(f"Part {k} of ")
        total = int(lines[0].split(" of ")[1].rstrip(".\n"))
        body = lines[2:]
        if k == 1:
            end = body.index("\n")  # the contents end at the first blank line
            contents = {line.strip() for line in body[:end]}
            assert (
                "- Word search: " + str(next(n for n, b in enumerate(bodies_of(api), 1) if "## Word search" in b))
                in contents
            )
            body = body[end + 1 :]
        if k < total:
            assert body[-1] == (
                f"""Run: curl -sS -H "Authorization: Bearer $STASH_TOKEN" -H "Accept: text/plain" """
                f"""\"$STASH_URL/reference\" -d '{{"part": {k + 1}}}'\n"""
            )
            assert body[-2] == "\n"
            bodies.append("".join(body[:-2]))
        else:
            assert body[-1] == "That is the whole reference.\n" and body[-2] == "\n"
            bodies.append("".join(body[:-2]))
            break
        k += 1
    assert "".join(bodies) == whole
    assert_error(api.post("/reference", json={"part": total + 1}), 422, "reference.no_part")
    assert api.get("/reference?part=2").text == api.post("/reference", json={"part": 2}).text
    # The skill an agent reads whole fits one part too.
    assert len(api.get("/skill").content) <= PART_BYTES


def bodies_of(api: Api) -> list[str]:
    out, k = [], 1
    while True:
        text = api.post("/reference", json={"part": k}).text
        out.append(text)
        if "That is the whole reference." in text:
            return out
        k += 1


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
