"""The landing page in a real headless Chromium against a real ``stash serve``:
it loads without a console error under its own Content-Security-Policy, its
bars are exactly the blocks ``GET /shape`` (and ``blocks.cover``) give for the
slider's T, moved by real key strokes and clicks, never more than the budget,
and its quickstart names this server. A screenshot is left in
``test-artifacts/landing.png`` for a person to look at."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator

import pytest

from stash.core import blocks
from stash.core.sizes import SIZES
from tests.e2e.browser import Chromium, chromium_path
from tests.support import loopback
from tests.support.server import HTTP_TIMEOUT, REPO, Server

pytestmark = pytest.mark.slow

BUDGET = SIZES["WAKE_LINES"].default
SCREENSHOT = REPO / "test-artifacts" / "landing.png"
BARS = """JSON.stringify([...document.querySelectorAll('#bars rect.line')].map(r => [
  +r.dataset.first, +r.dataset.last, +r.getAttribute('height'), +r.getAttribute('fill-opacity'),
  r.getAttribute('fill')]))"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    binary = chromium_path()
    assert binary, "this test needs Debian's chromium package: apt-get install --no-install-recommends chromium"
    chrome = Chromium(binary, tmp_path_factory.mktemp("chromium") / "profile")
    try:
        chrome.open_page()
        yield chrome
    finally:
        chrome.close()


@pytest.fixture
def page(browser: Chromium, server: Server) -> Chromium:
    browser.console.messages.clear()
    browser.console.exceptions.clear()
    browser.base = server.url
    browser.goto(server.url + "/")
    browser.wait_for("document.getElementById('bars').getAttribute('data-t')")
    return browser


def slider_value(page: Chromium) -> int:
    return int(page.js("document.getElementById('t').value"))


def t_of(value: int) -> int:
    """The documented scale: 100 slider steps a decade, 0 is one memory."""
    return max(1, round(10 ** (value / 100)))


def settle(page: Chromium, value: int) -> list[list]:
    """Wait until the page has drawn the T of slider position ``value``, then
    check its bars against the server's answer and the algorithm itself."""
    T = t_of(value)
    page.wait_for(f"document.getElementById('bars').getAttribute('data-t') === '{T}'")
    bars = json.loads(page.js(BARS))
    answer = loopback.get(f"{page.base}/shape", params={"T": T, "lines": BUDGET}, timeout=HTTP_TIMEOUT)
    assert answer.status_code == 200, answer.text
    drawn = [[first, last] for first, last, *_ in bars]
    assert drawn == answer.json()["blocks"], T
    assert drawn == [[lo, hi - 1] for lo, hi in blocks.cover(T, BUDGET)], T
    assert 0 < len(bars) <= BUDGET, (T, len(bars))
    assert page.js("document.getElementById('tv').textContent") == f"{T:,}"
    assert page.js("document.getElementById('t').getAttribute('aria-valuetext')").startswith(f"{T:,} note")
    check_heights(bars)
    return bars


def check_heights(bars: list[list]) -> None:
    """Height grows strictly with the memories a line covers, opacity falls,
    and a verbatim memory is drawn apart from every summary."""
    by_size: dict[int, tuple[float, float, str]] = {}
    for first, last, height, opacity, fill in bars:
        look = (height, opacity, fill)
        assert by_size.setdefault(last - first + 1, look) == look, (first, last)
    sizes = sorted(by_size)
    for small, big in itertools.pairwise(sizes):
        assert by_size[small][0] < by_size[big][0], (small, big)
        if small > 1:
            assert by_size[small][1] > by_size[big][1], (small, big)
    if 1 in by_size:
        assert all(by_size[1][2] != by_size[s][2] for s in sizes if s > 1)


def click_on(page: Chromium, selector: str, fraction: float = 0.5) -> None:
    found = f"document.querySelector({json.dumps(selector)})"
    page.js(f"{found}.scrollIntoView({{block: 'center'}})")
    box = json.loads(page.js(f"JSON.stringify({found}.getBoundingClientRect())"))
    page.click(box["x"] + box["width"] * fraction, box["y"] + box["height"] / 2)


def no_errors(page: Chromium) -> None:
    assert page.console.errors() == [], page.console.errors()


