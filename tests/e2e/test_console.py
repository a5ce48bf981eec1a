"""The owner console in a real headless Chromium against a real ``stash serve``.

One walk through every action the page offers, as an owner would click it,
with the API's own state checked after each step (through httpx, never through
the page): sign in (an MCP host's OAuth grant listed like any other), create,
mint, revoke, read, erase by id and by words, fork, delete, rotate. Then what
must never happen: the owner token in any storage, cookie, address, request
body or log; a memory line or a label run as markup. Screenshots at 1280 and 390 pixels wide land in test-artifacts/."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash.core import blocks
from tests.e2e.browser import BrowserError, Chromium, chromium_path, desktop_page
from tests.support import loopback
from tests.support.mcp.oauth import approved_code, exchange
from tests.support.server import HTTP_TIMEOUT, REPO, Http, Server, start_server

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"
SCRIPT_LINE = "<script>document.title='pwned-script'</script> harbor review moved"
IMG_LINE = "<img src=x onerror=\"document.title='pwned-img'\"> priya said so"
HOSTILE_LABEL = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("console-server"))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    with desktop_page(tmp_path_factory.mktemp("console-chromium") / "profile") as browser:
        yield browser


def click(page: Chromium, selector: str) -> None:
    """Focus the control and press Enter on it, as a keyboard user would; it must be focusable and enabled."""
    until(
        page,
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        " return !!e && !e.disabled && e.offsetParent !== null; })()",
    )
    page.js(f"document.querySelector({json.dumps(selector)}).focus()")
    assert page.js(f"document.activeElement === document.querySelector({json.dumps(selector)})"), selector
    page.enter()


def type_into(page: Chromium, selector: str, text: str) -> None:
    page.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = ''; e.focus(); }})()")
    page.type_text(text)


def choose(page: Chromium, selector: str, value: str) -> None:
    until(
        page, f"[...document.querySelector({json.dumps(selector)}).options].some(o => o.value === {json.dumps(value)})"
    )
    page.js(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
        " e.dispatchEvent(new Event('change')); })()"
    )


def click_until(page: Chromium, selector: str, expression: str, tries: int = 3) -> None:
    """Press the control until ``expression`` holds: after an action the page
    renders its tables again, and a row's button pressed in that moment may
    be one the new table has already replaced (the press then does nothing,
    as it would for a person, who presses again)."""
    for _ in range(tries - 1):
        click(page, selector)
        try:
            page.wait_for(expression, timeout=10.0)
            return
        except BrowserError:
            continue
    click(page, selector)
    until(page, expression)


def until(page: Chromium, expression: str) -> None:
    """Wait for ``expression``; a failure names what the page's status line said."""
    try:
        page.wait_for(expression)
    except BrowserError as e:
        said = page.js("document.getElementById('status').textContent")
        raise AssertionError(f"{e}; the page said: {said}") from None


def status(page: Chromium) -> str:
    return page.js("document.getElementById('status').textContent")


def wait_status(page: Chromium, words: str) -> None:
    until(page, f"document.getElementById('status').textContent.includes({json.dumps(words)})")


def memories(http: Http, tok: str) -> dict[str, dict]:
    return {m["name"]: m for m in http.ok("GET", "/memories", tok)["memories"]}


def grants(http: Http, tok: str) -> dict[int, dict]:
    return {g["id"]: g for g in http.ok("GET", "/grants", tok)["grants"]}


