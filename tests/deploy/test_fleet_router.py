"""The fleet's router, generated from a placement (stash/fleet/router.py,
`stash fleet router`): Caddy accepts what is generated, the example placement
generates, and a real Caddy given the configuration through its admin API
sends each token to its shard's `stash serve`, and sends it elsewhere once a
new configuration moves the shard."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stash.fleet import placement as pl
from stash.fleet import router
from tests.support import loopback
from tests.support.fleet import caddy_with_admin, placement_doc
from tests.support.installed import OUTSIDE
from tests.support.ops.deploy import DEPLOY, TOOL_TIMEOUT, tool
from tests.support.server import free_port, start_server

EXAMPLE = DEPLOY / "placement.example.json"


def validate(config: str, tmp: Path) -> subprocess.CompletedProcess:
    path = tmp / "Caddyfile"
    path.write_text(config, encoding="utf-8")
    return subprocess.run(
        [tool("caddy"), "validate", "--adapter", "caddyfile", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), "XDG_DATA_HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp)},
    )


def stash_fleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stash", "fleet", *args], capture_output=True, text=True, timeout=60, cwd=OUTSIDE
    )


@pytest.mark.parametrize("tls", router.TLS)
def test_caddy_accepts_the_router_of_the_example_placement(tmp_path: Path, tls: str) -> None:
    made = stash_fleet("router", "--placement", str(EXAMPLE), "--tls", tls)
    assert made.returncode == 0, made.stderr
    done = validate(made.stdout, tmp_path)
    assert done.returncode == 0 and "Valid configuration" in done.stdout + done.stderr, done.stdout + done.stderr
    p = pl.load(EXAMPLE)
    assert f"admin {p.router.admin}" in made.stdout
    # liveness only: readiness would take the whole fleet out of the router in one bucket outage
    assert "health_uri /health\n" in made.stdout and "ready" not in made.stdout.split("health_uri")[1].split("}")[0]


def test_each_shard_is_matched_by_its_digits_only() -> None:
    doc = placement_doc({"a": 1, "b": 2, "c": 3}, [("0-3", "a"), ("4-9", "b"), ("a", "c"), ("b-f", "a")])
    doc["shards"][3]["replica"] = doc["shards"][0]["replica"]
    config = router.caddyfile(pl.parse(doc), tls="off")
    matchers = dict(re.findall(r"@(shard_\w+) header_regexp Authorization (\S+)", config))
    routes = dict(re.findall(r"handle @(shard_\w+) \{\s+reverse_proxy (\S+)", config))
    for digit in pl.HEX:
        token = f"Bearer stash1_{digit}{'0' * 15}_x"
        hits = [m for m, rx in matchers.items() if re.match(rx.replace("(?i)", ""), token, re.I)]
        assert len(hits) == 1, (digit, hits)
        host = pl.parse(doc).shard_of(digit * 16).host
        assert routes[hits[0]] == doc["hosts"][host], digit
    # the catch-all sends to the hosts holding shards (c holds "a"), with a liveness check
    assert re.search(r"handle \{\s+reverse_proxy 127.0.0.1:1 127.0.0.1:2 127.0.0.1:3 \{", config), config


def test_a_standby_gets_no_traffic() -> None:
    config = router.caddyfile(pl.parse(placement_doc({"a": 8001, "b": 8002}, [("0-f", "a")])), tls="off")
    assert "# Standby (no shard, no traffic): b" in config
    assert "127.0.0.1:8002" not in config and "reverse_proxy 127.0.0.1:8001 {" in config


def test_check_says_who_holds_what_and_refuses_a_bad_file(tmp_path: Path) -> None:
    said = stash_fleet("check", "--placement", str(EXAMPLE))
    assert said.returncode == 0, said.stderr
    assert "a 10.0.0.11:8080: digits 0-7" in said.stdout and "c 10.0.0.13:8080: standby" in said.stdout
    bad = tmp_path / "bad.json"
    doc = json.loads(EXAMPLE.read_text())
    doc["shards"][1]["digits"] = "9-f"
    bad.write_text(json.dumps(doc))
    for verb in ("check", "router"):
        done = stash_fleet(verb, "--placement", str(bad))
        assert done.returncode == 2 and "digit 8 is in no shard" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_every_verb_names_its_arguments() -> None:
    for verb, args in {"check": ["--placement"], "router": ["--placement", "--listen", "--tls", "--load"]}.items():
        done = stash_fleet(verb, "--help")
        assert done.returncode == 0 and all(a in done.stdout for a in args), done.stdout


def users_on(srv) -> set[str]:
    return {p.name for p in (srv.data / "users").iterdir()}


@pytest.mark.slow
def test_a_loaded_router_sends_each_token_to_its_shard_and_follows_a_new_placement(tmp_path: Path) -> None:
    a = start_server(tmp_path / "a", *(f"--user-id-prefix={d}" for d in "01234567"))
    b = start_server(tmp_path / "b", *(f"--user-id-prefix={d}" for d in "89abcdef"))
    try:
        with caddy_with_admin(tmp_path) as admin:
            listen = f"http://127.0.0.1:{free_port()}"
            doc = placement_doc({"a": a.port, "b": b.port}, [("0-7", "a"), ("8-f", "b")], admin=admin)
            first = pl.parse(doc)
            router.load(router.caddyfile(first, listen, "off"), admin)
            servers = {"a": a, "b": b}
            # One identity minted on each host directly, so both shards are exercised whatever the balancer
            # does with those minted through the router.
            users = {n: loopback.post(srv.url + "/init", json={}, timeout=30).json() for n, srv in servers.items()}
            minted = [loopback.post(listen + "/init", json={}, timeout=30).json() for _ in range(6)]
            for user in [*users.values(), *minted]:
                auth = {"Authorization": f"bearer {user['token']}"}  # the scheme in any case
                assert (
                    loopback.post(listen + "/note", json={"text": "hello"}, headers=auth, timeout=30).status_code == 200
                )
            assert loopback.get(listen + "/metrics", timeout=30).status_code == 404
            ids = {u["user_id"] for u in [*users.values(), *minted]}
            assert users_on(a) == {i for i in ids if i[0] in "01234567"}
            assert users_on(b) == {i for i in ids if i[0] in "89abcdef"}
            # Each note landed on its own host: the other has no such user.
            for n, user in users.items():
                auth = {"Authorization": f"Bearer {user['token']}"}
                wake = loopback.get(servers[n].url + "/wake", headers=auth, timeout=30)
                assert wake.status_code == 200 and "hello" in wake.text, wake.text
            # Shard 0-7 goes to b: a's user is now sent to b, which does not know it.
            moved = first.with_shard_on("0-7", "b")
            router.load(router.caddyfile(moved, listen, "off"), admin)
            auth = {"Authorization": f"Bearer {users['a']['token']}"}
            assert loopback.get(listen + "/wake", headers=auth, timeout=30).status_code == 401
            assert loopback.get(a.url + "/wake", headers=auth, timeout=30).status_code == 200
            auth_b = {"Authorization": f"Bearer {users['b']['token']}"}
            assert loopback.get(listen + "/wake", headers=auth_b, timeout=30).status_code == 200
            with pytest.raises(router.RouterError, match="refused the configuration"):
                router.load("this is { not a caddyfile", admin)
            assert loopback.get(listen + "/wake", headers=auth_b, timeout=30).status_code == 200  # the old one kept
    finally:
        a.stop()
        b.stop()


def test_an_unreachable_admin_is_reported() -> None:
    with pytest.raises(router.RouterError, match=r"cannot reach Caddy's admin endpoint at 127\.0\.0\.1:"):
        router.load("{\n}\n", f"127.0.0.1:{free_port()}", timeout=5)
