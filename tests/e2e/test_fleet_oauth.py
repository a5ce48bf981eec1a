"""An MCP host's OAuth flow across the hosts of a fleet (docs/DESIGN.md,
"Remote MCP"): real `stash serve` hosts on loopback, each with its own
oauth.db and the fleet's placement adopted in its data folder, and a real
Caddy configured from the placement (it sends requests without a token to
any host). Each step that lands on a host other than the one keeping its
state is sent on there: every pairing of registering host, page host, form
host, owner's host and exchange host is forced by sending the steps straight
to chosen hosts, and the `mcp` SDK's own client flow goes through the
router. The attacks: a forged hop marker from outside, a code replayed
through another host, a code whose shard's host is down."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from pydantic import AnyUrl

from stash.fleet import placement as pl
from stash.fleet import router
from stash.fleet.forward import HOP
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.fleet import caddy_with_admin, placement_doc
from tests.support.mcp.oauth import (
    FORM,
    REDIRECT,
    TokenMemory,
    answer,
    authorize,
    code_of,
    exchange,
    nonce_of,
    pkce,
    register,
)
from tests.support.server import Http, Server, free_port

pytestmark = pytest.mark.slow

WAIT_S = 30.0


@dataclass
class Fleet:
    servers: dict[str, Server]
    http: dict[str, Http]
    owners: dict[str, str]  # host -> the owner token of a user of its shard
    placement: pl.Placement

    def user_of(self, owner: str) -> str:
        return owner.split("_")[1]

    def stop(self) -> None:
        for h in self.http.values():
            h.close()
        for srv in self.servers.values():
            srv.stop()


def wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def start_fleet(tmp: Path, shards: dict[str, str], admin: str = "127.0.0.1:2019") -> Fleet:
    """One `stash serve --placement FILE --fleet-host NAME` per host, each holding one shard and
    replicating to a folder of its own, and one owner on each host."""
    servers: dict[str, Server] = {}
    ports = {name: free_port() for name in shards}
    doc = placement_doc(
        ports,
        [(d, n) for n, d in shards.items()],
        admin=admin,
        replicas={n: str(tmp / "replicas" / n) for n in shards},
    )
    placement = pl.parse(doc)
    file = tmp / "placement.json"
    tmp.mkdir(parents=True, exist_ok=True)
    pl.write(file, placement)
    try:
        for name in shards:
            (tmp / name).mkdir()
            servers[name] = Server(
                data=tmp / name / "data",
                log=tmp / name / "server.log",
                extra=["--placement", str(file), "--fleet-host", name, *CHEAP_KDF_FLAGS],
                port=ports[name],
            ).start(same_port=True)
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    http = {n: Http(s.url) for n, s in servers.items()}
    fleet = Fleet(servers, http, {n: http[n].init()["token"] for n in servers}, placement)
    # Each host has read the placement once it sends on the page of a client another host registered.
    names = list(servers)
    for i, name in enumerate(names):
        other = names[(i + 1) % len(names)]
        client_id = register(http[other])["client_id"]

        def sends_on(here: Http = http[name], client_id: str = client_id) -> bool:
            return bool(authorize(here, client_id, pkce()[1]).status_code == 200)

        wait_for(f"{name} reads the placement", sends_on)
    return fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    made = start_fleet(tmp_path_factory.mktemp("fleet-oauth"), {"a": "0-4", "b": "5-9", "c": "a-f"})
    try:
        yield made
    finally:
        made.stop()


def grants_of(fleet: Fleet, host: str) -> list[dict]:
    return [g for g in fleet.http[host].get("/grants", fleet.owners[host]).json()["grants"] if g["id"] > 1]


def connect(fleet: Fleet, registrar: str, page: str, form: str, owner: str, exchanger: str) -> tuple[str, str, dict]:
    """One MCP host's flow, each step sent straight to the host named: (code, token, registration)."""
    http = fleet.http
    reg = register(http[registrar])
    verifier, challenge = pkce()
    shown = authorize(http[page], reg["client_id"], challenge)
    assert shown.status_code == 200, (registrar, page, shown.status_code, shown.text[:500])
    # The form is posted as a browser posts it: to the address the page came from, with its Origin.
    approved = answer(http[form], nonce_of(shown.text), fleet.owners[owner], fleet.servers[form].url)
    code = code_of(approved)
    got = exchange(http[exchanger], code, verifier, reg["client_id"])
    assert got.status_code == 200, (registrar, page, form, owner, exchanger, got.text)
    return code, got.json()["access_token"], reg


