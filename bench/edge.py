"""The cost of the HTTP edge, one tree against another: a wake, a note and a
refusal, each timed on a real ``stash serve`` of each checkout, the trees
taking turns round by round so that load on the machine falls on both alike.

    git worktree add /tmp/before <rev>
    python bench/edge.py --tree before=/tmp/before --tree after=. --rounds 4

Each round starts a fresh server of one tree (default options, the
per-address limits lifted as for every bench server), makes two identities,
writes 40 memories into the first, and then sends, one at a time on one
keep-alive connection:

* ``--calls`` wakes of the first identity (``GET /wake``, 40 lines, no nap due);
* ``--calls`` notes to the second (``POST /note``);
* ``--calls`` refusals: ``GET /wake`` with a well-formed token of a user that
  does not exist (401, refused by the lookup-tag index before any key work).

For each it reports the median and 95th-percentile wall time seen by the
client and the server's CPU time per request (its process's user + system
time over the batch, divided by the calls). Nothing passes or fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)

from stash.crypto import tokens
from tests.support.server import Server

WAKE_MEMORIES = 40


def _request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    token: str,
    body: dict | None = None,
) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def _batch(server: Server, conn: http.client.HTTPConnection, calls: int, send) -> tuple[list[float], float]:
    walls = []
    cpu0 = server.cpu_seconds()
    for i in range(calls):
        t0 = time.perf_counter()
        send(i)
        walls.append(time.perf_counter() - t0)
    return walls, (server.cpu_seconds() - cpu0) / calls


def one_round(tree: Path, calls: int, root: Path) -> dict[str, tuple[list[float], float]]:
    server = Server(
        root / "data", root / "server.log", inherit_stash_env=False, cwd=tree, env={"PYTHONPATH": str(tree)}
    )
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        owners = []
        for _ in range(2):
            conn.request("POST", "/init", body=b"{}", headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            owners.append(json.loads(resp.read())["token"])
        for i in range(WAKE_MEMORIES):
            assert _request(conn, "POST", "/note", owners[0], {"text": f"memory {i}"})[0] == 200
        stranger, _ = tokens.mint(secrets.token_hex(8))

        def wake(_: int) -> None:
            status, body = _request(conn, "GET", "/wake", owners[0])
            assert status == 200 and len(json.loads(body)["lines"]) == WAKE_MEMORIES, (status, body[:200])

        def note(i: int) -> None:
            status, body = _request(conn, "POST", "/note", owners[1], {"text": f"a note {i}"})
            assert status == 200, (status, body[:200])

        def refusal(_: int) -> None:
            status, body = _request(conn, "GET", "/wake", stranger)
            assert status == 401, (status, body[:200])

        for send in (wake, note, refusal):  # warm each path once
            send(0)
        return {
            "wake": _batch(server, conn, calls, wake),
            "note": _batch(server, conn, calls, note),
            "refusal": _batch(server, conn, calls, refusal),
        }
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a checkout to measure, named (give two or more; they take turns)",
    )
    p.add_argument("--rounds", type=int, default=4, help="rounds per tree (default 4)")
    p.add_argument("--calls", type=int, default=500, help="requests per kind per round (default 500)")
    args = p.parse_args()
    trees = [(name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.tree)]
    seen: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="stash-edge-"))
    try:
        for r in range(args.rounds):
            for name, tree in trees:
                root = scratch / f"{name}-{r}"
                root.mkdir()
                for kind, (walls, cpu) in one_round(tree, args.calls, root).items():
                    all_walls, cpus = seen.setdefault((name, kind), ([], []))
                    all_walls.extend(walls)
                    cpus.append(cpu)
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"{args.rounds} rounds x {args.calls} calls per kind, trees taking turns; load average "
        f"{os.getloadavg()[0]:.2f} at the end\n"
    )
    print("| call | tree | wall p50 | wall p95 | server CPU per request |")
    print("|---|---|---|---|---|")
    for kind in ("wake", "note", "refusal"):
        for name, _ in trees:
            walls, cpus = seen[(name, kind)]
            walls.sort()
            p95 = walls[int(0.95 * (len(walls) - 1))]
            print(
                f"| {kind} | {name} | {statistics.median(walls) * 1000:.2f} ms | {p95 * 1000:.2f} ms | "
                f"{statistics.median(cpus) * 1000:.2f} ms |"
            )


if __name__ == "__main__":
    main()
