"""The Python library (``from stash import Stash``) against a real ``stash serve``: every method, with
its typed answer checked against the API's own state, and every kind of refusal raised as its class with
the server's code, status and message."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stash
from stash import (
    Conflict,
    Forbidden,
    Grant,
    NapNeeded,
    ServerError,
    Stash,
    StashError,
    Unauthorized,
    Unreachable,
    error_class,
)
from stash.client import remember_pin
from stash.web.codes import CODES
from tests.support import loopback
from tests.support.server import Http, Server, free_port, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("library-server"))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def owner(served: Server) -> str:
    http = Http(served.url)
    try:
        return http.init()["token"]
    finally:
        http.close()


@pytest.fixture(autouse=True)
def own_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test pins into its own file, never the user's."""
    monkeypatch.setenv("STASH_PINS", str(tmp_path / "pins.json"))


def test_an_agents_session_wake_note_nap(served: Server, owner: str) -> None:
    mem = Stash(served.url, owner)
    assert mem.wake().lines == [] and mem.wake().T == 0
    first = mem.note("chose jade over chrome")
    assert first.id == 0 and first.nap is None
    second = mem.note("it's the one we'll keep")
    assert second.id == 1 and second.nap is not None and second.nap.block == "0-1"
    assert second.nap.source == [line for line in Http(served.url).ok("POST", "/wake", owner, json={})["lines"]]
    assert mem.due() == second.nap
    saved = mem.nap("0-1", "jade chosen and kept")
    assert saved.saved == "0-1" and saved.nap is None
    again = mem.nap("0-1", "jade chosen and kept")  # already settled: nothing written
    assert again.saved is None
    for k in range(2, 8):
        mem.note(f"memory {k}")
    with pytest.raises(Conflict) as wrong:
        mem.nap("4-5", "not the due block")
    assert wrong.value.status == 409 and wrong.value.code and wrong.value.message
    batch = mem.naps(8)  # blocks of at most 16 are written from the log, so all six are ready at once
    assert [n.block for n in batch] == ["2-3", "4-5", "6-7", "0-3", "4-7", "0-7"]
    done = mem.settle({n.block: f"sum {n.block}" for n in batch})
    assert done.nap is None and mem.due() is None
    wake = mem.wake()
    assert wake.T == 8 and len(wake.lines) == 8 and wake.lines[0].startswith("#0 ")

    found = mem.recall("JADE")
    assert found.total == 1 and found.matches[0].startswith("#0 ") and found.more is None
    assert mem.zoom("0-1").lines == Http(served.url).ok("POST", "/zoom", owner, json={"block": "0-1"})["lines"]
    forgot = mem.forget("4-7")
    assert forgot.dropped[0] == "4-7" and forgot.nap is not None
    with pytest.raises(ValueError):
        mem.recall()


def test_an_owners_calls(served: Server, owner: str, tmp_path: Path) -> None:
    mem = Stash(served.url, owner)
    imported = mem.import_([("2026-01-02", "old plan"), ("2026-01-03", "older decision kept")])
    assert (imported.first, imported.last, imported.pending) == (0, 1, 1)
    minted = mem.mint("read", label="reader bot")
    assert minted.token.startswith("stash1_") and minted.scope == "read" and "STASH_TOKEN" in minted.prompt
    listed = {g.id: g for g in mem.grants()}
    assert isinstance(listed[minted.id], Grant) and listed[minted.id].label == "reader bot"
    assert listed[minted.id].live and not listed[minted.id].revoked
    reader = Stash(served.url, minted.token)
    assert reader.recall("plan").total == 1
    with pytest.raises(Forbidden) as low:
        reader.note("a reader cannot write")
    assert low.value.status == 403
    revoked = mem.revoke(minted.id)
    assert revoked.id == minted.id and not revoked.already
    with pytest.raises(Unauthorized) as gone:
        reader.recall("plan")
    assert gone.value.status == 401 and gone.value.code.startswith("auth.")
    receipt = mem.erase([0])
    assert receipt.ids == [0] and receipt.erased == [0]
    assert [r.receipt for r in mem.erasures()] == [receipt.receipt]
    archive = mem.export(tmp_path / "memory.tar.gz")
    with tarfile.open(archive) as tar:
        assert "memory/LOG.txt" in tar.getnames()
    names = [m.name for m in mem.memories()]
    assert names[0] == "main"
    rotated = mem.rotate()
    assert rotated.token != owner
    assert mem.grants()  # the object moved to the new token
    with pytest.raises(Unauthorized):
        Stash(served.url, owner).grants()


