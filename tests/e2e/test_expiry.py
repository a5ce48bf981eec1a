"""Expiry is revocation (issue 20 item 2): from the first key epoch after a
grant's expiry it receives no epoch key, whether or not it was presented
again. Attacked for real: the expired token with copies of the files, opened
offline with the project's own classes, and under a server started on those
files with its clock set back to before the expiry (Debian's ``faketime``)."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pytest

from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.files.epochs import epoch_keys_of, everything_readable, settle, snapshot, text_in
from tests.support.server import Http, Server, start_server, stop_group


@pytest.fixture
def server(tmp_path: Path):
    with start_server(tmp_path / "srv", *CHEAP_KDF_FLAGS) as srv:
        yield srv


def stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.slow
def test_an_expired_grant_receives_no_later_epoch_key_offline_or_under_a_clock_set_back(server: Server, tmp_path: Path):
    http = Http(server.url)
    owner = http.init()["token"]
    uid = owner[7:23]
    minted_at = dt.datetime.now(dt.UTC)
    expires = minted_at.replace(microsecond=0) + dt.timedelta(seconds=2)
    lapsed = http.ok("POST", "/grants", owner, json={"scope": "read", "expires": stamp(expires)})
    other = http.ok("POST", "/grants", owner, json={"scope": "full"})
    before = f"before-{os.urandom(6).hex()}"
    http.ok("POST", "/note", owner, json={"text": before})
    assert http.ok("GET", "/wake", lapsed["token"])  # live until its expiry
    while dt.datetime.now(dt.UTC) <= expires:
        time.sleep(0.2)
    assert_error(http.get("/wake", lapsed["token"]), 401, "auth.invalid")

    # Two new epochs (a revocation, an owner rotation); the expired token is
    # never presented again. Then a secret.
    http.ok("DELETE", f"/grants/{other['id']}", owner)
    owner = http.ok("POST", "/rotate", owner)["token"]
    after = f"after-{os.urandom(6).hex()}"
    for k in range(3):
        http.ok("POST", "/note", owner, json={"text": f"{after} {k}"})
    settle(http, owner, f"{after} summary")
    listed = {g["id"]: g for g in http.ok("GET", "/grants", owner)["grants"]}
    assert listed[lapsed["id"]]["expired"] and not listed[lapsed["id"]]["live"]
    copy = snapshot(server, uid, tmp_path / "copy")

    # Offline, the project's own classes on a copy: the expired grant opens no key.
    assert epoch_keys_of(copy / "keyring.db", lapsed["token"]) == []
    assert text_in(after, everything_readable(uid, [copy], epoch_keys_of(copy / "keyring.db", owner)))

    # A server on these files whose clock is set back to before the expiry.
    server.stop()
    earlier = minted_at - dt.timedelta(minutes=1)
    back = Server(
        data=server.data,
        log=server.log,
        extra=list(server.extra),
        prefix=["faketime", earlier.strftime("%Y-%m-%d %H:%M:%S")],
    ).start()
    try:
        got = Http(back.url)
        for resp in (
            got.get("/wake", lapsed["token"]),
            got.request("POST", "/recall", lapsed["token"], json={"q": after}),
        ):
            assert after not in resp.text
            assert_error(resp, 401, "auth.invalid")
        assert after in got.request("POST", "/recall", owner, json={"q": after}).text  # the harness can read it
    finally:
        stop_group(back)
        server.start(same_port=True)


def _head_only(url: str, token: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """POST ``path`` declaring a 10 MB body and sending none of it: the
    answer, which arrives only if the server refused before reading the body
    (otherwise the read below runs into its time bound and the test fails)."""
    import socket
    from urllib.parse import urlsplit

    host = urlsplit(url)
    with socket.create_connection((host.hostname, host.port), timeout=15) as conn:
        conn.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: {host.netloc}\r\nAuthorization: Bearer {token}\r\n"
                "Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{"
            ).encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            assert chunk, "the server closed without answering"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        want = int(headers.get("content-length", "0"))
        while len(body) < want:
            chunk = conn.recv(65536)
            assert chunk
            body += chunk
    return int(lines[0].split()[1]), headers, body


@pytest.mark.slow
def test_an_expired_token_is_refused_as_a_revoked_one_before_its_body(server: Server):
    """Every dead token gets one answer, before any byte of its body is read:
    an expired read, full or append capability, in main or bound to another
    memory, answers what a revoked one does (the tag index knows each
    capability's expiry, service/tag_index.py)."""
    http = Http(server.url)
    owner = http.init()["token"]
    http.ok("POST", "/memories", owner, json={"name": "bravo"})
    expires = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=2)
    lapsing = [
        http.ok("POST", "/grants", owner, json={"scope": scope, "memory": memory, "expires": stamp(expires)})
        for scope, memory in (("read", "main"), ("full", "bravo"), ("append", "main"), ("append", "bravo"))
    ]
    revoked = http.ok("POST", "/grants", owner, json={"scope": "full", "memory": "bravo"})
    http.ok("DELETE", f"/grants/{revoked['id']}", owner)
    for g in lapsing:
        assert http.post("/note", g["token"], json={"text": "still live"}).status_code in (200, 403)
    while dt.datetime.now(dt.UTC) <= expires:
        time.sleep(0.2)
    status, headers, body = _head_only(server.url, revoked["token"], "/note")
    assert status == 401 and headers.get("connection") == "close"
    for g in lapsing:
        got = _head_only(server.url, g["token"], "/note")
        assert (got[0], got[1].get("connection"), got[2]) == (status, "close", body), g["scope"]