def test_every_console_action_against_a_real_server(served: Server, chrome: Chromium, tmp_path: Path) -> None:
    page = chrome
    http = Http(served.url)
    owner = http.init()["token"]
    for text in ("first plan: jade over chrome", SCRIPT_LINE, IMG_LINE, "fourth: the Harbor review is Friday"):
        http.ok("POST", "/note", owner, json={"text": text})
    # An MCP host that connected by OAuth holds a grant like any other, labelled with its name; used once.
    code, verifier, reg = approved_code(http, owner, served.url, scope="read")
    hosted = exchange(http, code, verifier, reg["client_id"]).json()["access_token"]
    http.ok("POST", "/wake", hosted, json={})
    (host_gid,) = [g["id"] for g in grants(http, owner).values() if g["label"] == "Test host"]

    # Headers: a strict policy on every file of the page.
    for path in ("/console", "/console.js", "/console.css"):
        r = loopback.get(served.url + path, timeout=HTTP_TIMEOUT)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "http" not in csp.replace("'self'", "")
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in loopback.get(served.url + "/console", timeout=HTTP_TIMEOUT).text.replace(
        '<script src="/console.js" defer></script>', ""
    )

    page.goto(served.url + "/console")
    assert page.js("document.getElementById('insecure').hidden")
    # Every control has a name a screen reader says.
    unlabelled = page.js(
        "[...document.querySelectorAll('input, select, textarea')].filter(e => "
        "!e.labels.length && !e.getAttribute('aria-label')).map(e => e.id)"
    )
    assert unlabelled == []

    # Sign in by keyboard: the token typed, Enter pressed.
    type_into(page, "#token", owner)
    page.enter()
    until(page, "!document.getElementById('app').hidden")
    until(page, "!!document.querySelector('#memories tbody tr[data-memory=\"main\"]')")
    assert page.js("document.getElementById('token').value") == ""
    until(page, f"!!document.querySelector('#grants tr[data-grant=\"{host_gid}\"] button.danger')")
    cells = page.js(
        f"[...document.querySelector('#grants tr[data-grant=\"{host_gid}\"]').cells].map(c => c.textContent)"
    )
    assert cells[1:4] == ["main", "read", "Test host"] and cells[6] and cells[8] == "Revoke…", cells

    # The live shape of main's wake is cover(T, WAKE_LINES).
    T = memories(http, owner)["main"]["T"]
    until(page, "!!document.querySelector('svg[data-memory=\"main\"]').getAttribute('data-blocks')")
    drawn = int(page.js("document.querySelector('svg[data-memory=\"main\"]').getAttribute('data-blocks')"))
    assert drawn == len(blocks.cover(T, 96))

    # Create a memory.
    type_into(page, "#create-name", "project-x")
    click(page, "#create-form button")
    until(page, "!!document.querySelector('#memories tbody tr[data-memory=\"project-x\"]')")
    assert memories(http, owner)["project-x"]["T"] == 0

    # Mint a read grant for it, with a hostile label: shown once, with the block.
    before = set(grants(http, owner))
    choose(page, "#mint-memory", "project-x")
    choose(page, "#mint-scope", "read")
    type_into(page, "#mint-label", HOSTILE_LABEL)
    click(page, "#mint-form button")
    until(page, "document.getElementById('secret').open")
    minted = page.js("document.getElementById('secret-token').value")
    block = page.js("document.getElementById('secret-block').value")
    assert minted.startswith("stash1_") and "/m/project-x" in block
    new = set(grants(http, owner)) - before
    assert len(new) == 1
    gid = new.pop()
    g = grants(http, owner)[gid]
    assert (g["scope"], g["label"], g.get("memory")) == ("read", HOSTILE_LABEL, "project-x")
    http.ok("POST", "/m/project-x/note", owner, json={"text": "a report from CI"})
    assert http.ok("POST", "/m/project-x/recall", minted, json={"q": "report"})["total"] == 1
    click(page, "#secret-done")
    until(page, "!document.getElementById('secret').open")
    until(page, "document.getElementById('secret-token').value === ''")  # the dialog forgets it once closed
    # The label is text in the grants table, never an element.
    until(page, f"!!document.querySelector('#grants tr[data-grant=\"{gid}\"]')")
    assert page.js("document.querySelectorAll('#grants img').length") == 0
    assert HOSTILE_LABEL in page.js(f"document.querySelector('#grants tr[data-grant=\"{gid}\"]').textContent")

    # Revoke it: the confirmation names the grant.
    click(page, f'#grants tr[data-grant="{gid}"] button')
    until(page, "document.getElementById('confirm').open")
    question = page.js("document.getElementById('confirm-text').textContent")
    assert f"#{gid}" in question and "read" in question and "project-x" in question
    click(page, "#confirm-yes")
    wait_status(page, f"Grant #{gid} revoked")
    assert grants(http, owner)[gid]["revoked"]
    assert http.request("POST", "/m/project-x/recall", minted, json={"q": "report"}).status_code == 401

    # Read main: memory lines are text, nothing in them runs.
    click_until(
        page,
        '#memories tr[data-memory="main"] button',
        "document.getElementById('reader-lines').textContent.includes('harbor review')",
    )
    reader = page.js("document.getElementById('reader-lines').textContent")
    assert SCRIPT_LINE in reader and IMG_LINE in reader
    assert page.js("document.querySelectorAll('#reader-lines script, #reader-lines img').length") == 0
    assert "pwned" not in page.js("document.title")

    # Erase by id: a dry run shows the line, then the receipt.
    choose(page, "#erase-ids-memory", "main")
    type_into(page, "#erase-ids", "1")
    click(page, "#erase-ids-form button")
    until(page, "!document.getElementById('erase-plan').hidden")
    assert SCRIPT_LINE in page.js("document.getElementById('erase-plan-lines').textContent")
    assert http.ok("GET", "/erasures", owner)["erasures"] == []  # a dry run erases nothing
    click(page, "#erase-go")
    wait_status(page, "Erased.")
    receipts = http.ok("GET", "/erasures", owner)["erasures"]
    assert [r["ids"] for r in receipts] == [[1]]
    assert "[erased]" in http.ok("POST", "/recall", owner, json={"q": "^#1 "})["matches"][0]

    # Erase by words across memories: counts and the very lines that would go first (as text), then one receipt.
    type_into(page, "#erase-words", "priya")
    choose(page, "#erase-words-memory", "")
    click(page, "#erase-words-form button")
    until(page, "!document.getElementById('erase-plan').hidden")
    plan = page.js("document.getElementById('erase-plan-lines').textContent")
    assert "memory main: 1 note" in plan and IMG_LINE in plan, plan
    assert page.js("document.querySelectorAll('#erase-plan-lines img').length") == 0
    assert http.ok("POST", "/recall", owner, json={"q": "priya"})["total"] == 1
    click(page, "#erase-go")
    wait_status(page, "Erased.")
    assert http.ok("POST", "/recall", owner, json={"q": "priya"})["total"] == 0

    # Fork main at 2, then delete project-x.
    choose(page, "#fork-source", "main")
    type_into(page, "#fork-name", "main-copy")
    type_into(page, "#fork-at", "2")
    click(page, "#fork-form button")
    until(page, "!!document.querySelector('#memories tbody tr[data-memory=\"main-copy\"]')")
    assert memories(http, owner)["main-copy"]["T"] == 2
    click(page, '#memories tr[data-memory="project-x"] button.danger')
    until(page, "document.getElementById('confirm').open")
    assert "project-x" in page.js("document.getElementById('confirm-text').textContent")
    click(page, "#confirm-yes")
    until(page, "!document.querySelector('#memories tbody tr[data-memory=\"project-x\"]')")
    assert "project-x" not in memories(http, owner)

    # The audit trail and the receipts the page lists are the API's: each event under its memory, by the
    # capability GET /grants lists.
    events = http.ok("GET", "/audit", owner)["events"]
    until(page, f"document.querySelectorAll('#audit tbody tr').length === {len(events)}")
    shown = page.js(
        "[...document.querySelectorAll('#audit tbody tr')].map(r => [...r.cells].slice(0, 4).map(c => c.textContent))"
    )
    assert shown == [[e["memory"], str(e["id"]), e["at"], str(e["grant"])] for e in events]
    assert {e["grant"] for e in events} <= set(grants(http, owner)), events
    receipts_now = sum(len(http.ok("GET", f"/m/{name}/erasures", owner)["erasures"]) for name in memories(http, owner))
    until(page, f"document.querySelectorAll('#erasures tbody tr').length === {receipts_now}")

    # Screenshots at both widths; at 390 nothing scrolls sideways but the tables' own boxes.
    ARTIFACTS.mkdir(exist_ok=True)
    for width, mobile in ((1280, False), (390, True)):
        page.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile},
        )
        page.wait_for(f"window.innerWidth === {width}")
        assert page.js("document.documentElement.scrollWidth") <= width
        page.screenshot(ARTIFACTS / f"console-{width}.png")
    page.call("Emulation.clearDeviceMetricsOverride")

    # Rotate: the new token shown once, with the warning; the page moves to it.
    click(page, "#rotate")
    until(page, "document.getElementById('confirm').open")
    click(page, "#confirm-yes")
    until(page, "document.getElementById('secret').open")
    assert "Save this token first" in page.js("document.getElementById('secret-warning').textContent")
    rotated = page.js("document.getElementById('secret-token').value")
    assert rotated.startswith("stash1_") and rotated != owner
    click(page, "#secret-done")
    wait_status(page, "rotated")
    assert http.request("GET", "/grants", rotated).status_code == 200
    assert http.request("GET", "/grants", owner).status_code == 401

    # The token was never anywhere but the Authorization header.
    assert page.js("localStorage.length + sessionStorage.length") == 0
    assert page.js("document.cookie") == ""
    assert page.js("indexedDB.databases().then(d => d.length)") == 0
    assert page.call("Network.getCookies").get("cookies") == []
    href = page.js("location.href")
    sent = page.seen("Network.requestWillBeSent")
    assert sent, "the browser reported no request"
    authorised = 0
    for event in sent:
        request = event["request"]
        for secret in (owner, rotated, minted):
            assert secret not in request["url"] and secret not in href
            assert secret not in request.get("postData", "")
            for name, value in request["headers"].items():
                if secret in value:
                    assert name.lower() == "authorization" and value == f"Bearer {secret}"
                    authorised += 1
    assert authorised > 10
    log = served.log_text()
    assert owner not in log and rotated not in log and minted not in log

    # A reload forgets the token.
    page.goto(served.url + "/console")
    assert page.js("document.getElementById('app').hidden")
    assert page.js("document.getElementById('token').value") == ""
    assert page.js("document.querySelectorAll('#grants tbody tr').length") == 0
    assert page.console.exceptions == []
    http.close()