def _owner_of(url: str, invite: str | None = None) -> Stash:
    mem = Stash(url, None)
    mem.init(invite=invite)
    return mem


def _provoke(cases: dict[str, Callable[[], object]]) -> None:
    """Each case raises the class :func:`error_class` names for its code, with the code and status the server
    declares for it (stash/web/codes.py)."""
    for code, call in cases.items():
        try:
            call()
        except StashError as refused:
            error = refused
        else:
            pytest.fail(f"{code}: not refused")
        assert (error.code, error.status) == (code, CODES[code].status), (code, error.code, error.message)
        assert type(error) is error_class(code, error.status), code
        assert error.message and error.body["error"] == code


def default_cases(url: str) -> dict[str, Callable[[], object]]:
    """Refusals a server with the default options answers, each raised through the library."""
    mem = _owner_of(url)
    for k in range(4):
        mem.note(f"memory {k}")  # T=4: 0-1 due, 2-3 not yet
    reader = Stash(url, mem.mint("read").token)
    owner_id = next(g.id for g in mem.grants() if g.you)
    empty = Stash(f"{mem.url}/m/{mem.create('empty').name}", mem._token)
    needy = Stash(f"{mem.url}/m/{mem.create('needy').name}", mem._token)
    needy.import_([("2026-01-02", f"old {k}") for k in range(40)])
    needy.config({"WAKE_LINES": 4, "PART_CHARS": 60})
    forged = Stash(url, "stash1_" + "0" * 16 + "_" + "A" * 49)

    def pin_mismatch() -> object:
        remember_pin(mem.url, mem._token, "999:" + "0" * 64)
        return mem.wake()

    return {
        "request.bad_json": lambda: mem._call("POST", "/note", [1]),
        "request.empty_body": lambda: mem._call("POST", "/note"),
        "request.unknown_field": lambda: mem._call("POST", "/note", {"text": "a", "nonsense": 1}),
        "request.missing_field": lambda: mem._call("POST", "/note", {}),
        "request.duplicate_field": lambda: mem._call("GET", "/recall?q=a&q=b"),
        "request.bad_value": lambda: mem._call("POST", "/wake", {"part": "x"}),
        "request.too_large": lambda: mem.note("x" * 70_000),
        "auth.token_in_query": lambda: mem._call("GET", "/wake?token=abc"),
        "auth.invalid": forged.wake,
        "auth.scope": lambda: reader.note("a reader cannot write"),
        "text.type": lambda: mem._call("POST", "/note", {"text": 1}),
        "text.multiline": lambda: mem.note("two\nlines"),
        "text.control": lambda: mem.note("a\tb"),
        "text.bidi": lambda: mem.note("a\u202eb"),
        "text.invisible": lambda: mem.note("a\u200bb"),
        "text.empty": lambda: mem.note("  "),
        "text.reserved": lambda: mem.note("STASH_END"),
        "text.placeholder": lambda: mem.note("<one line>"),
        "text.too_long": lambda: mem.note("x" * 281),
        "block.invalid": lambda: mem.zoom("x"),
        "block.beyond_log": lambda: mem.zoom("8-9"),
        "nap.missing_block": lambda: mem.nap(None, "a line"),
        "nap.missing_text": lambda: mem.nap("0-1"),
        "nap.wrong_block": lambda: mem.nap("2-3", "not the due block"),
        "nap.mixed": lambda: mem._call("POST", "/nap", {"block": "0-1", "text": "t", "batch": 1}),
        "nap.bad_batch": lambda: mem.batch(0),
        "nap.bad_summaries": lambda: mem.settle([]),
        "wake.needs_nap": needy.wake,
        "wake.bad_t": lambda: mem.wake_part(1, 999),
        "wake.no_part": lambda: mem.wake_part(99),
        "recall.bad_pattern": lambda: mem.recall("("),
        "recall.bad_words": lambda: mem.recall(words="!!!"),
        "recall.q_and_words": lambda: mem._call("POST", "/recall", {"q": "a", "words": "a"}),
        "forget.no_summary": lambda: mem.forget("0-1"),
        "config.empty": lambda: mem.config({}),
        "config.out_of_range": lambda: mem.config({"WAKE_LINES": 0}),
        "config.unknown_name": lambda: mem.config({"NOT_A_SIZE": 1}),
        "import.empty": lambda: mem.import_([]),
        "import.bad_entry": lambda: mem._call("POST", "/import", {"entries": [{"x": 1}]}),
        "import.bad_date": lambda: empty.import_([("2026-02-30", "no such day")]),
        "import.out_of_order": lambda: empty.import_([("2026-01-03", "later"), ("2026-01-02", "earlier")]),
        "import.before_log": lambda: mem.import_([("2020-01-02", "before the newest memory")]),
        "init.bad_url": lambda: Stash(url, None).init("ftp://example"),
        "grants.bad_scope": lambda: mem.mint("root"),
        "grants.bad_label": lambda: mem.mint("read", label="two\nlines"),
        "grants.bad_expires": lambda: mem.mint("read", expires="2000-01-01T00:00:00Z"),
        "grants.bad_url": lambda: mem.mint("read", url="ftp://example"),
        "grants.unknown": lambda: mem.revoke(999_999),
        "grants.owner": lambda: mem.revoke(owner_id),
        "memory.unknown": lambda: mem.fork("nope", "copy"),
        "memory.bad_name": lambda: mem.create("Not A Name!"),
        "memory.exists": lambda: mem.create("empty"),
        "memory.main": lambda: mem.delete("main"),
        "memory.bad_at": lambda: mem.fork("main", "copy", at=10**6),
        "memory.bad_query": lambda: mem.erase_matching(),
        "erase.bad_ids": lambda: mem.erase([]),
        "erase.unknown_id": lambda: mem.erase([10**6]),
        "undo.bad_range": lambda: mem.undo(),
        "shape.out_of_range": lambda: mem._call("GET", "/shape?T=10000000000000000&lines=8"),
        "reference.no_part": lambda: mem._call("POST", "/reference", {"part": 10_000}),
        "route.unknown": lambda: mem._call("GET", "/no-such-route"),
        "method_not_allowed": lambda: mem._call("DELETE", "/wake"),
        "store.pin_mismatch": pin_mismatch,
    }


