"""GET / and GET /shape as HTTP: the page's policy matches what it ships,
its quickstart names this server and nothing a hostile Host header wrote, and
/shape answers block boundaries only. The page's behaviour in a browser is
tests/e2e/test_landing_page.py."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stash.web.app import create_app
from stash.web.pages import PLACEHOLDER_ADDRESS, is_safe_address, page_address
from tests.api.support import Mem
from tests.support.api import Api, make_settings


def policy(resp) -> dict[str, list[str]]:
    out = {}
    for part in resp.headers["content-security-policy"].split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def quickstart(page: str) -> str:
    return page[page.index("<h2>Quickstart</h2>") :]


def test_page_policy_allows_exactly_its_own_script_and_style(api: Api) -> None:
    resp = api.get("/")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert resp.headers["referrer-policy"] == "no-referrer"
    csp = policy(resp)
    assert csp["default-src"] == ["'none'"]
    assert csp["connect-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"] and csp["base-uri"] == ["'none'"]
    scripts = re.findall(r"<script>(.*?)</script>", resp.text, re.S)
    styles = re.findall(r"<style>(.*?)</style>", resp.text, re.S)
    assert len(scripts) == 1 and len(styles) == 1
    assert csp["script-src"] == [sha256(scripts[0])]
    assert csp["style-src"] == [sha256(styles[0])]
    assert "unsafe-inline" not in resp.headers["content-security-policy"]


def test_page_loads_nothing_from_elsewhere(api: Api) -> None:
    text = api.get("/").text
    assert not re.search(r"<script[^>]*\bsrc=", text)
    assert not re.search(r"@import|url\(", text)
    for attr in re.findall(r'\b(?:src|href)="([^"]*)"', text):
        assert attr.startswith(("/", "#", "data:")), attr


def test_quickstart_names_the_host_the_page_was_asked_on(api: Api) -> None:
    text = quickstart(api.get("/", headers={"Host": "memory.example.org:8443"}).text)
    assert 'curl -sS -H "Accept: text/plain" http://memory.example.org:8443/init' in text
    assert "export STASH_URL=http://memory.example.org:8443\n" in text
    assert "{{" not in api.get("/").text


@pytest.mark.parametrize(
    "host",
    [
        'evil.example"><script>alert(1)</script>',
        "evil.example/<img src=x onerror=alert(1)>",
        "a.example'; rm -rf ~; echo '",
        "a.example$(id)",
        "x" * 300,
    ],
)
def test_a_hostile_host_header_cannot_write_into_the_page(api: Api, host: str) -> None:
    resp = api.get("/", headers={"Host": host})
    assert resp.status_code == 200
    assert resp.text.count("<script>") == 1 and "alert(1)" not in resp.text
    assert "rm -rf" not in resp.text and "$(id)" not in resp.text
    assert f"export STASH_URL={PLACEHOLDER_ADDRESS}\n" in quickstart(resp.text)


def test_the_operators_url_wins_over_the_host_header(tmp_path: Path) -> None:
    api = Api(create_app(make_settings(tmp_path, public_url="https://stash.example.org/memory/")))
    try:
        text = quickstart(api.get("/", headers={"Host": "internal:8080"}).text)
    finally:
        api.close()
    assert "export STASH_URL=https://stash.example.org/memory\n" in text
    assert "internal:8080" not in text


@pytest.mark.parametrize("url", ["javascript:alert(1)", 'https://a.example/"><b>', "https://a.example/?q='x'"])
def test_serve_refuses_a_url_that_could_not_be_pasted_safely(url: str, tmp_path: Path) -> None:
    # A subprocess with a deadline: were the check missing, the server would start and run on.
    done = subprocess.run(
        [sys.executable, "-m", "stash", "serve", "--data", str(tmp_path), "--port", "1", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--url must be a plain http(s) address" in done.stderr


def test_page_address_rules() -> None:
    assert page_address(None, "https", "stash.example.org") == "https://stash.example.org"
    assert page_address(None, "http", "[::1]:8080") == "http://[::1]:8080"
    assert page_address(None, "http", "127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert page_address(None, "http", None) == PLACEHOLDER_ADDRESS
    assert page_address(None, "http", "") == PLACEHOLDER_ADDRESS
    assert page_address(None, "http", "under_score.example") == PLACEHOLDER_ADDRESS
    assert page_address("https://m.example.org/", "http", "other") == "https://m.example.org"
    assert is_safe_address("http://127.0.0.1:8080") and is_safe_address("https://a.example/x/y")
    assert not is_safe_address("https://a.example/x y") and not is_safe_address("https://")


def test_shape_answers_boundaries_only(api: Api, mem: Mem) -> None:
    secret = "the spare key is under the third flowerpot"
    for _ in range(3):
        mem.note(secret)
    resp = api.get("/shape?T=3&lines=96")
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"T", "lines", "blocks"}
    assert body["blocks"] == [[0, 0], [1, 1], [2, 2]]
    assert all(type(n) is int for pair in body["blocks"] for n in pair)
    assert "flowerpot" not in resp.text and mem.token.split("_")[1] not in resp.text
    # The same answer with a token: /shape reads no memory, whoever asks.
    assert api.get("/shape?T=3&lines=96", mem.token).json() == body


@pytest.mark.parametrize("host", ["a.example'; rm -rf ~; echo '", "a.example$(id)"])
def test_a_hostile_host_header_cannot_write_into_the_init_prompt(api: Api, host: str) -> None:
    """/init without a url fills its AGENTS.md block from the Host header, as
    the page does: the same check keeps a shell command out of it."""
    resp = api.post("/init", headers={"Host": host}, json={})
    assert resp.status_code == 201
    prompt = resp.json()["prompt"]
    assert "rm -rf" not in prompt and "$(id)" not in prompt
    assert PLACEHOLDER_ADDRESS in prompt


def test_init_without_a_url_names_a_plain_host(api: Api) -> None:
    resp = api.post("/init", headers={"Host": "memory.example.org:8443"}, json={})
    assert "at http://memory.example.org:8443." in resp.json()["prompt"]