def test_a_plain_http_address_that_is_not_loopback_gets_no_token_field(served: Server, tmp_path: Path) -> None:
    """Over plain http from a name that is not loopback, the page says why and offers nothing to type into.
    The name is mapped to 127.0.0.1 inside the browser, so nothing leaves this machine."""
    binary = chromium_path()
    assert binary
    port = served.url.rsplit(":", 1)[1]
    browser = Chromium(binary, tmp_path / "profile", flags=("--host-resolver-rules=MAP console.test 127.0.0.1",))
    try:
        browser.open_page()
        browser.goto(f"http://console.test:{port}/console")
        browser.wait_for("!document.getElementById('insecure').hidden")
        assert browser.js("document.getElementById('signin').hidden")
        assert "https" in browser.js("document.getElementById('insecure').textContent")
    finally:
        browser.close()


def test_a_server_that_serves_one_request_at_a_time_still_loads_the_console(chrome: Chromium, tmp_path: Path) -> None:
    """A page load asks for the memories, grants, audit, erasures and every
    memory's config. A server that takes one request of an identity at a
    time answers the rest `429 busy.user`; the console keeps few calls open
    and sends a 429 again after its Retry-After, so the page loads whole."""
    srv = start_server(tmp_path / "one-at-a-time", "--user-concurrency", "1")
    http = Http(srv.url)
    try:
        owner = http.init()["token"]
        names = ["alpha", "beta", "gamma"]
        for k, name in enumerate(names):
            http.ok("POST", "/memories", owner, json={"name": name})
            # A budget of its own and a few memories: the shape drawn shows whether its config was read.
            http.ok("POST", f"/m/{name}/config", owner, json={"WAKE_LINES": 8 + k})
            http.ok(
                "POST",
                f"/m/{name}/import",
                owner,
                json={"entries": [{"date": "2026-11-30", "text": f"{name} line {i}"} for i in range(40)]},
            )
        chrome.goto(srv.url + "/console")
        type_into(chrome, "#token", owner)
        chrome.enter()
        for k, name in enumerate(names):
            until(chrome, f"!!document.querySelector('svg[data-memory=\"{name}\"]')?.getAttribute('data-blocks')")
            drawn = int(chrome.js(f"document.querySelector('svg[data-memory=\"{name}\"]').getAttribute('data-blocks')"))
            assert drawn == len(blocks.cover(40, 8 + k)), name
        until(chrome, "document.querySelectorAll('#audit tbody tr').length >= 3")  # a create event per memory
        assert "busy.user" not in status(chrome)
        assert chrome.console.exceptions == []
    finally:
        http.close()
        srv.stop()