def restricted_cases(url: str, mem: Stash, invite: str, metrics: str) -> dict[str, Callable[[], object]]:
    """Refusals of a server that mints by invitation, with small quotas (see the test below); the
    address's failed authentications (a wrong invite, operator token or capability) go last, since they
    lock the address out."""
    mem.note("memory 0")
    side = mem.create("side")  # --max-memories 2: full
    importer = Stash(f"{mem.url}/m/{side.name}", mem.mint("full", memory=side.name).token)
    importer.import_([("2026-01-02", "one"), ("2026-01-02", "two")])  # --import-per-day 3: one left
    _owner_of(url, invite)  # --init-per-day 2: both of this address's for today (``mem`` was the first)
    forged = Stash(url, "stash1_" + "0" * 16 + "_" + "A" * 49)
    return {
        "memory.too_many": lambda: mem.create("third"),
        "quota.memories": lambda: [mem.note(f"memory {k}") for k in range(1, 9)],  # --quota-memories 6, in all
        "quota.import_request": lambda: importer.import_([("2026-01-03", f"n{k}") for k in range(3)]),
        "quota.import_day": lambda: importer.import_([("2026-01-03", "a"), ("2026-01-03", "b")]),
        "quota.identities": lambda: Stash(url, None).init(invite=invite),
        "init.invite_required": lambda: Stash(url, None).init(),
        "auth.operator": lambda: Stash(url, metrics + "x")._call("GET", "/metrics"),
        "rate_limited": lambda: _until_refused_otherwise(forged.wake),
    }