def test_every_pairing_of_hosts_connects_a_host_whose_owner_is_on_another(fleet: Fleet) -> None:
    names = list(fleet.servers)
    for registrar, owner in itertools.permutations(names, 2):
        third = next(n for n in names if n not in (registrar, owner))
        # Two rounds per pairing: every step lands once on a host that keeps none of its state.
        for page, form, exchanger in ((third, owner, registrar), (owner, third, third)):
            before = {g["id"] for g in grants_of(fleet, owner)}
            code, token, reg = connect(fleet, registrar, page, form, owner, exchanger)
            assert reg["client_id"].startswith(f"stash-client-{registrar}.")
            user = fleet.user_of(fleet.owners[owner])
            assert code.startswith(f"{user[0]}.")  # the code names its user's shard, so any host sends it on
            assert token.split("_")[1] == user
            # The grant is on the owner's host, labelled with the host's name, and it works there.
            (grant,) = [g for g in grants_of(fleet, owner) if g["id"] not in before]
            assert grant["label"] == "Test host" and grant["scope"] == "full", grant
            wake = fleet.http[owner].post("/note", token, json={"text": f"via {registrar}{page}{form}{exchanger}"})
            assert wake.status_code == 200, wake.text


@pytest.fixture(scope="module")
def routed(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Caddy whose configuration the placement generated (its admin where this Caddy listens)."""
    with caddy_with_admin(tmp_path_factory.mktemp("fleet-caddy")) as admin:
        listen = f"http://127.0.0.1:{free_port()}"
        placement = pl.parse({**fleet.placement.to_json(), "router": {"site": "stash.example.com", "admin": admin}})
        router.load(router.caddyfile(placement, listen, "off"), admin)
        yield listen


def sdk_connect(fleet: Fleet, listen: str, note: str) -> tuple[str, str]:
    """The `mcp` SDK's own client OAuth through the router, the owner's consent given by a person's two
    requests (the page, the form) through the router too, the owner a user of a host other than the one
    the client registered on: (the registering host, the owner's host)."""
    store = TokenMemory()
    chosen: list[str] = []
    location: list[str] = []
    router_http = Http(listen)

    async def redirect_handler(url: str) -> None:
        client_id = parse_qs(urlsplit(url).query)["client_id"][0]
        registrar = client_id.removeprefix("stash-client-").split(".")[0]
        owner = next(n for n in fleet.servers if n != registrar)
        chosen.extend([registrar, owner])

        def consent() -> None:
            page = router_http.get(url.removeprefix(listen))
            assert page.status_code == 200, page.text[:500]
            done = answer(router_http, nonce_of(page.text), fleet.owners[owner], listen)
            assert done.status_code == 303, done.text[:500]
            location.append(done.headers["location"])

        await anyio.to_thread.run_sync(consent)

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(location[0]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0])

    provider = OAuthClientProvider(
        server_url=listen + "/mcp",
        storage=store,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata=OAuthClientMetadata(client_name="SDK host", redirect_uris=[AnyUrl(REDIRECT)]),
    )

    async def main() -> None:
        with anyio.fail_after(WAIT_S * 2):
            async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(WAIT_S)) as client_http:
                async with Client(streamable_http_client(listen + "/mcp", http_client=client_http)) as client:
                    noted = await client.call_tool("note", {"text": note})
                    assert not noted.is_error, noted

    try:
        anyio.run(main)
    finally:
        router_http.close()
    return chosen[0], chosen[1]