@pytest.mark.parametrize("edited", ["main", "bravo"])
def test_the_console_shows_a_trail_edited_by_hand(chrome: Chromium, tmp_path: Path, edited: str) -> None:
    """An audit event deleted from a memory's key ring with the server
    stopped: the page, which said the trail was whole, says it was edited
    and in which memory (GET /audit's `trail`), for main and another memory."""
    import sqlite3

    srv = start_server(tmp_path / "trail")
    http = Http(srv.url)
    try:
        owner = http.init()["token"]
        http.ok("POST", "/memories", owner, json={"name": "bravo"})
        for memory in ("main", "bravo"):
            for scope in ("read", "full", "append"):
                http.ok("POST", "/grants", owner, json={"scope": scope, "memory": memory})
        chrome.goto(srv.url + "/console")
        type_into(chrome, "#token", owner)
        chrome.enter()
        until(chrome, "document.getElementById('audit-chain').dataset.intact === 'true'")
        assert "whole" in chrome.js("document.getElementById('audit-chain').textContent")
        srv.stop()
        folder = srv.data / "users" / owner[7:23]
        ring = folder / "keyring.db" if edited == "main" else folder / "m" / "bravo" / "keyring.db"
        conn = sqlite3.connect(ring)
        try:
            ids = [r[0] for r in conn.execute("SELECT id FROM audit ORDER BY id")]
            assert len(ids) >= 3
            with conn:
                conn.execute("DELETE FROM audit WHERE id = ?", (ids[1],))
        finally:
            conn.close()
        srv.start(same_port=True)
        assert http.ok("GET", "/audit", owner)["trail"]["intact"] is False
        chrome.goto(srv.url + "/console")
        type_into(chrome, "#token", owner)
        chrome.enter()
        until(chrome, "document.getElementById('audit-chain').dataset.intact === 'false'")
        said = chrome.js("document.getElementById('audit-chain').textContent")
        assert "was edited" in said and f"memory {edited}" in said, said
    finally:
        http.close()
        srv.stop()