def closed_cases(url: str, mem: Stash, invite: str) -> dict[str, Callable[[], object]]:
    """Refusals of that server restarted with ``--init off --quota-bytes 1`` (and room for memories)."""
    return {
        "init.disabled": lambda: Stash(url, None).init(invite=invite),
        "quota.bytes": lambda: mem.note("a folder over its quota takes no more"),
    }


def _until_refused_otherwise(call: Callable[[], object]) -> None:
    """``call`` again while it is refused 401 (a few times at most), so the next refusal is the other one."""
    for _ in range(5):
        try:
            call()
        except Unauthorized:
            continue


# What no test here raises from a real server, and why; their classes are checked from the declaration by
# tests/unit/test_client_codes.py. Together with the cases above this must be every code declared.
NOT_RAISED_HERE = {
    "request.malformed": "the library sends only JSON, with a numeric Content-Length",
    "request.bad_plain": "the library never sends text/plain",
    "request.bad_pin": "the library sends only pins of the server's own form (tests/unit/test_log_digest.py)",
    "idempotency.bad_key": "the library makes every key itself (tests/api/test_api_idempotency.py)",
    "idempotency.key_reused": "the library resends a key only with the same body (tests/api/test_api_idempotency.py)",
    "append.not_ready": "an append capability's write after a key change that no read-capable request has opened since",
    "grants.busy": "a race of two revocations (tests/invariants/_chaos.py)",
    "store.rekeyed": "a race with a revocation, which the client resends (tests/unit/test_client_redo.py)",
    "busy.user": "concurrency, which the client waits out (tests/unit/test_fairshare.py)",
    "busy.slow": "concurrency, which the client waits out (tests/e2e/test_fair_shares.py)",
    "busy.server": "concurrency, which the client waits out (tests/e2e/test_fair_shares.py)",
    "recall.too_slow": "a scan past its 5 s bound",
    "memory.too_many_matches": "more than 10,000 matching memories",
    "store.rolled_back": "an older copy of a file put back (tests/e2e/test_swap_matrix.py)",
    "store.missing": "a user's files gone from the data folder (tests/e2e/test_damage.py)",
    "store.unreadable": "an I/O error (tests/e2e/test_damage.py)",
    "store.read_only": "a read-only data folder (tests/e2e/test_damage.py)",
    "store.full": "a full disk (tests/e2e/test_full_disk.py)",
    "internal": "an unexpected failure",
    "ready.unwritable": "a readiness probe, which the library does not make (tests/e2e/test_operating.py)",
    "ready.replication": "a readiness probe, which the library does not make",
    "server.stopping": "a server stopping mid-request (tests/e2e/test_shutdown_cut.py)",
    **{
        code: "an MCP host's request to /mcp, which the library never sends (tests/api/test_mcp_api.py)"
        for code in ("mcp.bad_host", "mcp.bad_origin", "mcp.bad_request", "mcp.not_acceptable")
    },
    **{
        code: "the owner's consent page in a browser (tests/api/test_oauth.py)"
        for code in ("consent.bad_choice", "consent.bad_origin", "consent.expired")
    },
    **{
        code: "an MCP host's OAuth registration or code exchange (tests/api/test_oauth.py)"
        for code in (
            "oauth.invalid_client",
            "oauth.invalid_client_metadata",
            "oauth.invalid_grant",
            "oauth.invalid_redirect_uri",
            "oauth.invalid_request",
            "oauth.unsupported_grant_type",
        )
    },
    **{
        code: "a host of a fleet, which this test's single server is not (tests/e2e/test_fleet_host.py, "
        "tests/e2e/test_fleet_drill.py, tests/e2e/test_fleet_oauth.py)"
        for code in ("fleet.elsewhere", "fleet.moving", "fleet.unreachable", "fleet.bad_hop")
    },
}


