"""The first week's stumbles at the HTTP edge (issue 30): a 404 for a
trailing slash says to drop it, a 404 answers plain text when asked, the
landing page says what the client says and fits its column."""

from __future__ import annotations

import html
import re

from stash.web.routes import ROUTES
from tests.helpers import Api


def test_a_trailing_slash_is_told_to_drop_it(api: Api, owner: str) -> None:
    resp = api.post("/note/", owner, json={"text": "x"})
    assert resp.status_code == 404 and resp.json()["error"] == "route.unknown"
    assert "drop the trailing slash (/note)" in resp.json()["message"]
    other = api.post("/nothing/", owner, json={})
    assert other.status_code == 404 and "trailing slash" not in other.json()["message"]


def test_a_404_answers_plain_text_when_asked(api: Api) -> None:
    resp = api.get("/nothing", headers={"Accept": "text/plain"})
    assert resp.status_code == 404 and resp.headers["content-type"].startswith("text/plain")
    assert resp.headers["stash-error"] == "route.unknown"
    assert resp.text.startswith("No such route") and "{" not in resp.text


def landing(api: Api) -> str:
    resp = api.get("/")
    assert resp.status_code == 200
    return resp.text


def test_the_landing_sample_says_what_the_client_says(api: Api) -> None:
    from stash.web.plaintext import answer_text

    page = landing(api)
    sample = page.split("<pre><code>", 1)[1].split("</code></pre>", 1)[0]
    saved = answer_text("/note", {"id": 999, "nap": None}).strip()  # the client prints the same line
    assert sample.splitlines()[1] == saved == "Saved as #999."


def test_the_landing_route_table_names_each_read_by_its_get(api: Api) -> None:
    page = landing(api)
    rows = re.findall(r"<tr><td>(GET|POST|DELETE) (/\w+)</td>", page)
    declared = {(r.method, r.path) for r in ROUTES}
    assert rows
    for method, path in rows:
        assert (method, path) in declared
        if ("GET", path) in declared:
            assert method == "GET", path
    assert '(m === "get" && twin ? "POST"' not in page  # the script's table no longer shows the twin


def test_the_landing_quickstart_fits_its_column(api: Api) -> None:
    # main is 860 px less 40 of padding, the pre 34 more: 786 px of 14 px monospace (0.6 em a character) is
    # 93 characters. Each line stays well inside that for an address as long as the one a local server has.
    page = landing(api).replace("http://stash.test", "http://127.0.0.1:8080")
    block = page.split("<h2>Quickstart</h2>", 1)[1].split("</pre>", 1)[0]
    text = html.unescape(re.sub(r"<[^>]+>", "", block))
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and max(map(len, lines)) <= 84, max(lines, key=len)