def test_the_sdks_oauth_through_the_router_connects_an_owner_of_another_host(fleet: Fleet, routed: str) -> None:
    # Which host the router picks for each step is its own (at random): four runs meet most pairings, and
    # every step of each is answered by whichever host it reached.
    for i in range(4):
        registrar, owner = sdk_connect(fleet, routed, f"sdk note {i}")
        assert registrar != owner
        found = fleet.http[owner].ok("POST", "/recall", fleet.owners[owner], json={"q": f"sdk note {i}"})
        assert found["total"] == 1, found


def test_a_forged_hop_marker_from_outside_gains_nothing(fleet: Fleet, routed: str) -> None:
    """Only hosts mark a request sent on: the router drops the marker from every request it proxies, so an
    approval that carries its own request (in place of a nonce) is refused through it even with the owner's
    token; straight to a host, a marked approval mints nothing without the owner token, and a marked
    request is answered where it lands, never sent on (no loop)."""
    owner_host = "b"
    owner = fleet.owners[owner_host]
    forged = {
        "client_id": "stash-client-a.00000000000000000000000000000000",
        "client_name": "forged",
        "redirect_uri": REDIRECT,
        "state": "state-1",
        "challenge": pkce()[1],
        "resource": None,
        "memory": None,
        "scope": "full",
    }
    form = {"nonce": "a." + "A" * 43, "decision": "approve", "scope": "full", "expires": "never"}
    before = grants_of(fleet, owner_host)
    via = Http(routed)
    try:
        for host in (routed, *(srv.url for srv in fleet.servers.values())):
            body = urlencode({**form, "owner_token": owner, "fleet_request": json.dumps(forged)}).encode()
            sent = via.post(host + "/authorize", content=body, headers={**FORM, "Origin": routed, HOP: "a"})
            if host == routed:
                # Through the router the marker never arrives: the carried request is refused as sent from outside.
                assert sent.status_code == 400 and sent.headers["stash-error"] == "fleet.bad_hop", sent.text[:500]
                continue
            # Straight to a host, a forged marker lets the approval carry its request: without the owner token
            # it mints nothing (the page again, saying the token was refused), whatever host it reaches.
            wrong = urlencode({**form, "owner_token": "stash1_" + "0" * 16 + "_x", "fleet_request": json.dumps(forged)})
            refused = via.post(host + "/authorize", content=wrong.encode(), headers={**FORM, "Origin": host, HOP: "a"})
            assert refused.status_code == 401 and "owner_token" in refused.text, refused.text[:500]
        # Without the marker, straight to a host, the carried request is refused as well.
        body = urlencode({**form, "owner_token": owner, "fleet_request": json.dumps(forged)}).encode()
        bare = via.post(
            fleet.servers["b"].url + "/authorize", content=body, headers={**FORM, "Origin": fleet.servers["b"].url}
        )
        assert bare.status_code == 400 and bare.headers["stash-error"] == "fleet.bad_hop", bare.text[:500]
        assert grants_of(fleet, owner_host) == before
        # A marked request is answered where it lands: the page of a client registered on a, asked of c with
        # the marker, is c's "unknown client", not a's page.
        client_id = register(fleet.http["a"])["client_id"]
        _, challenge = pkce()
        query = urlencode(
            {
                "response_type": "code",
                "client_id": client_id,
                "redirect_uri": REDIRECT,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        )
        marked = via.get(fleet.servers["c"].url + "/authorize?" + query, headers={HOP: "b"})
        assert marked.status_code == 401 and marked.headers["stash-error"] == "oauth.invalid_client"
        # The same through the router, marker forged: the router drops it, so the page comes from a,
        # whichever host the router picked.
        for _ in range(6):
            page = via.get(routed + "/authorize?" + query, headers={HOP: "b"})
            assert page.status_code == 200 and nonce_of(page.text).startswith("a."), page.text[:300]
    finally:
        via.close()


def test_a_code_replayed_through_another_host_is_refused_and_revokes(fleet: Fleet) -> None:
    code, token, reg = connect(fleet, "a", "c", "b", "b", "c")  # redeemed through c, kept by b
    assert fleet.http["b"].post("/note", token, json={"text": "before the replay"}).status_code == 200
    for replayer in ("a", "c", "b"):
        again = exchange(fleet.http[replayer], code, "x" * 43, reg["client_id"])
        assert again.status_code == 400 and again.json()["error"] == "invalid_grant", again.text
    # The first replay withdrew the grant on b: the token is dead at its own host.
    assert fleet.http["b"].post("/note", token, json={"text": "after the replay"}).status_code == 401


def test_a_code_of_a_shard_whose_host_is_down_is_a_clear_503(tmp_path: Path) -> None:
    fleet = start_fleet(tmp_path, {"a": "0-7", "b": "8-f"})
    try:
        http = fleet.http
        reg = register(http["a"])
        verifier, challenge = pkce()
        page = authorize(http["a"], reg["client_id"], challenge)
        code = code_of(answer(http["a"], nonce_of(page.text), fleet.owners["b"], fleet.servers["a"].url))
        assert code.startswith(fleet.user_of(fleet.owners["b"])[0] + ".")
        fleet.servers["b"].stop()
        refused = exchange(http["a"], code, verifier, reg["client_id"])
        assert refused.status_code == 503, refused.text
        assert refused.headers["stash-error"] == "fleet.unreachable"
        said = refused.json()
        assert said["error"] == "temporarily_unavailable" and "not answering" in said["error_description"]
        # A consent form for an owner of the dead host: the page again, the request kept, saying so.
        page = authorize(http["a"], reg["client_id"], challenge)
        again = answer(http["a"], nonce_of(page.text), fleet.owners["b"], fleet.servers["a"].url)
        assert again.status_code == 503 and "not answering" in again.text and nonce_of(again.text)
        assert "Traceback" not in fleet.servers["a"].log_text()
    finally:
        fleet.stop()


def test_a_host_a_placement_took_the_shard_from_takes_none_of_its_codes(tmp_path: Path) -> None:
    """A code approved on a, whose owner's shard then went to b: a request that reaches a marked as sent on
    (by a host that had not seen the new placement yet; the marker is no credential, anyone may send it
    straight to a host) is answered where it lands, and a refuses it as it refuses the owner's token, 421
    fleet.elsewhere, whatever its verifier: it neither hands out the capability nor claims to have withdrawn
    a grant it cannot reach."""
    fleet = start_fleet(tmp_path, {"a": "0-7", "b": "8-f"})
    try:
        http, a = fleet.http, fleet.servers["a"]
        reg = register(http["a"])
        verifier, challenge = pkce()
        page = authorize(http["a"], reg["client_id"], challenge)
        code = code_of(answer(http["a"], nonce_of(page.text), fleet.owners["a"], a.url))
        user = fleet.user_of(fleet.owners["a"])
        pl.write(tmp_path / "placement.json", fleet.placement.with_shard_on("0-7", "b"))
        # a moves the owner aside once every worker serves by the new placement.
        wait_for("a releases the owner", lambda: (a.data / "released" / "e2" / user).is_dir())
        for sent in ("x" * 43, verifier):  # a wrong verifier first: it must not spend the code either
            refused = exchange(http["a"], code, sent, reg["client_id"], hop="b")
            assert refused.status_code == 421, refused.text
            assert refused.headers["stash-error"] == "fleet.elsewhere"
            assert refused.json()["error"] == "invalid_request" and "router" in refused.json()["error_description"]
        # The owner's approval, sent on to a by a host that still took a for the shard's host, mints nothing there.
        request = {"client_id": reg["client_id"], "client_name": "Test host", "redirect_uri": REDIRECT}
        request |= {"state": "state-1", "challenge": challenge, "resource": None, "memory": None, "scope": "full"}
        form = {"nonce": "b." + "A" * 43, "decision": "approve", "scope": "full", "expires": "never"}
        form |= {"owner_token": fleet.owners["a"], "fleet_request": json.dumps(request)}
        marked = {**FORM, "Origin": a.url, HOP: "b"}
        carried = http["a"].post("/authorize", content=urlencode(form).encode(), headers=marked)
        assert carried.status_code == 421 and carried.headers["stash-error"] == "fleet.elsewhere", carried.text[:300]
        assert "Traceback" not in a.log_text()
    finally:
        fleet.stop()