def test_every_declared_code_is_raised_here_or_named_why_not() -> None:
    raised = {*_case_codes(default_cases), *_case_codes(restricted_cases), *_case_codes(closed_cases), "store.damaged"}
    assert not raised & set(NOT_RAISED_HERE)
    assert raised | set(NOT_RAISED_HERE) == set(CODES), set(CODES) ^ (raised | set(NOT_RAISED_HERE))


def _case_codes(build: Callable[..., dict[str, Callable[[], object]]]) -> list[str]:
    """The codes a case table names, read from its source (building it needs a server)."""
    return re.findall(r'^\s+"([a-z_.]+)": ', inspect.getsource(build), re.M)


def test_every_refusal_of_a_default_server_raises_its_class(served: Server) -> None:
    _provoke(default_cases(served.url))


def test_every_refusal_of_a_restricted_server_raises_its_class(tmp_path: Path) -> None:
    invite, metrics = "an invite secret", "a metrics token"
    srv = Server(
        data=tmp_path / "data",
        log=tmp_path / "server.log",
        extra=[
            "--init",
            "invite",
            "--quota-memories",
            "6",
            "--max-memories",
            "2",
            "--import-per-request",
            "2",
            "--import-per-day",
            "3",
            "--init-per-day",
            "2",
            "--auth-failures-per-minute",
            "2",
        ],
        env={"STASH_INVITE_SECRET": invite, "STASH_METRICS_TOKEN": metrics},
    ).start()
    try:
        mem = _owner_of(srv.url, invite)
        _provoke(restricted_cases(srv.url, mem, invite, metrics))
        srv.stop()
        srv.extra += ["--init", "off", "--quota-bytes", "1", "--quota-memories", "1000"]
        srv.start(same_port=True)
        _provoke(closed_cases(srv.url, mem, invite))
    finally:
        srv.stop()


def test_no_server_is_unreachable_and_a_nap_needed_is_a_conflict(served: Server, owner: str) -> None:
    with pytest.raises(Unreachable) as nobody:
        Stash(f"http://127.0.0.1:{free_port()}", owner).wake()
    assert nobody.value.status == 0 and nobody.value.code == ""
    assert issubclass(NapNeeded, Conflict) and issubclass(Conflict, StashError)


