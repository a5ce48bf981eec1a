"""A tool call over ``POST /mcp`` against the same call over plain HTTP, on
one real ``stash serve`` (default options, one worker, the per-address
limits lifted as for every bench server).

    python bench/mcp_call.py --rounds 5 --calls 200

One identity with 40 memories, every due summary written, so a wake is 40
lines and no nap; a second one takes the notes. Then, round by round, the two ways take turns, each
``--calls`` requests one at a time on one keep-alive connection:

* ``http``: ``POST /wake {}`` and ``POST /note`` (the route itself);
* ``mcp``: ``tools/call`` of ``wake`` and of ``note`` as a JSON-RPC message to
  ``POST /mcp`` (protocol 2025-06-18, stateless, as a host sends it after its
  handshake), answered by the same route in process.

It reports, per kind and way, the median over rounds of each round's median
wall time seen by the client, and the server's CPU per call (its process's
user + system time over the batch, divided by the calls). The first MCP
requests (the SDK's import) are sent before any batch is timed. Nothing
passes or fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)

from tests.support.server import Server

MEMORIES = 40
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}


def _post(conn: http.client.HTTPConnection, path: str, token: str, body: dict, extra: dict | None = None) -> dict:
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "Content-Type": "application/json",
        **(extra or {}),
    }
    conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"POST {path}: {resp.status} {data[:300]!r}")
    return json.loads(data)


def _tool(conn: http.client.HTTPConnection, token: str, name: str, arguments: dict) -> dict:
    answer = _post(
        conn,
        "/mcp",
        token,
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
        MCP_HEADERS,
    )
    if answer["result"].get("isError"):
        raise RuntimeError(f"{name}: {answer['result']['content'][0]['text']}")
    return answer


def _batch(server: Server, calls: int, send) -> tuple[float, float]:
    walls = []
    cpu0 = server.cpu_seconds()
    for i in range(calls):
        t0 = time.perf_counter()
        send(i)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), (server.cpu_seconds() - cpu0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stash-bench-mcp-"))
    server = Server(root / "data", root / "server.log", inherit_stash_env=False)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        tokens = []
        for _ in range(2):  # one to wake, one to note (its notes never make the first's wake wait for a nap)
            conn.request("POST", "/init", body=b"{}", headers={"Content-Type": "application/json"})
            tokens.append(json.loads(conn.getresponse().read())["token"])
        token, noter = tokens
        for i in range(MEMORIES):
            _post(conn, "/note", token, {"text": f"memory {i} of the bench"})
        nap = _post(conn, "/nap", token, {})["nap"]
        while nap is not None:
            nap = _post(conn, "/nap", token, {"block": nap["block"], "text": f"summary of {nap['block']}"})["nap"]
        for _ in range(5):  # the SDK's import and first requests, untimed
            _tool(conn, token, "wake", {})
        ways = {
            ("wake", "http"): lambda i: _post(conn, "/wake", token, {}),
            ("wake", "mcp"): lambda i: _tool(conn, token, "wake", {}),
            # Its own identity, whose naps are never answered: each note carries the due one, both ways alike.
            ("note", "http"): lambda i: _post(conn, "/note", noter, {"text": f"http note {i}"}),
            ("note", "mcp"): lambda i: _tool(conn, noter, "note", {"text": f"mcp note {i}"}),
        }
        results: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in ways}
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for key in order:
                results[key].append(_batch(server, args.calls, ways[key]))
        print(f"{args.rounds} rounds of {args.calls} calls; a wake of {MEMORIES} lines")
        print("| call | way | wall p50 (ms) | server CPU per call (ms) |")
        print("|---|---|---|---|")
        for (kind, way), runs in results.items():
            wall = statistics.median(w for w, _ in runs) * 1000
            cpu = statistics.median(c for _, c in runs) * 1000
            print(f"| {kind} | {way} | {wall:.2f} | {cpu:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
