"""Every curl example of API-REFERENCE.md runs as printed against a real
``stash serve``, and every route of the server has one.

The convention (stated in API-REFERENCE.md, section Routes): an example is a
fenced ```sh block that contains ``curl``. Each block runs with bash, ``-e``
and ``pipefail``, in a fresh folder, with ``STASH_URL`` and ``STASH_TOKEN``
set, on a fresh memory in the state the reference describes — so order does
not matter and DELETE /store ends only its own memory."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stash.web.routes import ROUTES
from tests.support.docs.commands import curl_calls, route_of
from tests.support.server import REPO, Http

pytestmark = pytest.mark.slow

REFERENCE = REPO / "API-REFERENCE.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
RUN_TIMEOUT = 60


def examples() -> list[str]:
    return [b for b in BLOCK.findall(REFERENCE.read_text(encoding="utf-8")) if "curl" in b]


def test_curl_calls_reads_method_and_path() -> None:
    """The parser the coverage test relies on must tell routes apart."""
    assert curl_calls('curl -fsS -H "A: b" "$STASH_URL/wake?part=1"') == [("GET", "/wake")]
    assert curl_calls("curl -fsS -X POST \"$STASH_URL/wake\" -d '{}'") == [("POST", "/wake")]
    assert curl_calls('curl -fsS "$STASH_URL/note" -d \'{"text": "x"}\'') == [("POST", "/note")]
    assert curl_calls('curl -fsS -X DELETE "$STASH_URL/grants/2"') == [("DELETE", "/grants/2")]
    assert curl_calls('curl -fsS -o stash "$STASH_URL/client" && chmod +x stash') == [("GET", "/client")]
    assert route_of("DELETE", "/grants/2") == ("DELETE", "/grants/{grant_id}")
    assert route_of("GET", "/grants/2") is None and route_of("GET", "/") == ("GET", "/")


def test_every_route_has_a_curl_example() -> None:
    covered = {route_of(m, p) for block in examples() for m, p in curl_calls(block)}
    assert None not in covered, "an example calls a route the server does not have"
    # A route served again under /m/{name} is its root route's example, at another address.
    missing = [f"{r.method} {r.path}" for r in ROUTES if (r.method, r.path) not in covered and not r.under]
    assert missing == [], f"routes without a curl example in API-REFERENCE.md: {missing}"


def prepare(http: Http, block: str = "") -> str:
    """The memory the reference's examples assume: four memories dated 2024,
    0-1 summarised, 2-3 due, and a second capability #2."""
    token = http.init()["token"]
    entries = [{"date": f"2024-01-0{k + 1}", "text": f"example memory {k} about sqlite"} for k in range(4)]
    http.ok("POST", "/import", token, json={"entries": entries})
    nap = http.ok("POST", "/nap", token, json={"block": "0-1", "text": "the first two, summarised"})["nap"]
    assert nap["block"] == "2-3"
    assert http.ok("POST", "/grants", token, json={"scope": "read"})["id"] == 2
    if "/memories/project-x" in block:  # the memory the memories' examples fork and delete
        http.ok("POST", "/memories", token, json={"name": "project-x"})
        more = [{"date": "2024-02-01", "text": f"project memory {k}"} for k in range(128)]
        http.ok("POST", "/m/project-x/import", token, json={"entries": more})
    return token


@pytest.mark.parametrize("block", examples(), ids=lambda b: " ".join(f"{m} {p}" for m, p in curl_calls(b)))
def test_example_runs_as_printed(block: str, http: Http, base_url: str, tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("bash") is None:
        pytest.fail("curl and bash are needed to run the reference's examples")
    token = prepare(http, block)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "STASH_URL": base_url,
        "STASH_TOKEN": token,
    }
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert done.returncode == 0, (block, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert token not in done.stdout + done.stderr