def test_every_method_against_the_server(served: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each public method of :class:`Stash`, called directly (not only from another method), its typed answer
    checked against the API's own state through plain HTTP."""
    public = {name for name, value in vars(Stash).items() if callable(value) and not name.startswith("_")}
    called: set[str] = set()
    depth = [0]

    def recorder(name: str, method: Any) -> Any:
        def record(self: Stash, *args: object, **kw: object) -> object:
            if not depth[0]:
                called.add(name)
            depth[0] += 1
            try:
                return method(self, *args, **kw)
            finally:
                depth[0] -= 1

        return record

    for name in public:
        monkeypatch.setattr(Stash, name, recorder(name, getattr(Stash, name)))
    http = Http(served.url)

    mem = Stash(served.url, None)
    made = mem.init()
    assert made.token.startswith("stash1_") and len(made.user_id) == 16 and made.prompt
    token = made.token
    assert http.ok("GET", "/grants", token)["grants"][0]["you"]
    assert mem.where() == f"{served.url} (Stash(url))"
    health = mem.health()
    assert health.ok and health.version == stash.__version__ and health.content_cipher == "xchacha20-poly1305"

    assert mem.note("alpha one").id == 0
    second = mem.note("beta two")
    assert second.id == 1 and second.nap is not None and second.nap.block == "0-1"
    part = mem.wake_part()
    raw = http.ok("POST", "/wake", token, json={})
    assert (part.T, part.part, part.parts, part.lines, part.awake) == (2, 1, raw["parts"], raw["lines"], True)
    assert mem.wake().lines == raw["lines"]
    assert mem.request("POST", "/wake", {})["lines"] == raw["lines"]  # the raw answer stash mcp's tools read
    assert mem.due() == second.nap
    asked = mem.nap()
    assert asked.saved is None and asked.nap == second.nap
    assert mem.nap("0-1", "alpha and beta").saved == "0-1"
    mem.note("gamma three")
    mem.note("delta four")
    batch = mem.batch(4)
    assert [n.block for n in batch.naps] == ["2-3", "0-3"] and batch.nap and batch.nap.block == "2-3"
    assert mem.naps(4) == batch.naps
    assert mem.settle({n.block: f"sum {n.block}" for n in batch.naps}).saved == ["2-3", "0-3"]
    assert http.ok("POST", "/nap", token, json={})["nap"] is None

    assert mem.recall("alpha").matches == http.ok("POST", "/recall", token, json={"q": "alpha"})["matches"]
    words = mem.recall(words="beta")
    assert words.total == 1 and "beta two" in words.matches[0] and words.scores and len(words.scores) == 1
    assert mem.zoom("0-1").lines == http.ok("POST", "/zoom", token, json={"block": "0-1"})["lines"]
    assert mem.forget("0-1").dropped[0] == "0-1"
    assert http.ok("POST", "/nap", token, json={})["nap"]["block"] == "0-1"

    sizes = mem.config()
    assert sizes.sizes == http.ok("GET", "/config", token)["sizes"] and sizes.defaults["WAKE_LINES"] == 96
    assert mem.config({"WAKE_LINES": 50}).sizes["WAKE_LINES"] == 50
    assert http.ok("GET", "/config", token)["sizes"]["WAKE_LINES"] == 50

    side = mem.create("side")
    assert (side.name, side.T) == ("side", 0)
    in_side = Stash(f"{served.url}/m/side", token)
    imported = in_side.import_([("2026-01-02", "old x"), ("2026-01-03", "older y")])
    assert (imported.first, imported.last) == (0, 1)
    listed = {m.name: m.T for m in mem.memories()}
    assert listed == {m["name"]: m["T"] for m in http.ok("GET", "/memories", token)["memories"]}
    assert listed == {"main": 4, "side": 2}
    forked = mem.fork("side", "copy", at=1)
    assert (forked.name, forked.source, forked.at) == ("copy", "side", 1)
    assert http.ok("POST", "/m/copy/wake", token, json={})["T"] == 1
    dry = mem.erase_matching("x", memories=["side"], dry_run=True)
    assert (dry.memories, dry.total, dry.dry_run) == ({"side": 1}, 1, True)
    done = mem.erase_matching("old x", memories=["side"])
    assert not done.dry_run and done.memories == {"side": 1} and done.fingerprint
    assert "[erased]" in http.ok("POST", "/m/side/wake", token, json={})["lines"][0]
    gone = mem.delete("copy")
    assert gone.memory == "copy" and gone.memories == 1
    assert "copy" not in {m["name"] for m in http.ok("GET", "/memories", token)["memories"]}

    minted = mem.mint("full", label="writer")
    assert {g.id: g.label for g in mem.grants()}[minted.id] == "writer"
    wrote = Stash(served.url, minted.token).note("written by the writer")
    revoked = mem.revoke(minted.id)
    assert revoked.id == minted.id and not revoked.already
    undone = mem.undo(grant=minted.id)
    assert undone.erased == [wrote.id] and undone.receipt is not None and undone.more is None
    receipt = mem.erase([0])
    assert receipt.erased == [0]
    assert [r.receipt for r in mem.erasures()] == [r["receipt"] for r in http.ok("GET", "/erasures", token)["erasures"]]

    archive = mem.archive()
    assert archive.manifest["memories"] == 5 and "memory/LOG.txt" in archive.members
    with tarfile.open(mem.export(tmp_path / "m.tar.gz")) as tar:
        assert "memory/LOG.txt" in tar.getnames()

    rotated = mem.rotate()
    assert rotated.token != token and mem.grants()
    assert http.request("GET", "/grants", token).status_code == 401
    destroyed = mem.destroy()
    assert destroyed.memories == 5
    assert http.request("GET", "/grants", rotated.token).status_code == 401
    http.close()
    assert called == public, public - called


def test_a_damaged_store_is_a_server_error(tmp_path: Path) -> None:
    with start_server(tmp_path / "srv") as srv:
        http = Http(srv.url)
        init = http.init()
        mem = Stash(srv.url, init["token"], pin=False)
        mem.note("a line to lose")
        srv.stop()
        for f in (srv.data / "users" / init["user_id"]).glob("memory.db*"):
            f.write_bytes(b"\0" * 4096)
        srv.start(same_port=True)
        with pytest.raises(ServerError) as broken:
            mem.wake()
        assert broken.value.status >= 500 and broken.value.code.startswith("store.")
        http.close()


def test_the_example_agent_loop_runs_a_session(served: Server, owner: str, tmp_path: Path) -> None:
    """examples/agent_loop.py as CLIENT.md shows it: a real process against the real server."""
    import os
    import subprocess

    from tests.support.server import REPO

    notes = [f"decision {k}: kept the plan" for k in range(5)]
    env = {
        **os.environ,
        "STASH_URL": served.url,
        "STASH_TOKEN": owner,
        "STASH_PINS": str(tmp_path / "p.json"),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "agent_loop.py"), *notes],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    mem = Stash(served.url, owner)
    assert mem.due() is None  # every nap was answered
    assert [line.split(" ", 2)[2] for line in done.stdout.splitlines()] == notes