def test_page_loads_clean_under_its_policy_and_names_this_server(page: Chromium, server: Server) -> None:
    settle(page, 300)
    quickstart = page.js("[...document.querySelectorAll('pre code')].pop().textContent")
    init = f'curl -sS -H "Accept: text/plain" {server.url}/init \\\n     -d \'{{"url": "{server.url}"}}\''
    assert init in quickstart
    assert f"export STASH_URL={server.url}\n" in quickstart
    # The route table, rebuilt from /openapi.json, shows each read as its POST twin: no query string.
    rows = page.wait_for(
        "document.querySelectorAll('#routes tr').length > 6 && "
        "[...document.querySelectorAll('#routes tr td:first-child')].map(td => td.textContent)"
    )
    assert "POST /recall" in rows and "POST /zoom" in rows and "GET /recall" not in rows
    assert not any("?" in row for row in rows) and len(rows) == len(set(rows))
    no_errors(page)
    # The policy is enforced — a script the page did not ship is refused — and
    # the refusal reaches the console this test reads, so its silence above means something.
    injected = """(() => { const s = document.createElement('script'); s.textContent = 'window.injected = 1';
      document.body.appendChild(s); return window.injected === undefined ? 'refused' : 'ran'; })()"""
    assert page.js(injected) == "refused"
    assert "script-src" in page.wait_console("Content Security Policy")


def test_slider_moves_the_bars_by_keyboard_and_mouse(page: Chromium, capsys: pytest.CaptureFixture) -> None:
    seen = {}
    click_on(page, ".presets button[data-v='200']")  # a real mouse click on "100"
    assert slider_value(page) == 200
    seen[200] = settle(page, 200)
    page.js("document.getElementById('t').focus()")
    page.press("ArrowLeft", "ArrowLeft", 37)
    seen[199] = settle(page, 199)  # 98 memories: the first summaries
    page.press("ArrowLeft", "ArrowLeft", 37)
    seen[198] = settle(page, 198)  # 95 memories: every one verbatim
    assert [b[1] - b[0] for b in seen[198]] == [0] * 95
    assert any(b[1] > b[0] for b in seen[199])
    page.press("Home", "Home", 36)
    assert slider_value(page) == 0
    seen[0] = settle(page, 0)
    assert seen[0] == [[0, 0, *seen[0][0][2:]]]
    page.press("End", "End", 35)
    assert slider_value(page) == 600
    seen[600] = settle(page, 600)
    assert len(seen[600]) == BUDGET
    page.press("PageDown", "PageDown", 34)
    assert slider_value(page) < 600
    settle(page, slider_value(page))
    # Twenty strokes as fast as the protocol sends them: the page ends on the last.
    start = slider_value(page)
    for _ in range(20):
        page.press("ArrowLeft", "ArrowLeft", 37)
    assert slider_value(page) == start - 20
    settle(page, start - 20)
    click_on(page, "#t", 0.5)  # a real click halfway along the track
    assert 250 <= slider_value(page) <= 350
    settle(page, slider_value(page))
    heights = {v: sorted({b[2] for b in bars}) for v, bars in seen.items()}
    assert heights[600][-1] > heights[199][-1] > heights[0][-1]
    no_errors(page)

    click_on(page, ".presets button[data-v='400']")
    settle(page, 400)
    page.js("document.activeElement.blur()")
    page.js("window.scrollTo(0, 0)")
    path = page.screenshot(SCREENSHOT)
    with capsys.disabled():
        print(f"\nlanding page screenshot: {path}")


def test_a_failed_shape_is_shown_and_the_next_move_recovers(page: Chromium) -> None:
    settle(page, 300)
    page.call("Fetch.enable", {"patterns": [{"urlPattern": "*/shape"}]})
    try:
        page.js("document.getElementById('t').focus()")
        page.press("ArrowRight", "ArrowRight", 39)
        paused = page.wait_event("Fetch.requestPaused")
        body = json.dumps({"error": "busy", "message": "The server is busy; try again in a moment."})
        page.call(
            "Fetch.fulfillRequest",
            {
                "requestId": paused["requestId"],
                "responseCode": 503,
                "responseHeaders": [{"name": "Content-Type", "value": "application/json"}],
                "body": base64.b64encode(body.encode()).decode(),
            },
        )
        alert = page.wait_for("!document.getElementById('err').hidden && document.getElementById('err').textContent")
        assert "HTTP 503" in alert and "The server is busy" in alert and "1,023 notes" in alert
        assert page.js("document.getElementById('bars').getAttribute('class')") == "stale"
    finally:
        page.call("Fetch.disable")
    assert page.console.exceptions == []
    page.press("ArrowRight", "ArrowRight", 39)
    settle(page, 302)
    assert page.js("document.getElementById('err').hidden") is True
    assert page.js("document.getElementById('bars').getAttribute('class')") == ""