def test_a_memory_the_server_cannot_open_is_shown_damaged_and_the_rest_loads(chrome: Chromium, tmp_path: Path) -> None:
    """An old folder of a memory put back with the server stopped (issue 40,
    finding 10): the page loads whole, lists the other memories, and shows
    that one as damaged with its refusal and a way to delete it."""
    srv = start_server(tmp_path / "put-back")
    http = Http(srv.url)
    try:
        owner = http.init()["token"]
        for name in ("alpha", "bravo"):
            http.ok("POST", "/memories", owner, json={"name": name})
        folder = next((srv.data / "users").iterdir()) / "m" / "bravo"
        srv.stop()
        shutil.copytree(folder, tmp_path / "old-bravo")
        srv.start(same_port=True)
        http.ok("DELETE", "/memories/bravo", owner)
        http.ok("POST", "/memories", owner, json={"name": "bravo"})
        srv.stop()
        shutil.rmtree(folder)
        shutil.copytree(tmp_path / "old-bravo", folder)
        srv.start(same_port=True)
        (named,) = http.ok("GET", "/memories", owner)["unopened"]

        chrome.goto(srv.url + "/console")
        type_into(chrome, "#token", owner)
        chrome.enter()
        until(chrome, "!!document.querySelector('#memories tbody tr[data-memory=\"alpha\"]')")
        until(chrome, "!!document.querySelector('#memories tbody tr[data-memory=\"bravo\"]')")
        row = chrome.js("document.querySelector('#memories tbody tr[data-memory=\"bravo\"]').textContent")
        assert "damaged" in row and named["error"] in row
        assert (
            chrome.js("document.querySelector('#memories tr[data-memory=\"bravo\"]').dataset.damaged") == named["error"]
        )
        until(
            chrome,
            f"document.querySelectorAll('#audit tbody tr').length === {len(http.ok('GET', '/audit', owner)['events'])}",
        )
        assert "could not be reached" not in status(chrome) and named["error"] not in status(chrome)
        # Deleting it from the page is the way out.
        click(chrome, '#memories tr[data-memory="bravo"] button.danger')
        until(chrome, "document.getElementById('confirm').open")
        click(chrome, "#confirm-yes")
        until(chrome, "!document.querySelector('#memories tbody tr[data-memory=\"bravo\"]')")
        assert http.ok("GET", "/memories", owner)["unopened"] == []
        assert chrome.console.exceptions == []
    finally:
        http.close()
        srv.stop()