def test_the_file_fetched_from_the_server_is_the_library(served: Server, tmp_path: Path) -> None:
    """``curl -o stash_client.py $STASH_URL/client`` then ``import stash_client``: the same classes."""

    path = tmp_path / "stash_client.py"
    path.write_bytes(loopback.get(served.url + "/client").content)
    spec = importlib.util.spec_from_file_location("stash_client", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["stash_client"] = module
    try:
        spec.loader.exec_module(module)
        assert {"Stash", "StashError", "Nap", "Wake"} <= set(module.__all__)
        assert set(stash.__all__) >= {"Stash", "StashError"}
    finally:
        del sys.modules["stash_client"]


def test_its_messages_speak_to_a_program_not_a_shell(served: Server, owner: str, monkeypatch) -> None:
    """A library user's mistakes are told in the library's terms: a refused
    token names the token given to Stash and the call that mints one (never a
    command to run, nor the script's own name); an address that is not http(s)
    is a ValueError naming both schemes before anything is sent; a summary's
    block without its text is refused, never answered as saved."""
    monkeypatch.setattr(sys, "argv", ["/somewhere/my_agent.py"])
    with pytest.raises(Unauthorized) as refused:
        Stash(served.url, "stash1_" + "0" * 16 + "_" + "A" * 49).wake()
    said = refused.value.message
    assert "token given to Stash" in said and "Stash(url, None).init()" in said, said
    assert "STASH_TOKEN" not in said and "my_agent" not in said and " init URL" not in said, said
    for bad in ("ftp://x", "127.0.0.1:8080", ""):
        with pytest.raises(ValueError, match="http:// or https://"):
            Stash(bad, None)
    mem = Stash(served.url, owner)
    mem.note("one")
    mem.note("two")
    mem.nap("0-1", "one and two")
    with pytest.raises(StashError) as no_text:
        mem.nap("0-1", None)
    assert no_text.value.code == "nap.missing_text"
