"""Memories: every memory route under /m/{name}, the uniform 404, capabilities
bound by keys, the append scope (docs/DESIGN.md, "Memories")."""

from __future__ import annotations

import sqlite3

from tests.api.support import today_utc
from tests.support.api import Api

ROUTES = [
    ("POST", "/import", {"entries": [{"date": "2021-01-02", "text": "old"}]}),
    ("GET", "/wake", None),
    ("POST", "/wake", {}),
    ("POST", "/note", {"text": "a line"}),
    ("POST", "/nap", {}),
    ("GET", "/recall?q=x", None),
    ("POST", "/recall", {"q": "x"}),
    ("GET", "/config", None),
    ("POST", "/config", {"WAKE_LINES": 90}),
    ("GET", "/erasures", None),
    ("GET", "/export", None),
]


def _call(api: Api, method: str, path: str, token: str, body: dict | None):
    return api.get(path, token) if method == "GET" else api.post(path, token, json=body)


def _mint(api: Api, owner: str, scope: str, memory: str | None = None) -> dict:
    body = {"scope": scope} | ({"memory": memory} if memory else {})
    resp = api.post("/grants", owner, json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_every_memory_route_under_m_and_isolated(api: Api) -> None:
    owner = api.init()["token"]
    assert api.post("/memories", owner, json={"name": "proj-a"}).status_code == 201
    assert api.post("/memories", owner, json={"name": "proj-a"}).json()["error"] == "memory.exists"
    assert api.post("/memories", owner, json={"name": "Bad Name"}).status_code in (400, 422)
    for method, path, body in ROUTES:
        resp = _call(api, method, "/m/proj-a" + path, owner, body)
        assert resp.status_code < 300, (method, path, resp.text)
    api.post("/m/proj-a/note", owner, json={"text": "only in a"})
    assert "only in a" in api.get("/m/proj-a/wake", owner).text
    assert "only in a" not in api.get("/wake", owner).text
    rows = api.get("/memories", owner).json()["memories"]
    assert [m["name"] for m in rows] == ["main", "proj-a"]
    assert rows[1]["last_write"] == rows[1]["created"][:10] and rows[0]["last_write"] is None


def test_bound_capability_404_is_uniform(api: Api) -> None:
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "a"})
    api.post("/memories", owner, json={"name": "b"})
    full_a = _mint(api, owner, "full", "a")
    assert full_a["memory"] == "a" and "/m/a" in full_a["prompt"]
    tok = full_a["token"]
    assert api.post("/note", tok, json={"text": "root acts on a"}).status_code == 200
    assert "root acts on a" in api.get("/m/a/wake", owner).text
    answers = [api.get(f"/m/{n}/wake", tok) for n in ("b", "main", "nope", "zz9")]
    assert {r.status_code for r in answers} == {404}
    assert len({r.text for r in answers}) == 1
    assert answers[0].json()["error"] == "memory.unknown"


def test_append_scope_notes_only_and_readers_see_it(api: Api) -> None:
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "ci"})
    app = _mint(api, owner, "append", "ci")["token"]
    first = api.post("/note", app, json={"text": "build 7 green"})
    assert first.status_code == 200 and first.json() == {"id": 0, "nap": None}
    assert api.post("/m/ci/note", app, json={"text": "build 8 red"}).json() == {"id": 1, "nap": None}
    for path in ("/m/ci/wake", "/m/ci/recall?q=build", "/m/ci/config"):
        assert api.get(path, app).status_code == 403
    wake = api.get("/m/ci/wake", owner).text
    assert "build 7 green" in wake and "build 8 red" in wake
    body = api.post("/m/ci/note", owner, json={"text": "owner line"}).json()
    assert body["id"] == 2
    assert api.post("/note", app, json={"text": "after"}).json()["id"] == 3


def test_append_token_with_every_file_opens_nothing(api: Api, data_dir) -> None:
    owner = api.init()
    api.post("/memories", owner["token"], json={"name": "ci"})
    api.post("/m/ci/note", owner["token"], json={"text": "qqzz before"})
    app = _mint(api, owner["token"], "append", "ci")["token"]
    api.post("/note", app, json={"text": "qqzz appended"})
    folder = data_dir / "users" / owner["user_id"]
    blob = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())
    assert b"qqzz" not in blob
    secret = app.split("_")[2].encode()
    # The append grant's row holds no box, no key of any kind.
    ring = sqlite3.connect(folder / "m" / "ci" / "keyring.db")
    cols = [r[1] for r in ring.execute("PRAGMA table_info(append_grants)")]
    assert cols == ["id", "tag", "created", "revoked", "mac"]
    assert secret not in blob
    ring.close()


def test_append_grant_takes_label_and_expiry_like_read_and_full(api: Api, data_dir) -> None:
    """POST /grants takes label and expires for every scope: an append
    grant's label is listed (sealed to the owner on disk), its expiry refuses
    the token, and an expiry edited in the key ring to extend the grant is
    caught by the MAC that binds it."""
    made = api.init()
    owner = made["token"]
    api.post("/memories", owner, json={"name": "ci"})
    later = "2099-01-01T00:00:00Z"
    body = {"scope": "append", "memory": "ci", "label": "nightly build qqlabel", "expires": later}
    minted = api.post("/grants", owner, json=body)
    assert minted.status_code == 201, minted.text
    grant = minted.json()
    assert (grant["label"], grant["expires"]) == ("nightly build qqlabel", later)
    (row,) = [g for g in api.get("/grants", owner).json()["grants"] if g["id"] == grant["id"]]
    assert (row["label"], row["expires"], row["live"]) == ("nightly build qqlabel", later, True)
    assert api.post("/note", grant["token"], json={"text": "build 1"}).status_code == 200
    ring_path = data_dir / "users" / made["user_id"] / "m" / "ci" / "keyring.db"
    assert b"qqlabel" not in ring_path.read_bytes()
    # Its expiry passes (moved into the past on disk: the stored expiry is trusted to refuse): refused as revoked.
    ring = sqlite3.connect(ring_path)
    ring.execute("UPDATE grant_notes SET expires = '2020-01-01T00:00:00Z' WHERE grant_id = ?", (grant["id"],))
    ring.commit()
    assert api.post("/note", grant["token"], json={"text": "after expiry"}).status_code == 401
    (listed,) = [m for m in api.get("/memories", owner).json()["memories"] if m["name"] == "ci"]
    assert listed["grants"] == 0  # an expired capability is not a live one
    # A short grant extended by editing its expiry: its notes are refused at the fold, never folded quietly.
    short = api.post("/grants", owner, json={**body, "expires": "2098-01-01T00:00:00Z"}).json()
    ring.execute("UPDATE grant_notes SET expires = '2100-01-01T00:00:00Z' WHERE grant_id = ?", (short["id"],))
    ring.commit()
    ring.close()
    assert api.post("/note", short["token"], json={"text": "smuggled"}).status_code == 200
    resp = api.get("/m/ci/wake", owner)
    assert resp.status_code == 500 and resp.json()["error"] == "store.damaged"
    assert "smuggled" not in resp.text


def test_delete_memory_ends_its_grants(api: Api) -> None:
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "gone"})
    tok = _mint(api, owner, "read", "gone")["token"]
    assert api.get("/wake", tok).status_code == 200
    receipt = api.delete("/memories/gone", owner)
    assert receipt.status_code == 200 and receipt.json()["destroyed"] is True
    assert api.get("/wake", tok).status_code == 401
    assert api.get("/m/gone/wake", owner).json()["error"] == "memory.unknown"
    assert api.delete("/memories/main", owner).json()["error"] == "memory.main"


def test_a_sweep_that_takes_a_memory_mid_delete_leaves_the_delete_whole(api: Api, data_dir, monkeypatch) -> None:
    """Another request's sweep (another worker) can run between a delete's
    commit and its rename, find the folder no salt names and take it away
    first: the delete still answers its receipt, and the memory is gone."""
    from stash.storage import memories

    made = api.init()
    owner, user = made["token"], made["user_id"]
    api.post("/memories", owner, json={"name": "gone"})
    real_end = memories.end

    def end_then_swept(conn, number, name):
        real_end(conn, number, name)
        other = sqlite3.connect(data_dir / "users" / user / "keyring.db", isolation_level=None)
        try:
            memories.sweep(data_dir, user, other)  # as another request's listing would, meanwhile
        finally:
            other.close()

    monkeypatch.setattr(memories, "end", end_then_swept)
    answer = api.delete("/memories/gone", owner)
    assert answer.status_code == 200 and answer.json()["destroyed"] is True
    assert not (data_dir / "users" / user / "m" / "gone").exists()
    assert [m["name"] for m in api.get("/memories", owner).json()["memories"]] == ["main"]


def test_delete_memory_leaves_a_receipt_like_delete_store(api: Api, data_dir) -> None:
    """As DELETE /store: the answer names the receipt, a durable line for the
    operator names the memory only by a digest they recompute, and main's
    audit trail (which survives) records the deletion."""
    import hashlib
    import json

    made = api.init()
    owner, user = made["token"], made["user_id"]
    api.post("/memories", owner, json={"name": "gone"})
    api.post("/m/gone/note", owner, json={"text": "words never in a receipt"})
    ended = _mint(api, owner, "full", "gone")["id"]
    answer = api.delete("/memories/gone", owner).json()
    assert answer["receipt"] == "receipts/deletions.jsonl" and answer["grants_ended"] == [ended]
    line = (data_dir / answer["receipt"]).read_text(encoding="utf-8").splitlines()[-1]
    digest = hashlib.sha256(f"stash/v1|deleted-memory|{user}/gone".encode()).hexdigest()
    assert json.loads(line) == {
        "user_sha256": hashlib.sha256(f"stash/v1|deleted-user|{user}".encode()).hexdigest(),
        "memory_sha256": digest,
        "at": answer["at"],
        "grant": 1,
        "memories": 1,
    }
    assert "never in a receipt" not in line and user not in line and "gone" not in line
    events = api.get("/audit", owner).json()["events"]
    (event,) = [e for e in events if e["event"] == "delete"]
    assert event["memory"] == "main" and event["detail"] == {"memory": "gone", "memories": 1, "grants_ended": 1}
    assert [e["detail"] for e in events if e["event"] == "create"] == [{"memory": "gone"}]
    api.post("/m/main/note", owner, json={"text": "one"})
    assert api.post("/memories/main/fork", owner, json={"name": "copy"}).status_code == 201
    (forked,) = [e for e in api.get("/audit", owner).json()["events"] if e["event"] == "fork"]
    assert forked["memory"] == "main" and forked["detail"] == {"memory": "copy", "at": 1}


def test_revoking_in_a_starts_an_epoch_in_a_only(api: Api, data_dir) -> None:
    owner = api.init()
    api.post("/memories", owner["token"], json={"name": "a"})
    api.post("/memories", owner["token"], json={"name": "b"})
    g = _mint(api, owner["token"], "read", "a")
    folder = data_dir / "users" / owner["user_id"] / "m"

    def epoch(n: str) -> str | None:
        c = sqlite3.connect(folder / n / "keyring.db")
        row = c.execute("SELECT value FROM keyring_meta WHERE name = 'epoch'").fetchone()
        c.close()
        return row[0] if row else None

    assert api.delete(f"/grants/{g['id']}", owner["token"]).status_code == 200
    assert epoch("a") == "1" and epoch("b") is None
    assert api.get("/wake", g["token"]).status_code == 401
    listed = api.get("/grants", owner["token"]).json()["grants"]
    assert any(r["id"] == g["id"] and r["memory"] == "a" and not r["live"] for r in listed)


def test_fork_copies_a_prefix_under_new_keys_and_no_source_grant_opens_it(api: Api) -> None:
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "src"})
    api.post(
        "/m/src/import",
        owner,
        json={"entries": [{"date": "2021-01-0" + str(i + 1), "text": f"line {i}"} for i in range(6)]},
    )
    for block in ("0-1", "2-3", "4-5", "0-3"):
        nap = api.post("/m/src/nap", owner, json={}).json()["nap"]
        assert nap["block"] == block
        api.post("/m/src/nap", owner, json={"block": block, "text": f"sum {block}"})
    assert api.post("/m/src/erase", owner, json={"ids": [1]}).status_code == 200
    reader = _mint(api, owner, "full", "src")["token"]
    made = api.post("/memories/src/fork", owner, json={"name": "copy", "at": 5})
    assert made.status_code == 201, made.text
    assert made.json()["T"] == 5 and made.json()["erased"] == 1
    assert api.post("/memories/src/fork", owner, json={"name": "x", "at": 7}).json()["error"] == "memory.bad_at"
    zoom = api.get("/m/copy/zoom?block=2-3", owner).json()
    assert [ln for ln in zoom["lines"]] == ["#2 2021-01-03 line 2", "#3 2021-01-04 line 3"]
    # The summary of 2-3 came across; 0-1 and 0-3 held the erased #1 and were dropped in the source too.
    assert api.get("/m/copy/zoom?block=0-3", owner).json()["lines"][1] == "#2-3 sum 2-3"
    assert "[erased]" in api.get("/m/copy/zoom?block=0-1", owner).text
    assert "#4" in api.get("/m/copy/wake", owner).text and "#5 " not in api.get("/m/copy/wake", owner).text
    # Independent: the source's full capability opens nothing of the fork; the two evolve apart.
    assert api.get("/m/copy/wake", reader).json()["error"] == "memory.unknown"
    api.post("/m/copy/note", owner, json={"text": "only in the fork"})
    assert "only in the fork" not in api.get("/m/src/wake", owner).text


def test_erase_across_memories_one_receipt_counts_only(api: Api) -> None:
    owner = api.init()["token"]
    for name in ("a", "b"):
        api.post("/memories", owner, json={"name": name})
    api.post("/m/a/note", owner, json={"text": "user lovelace said hi"})
    api.post("/m/b/note", owner, json={"text": "lovelace again"})
    api.post("/m/b/note", owner, json={"text": "someone else"})
    api.post("/note", owner, json={"text": "lovelace in main"})
    dry = api.post("/memories/erase", owner, json={"q": "lovelace", "memories": ["a", "b"], "dry_run": True}).json()
    day = today_utc().isoformat()
    # A dry run shows the owner the lines that would go; the erasure's receipt carries counts only.
    assert dry["memories"] == [
        {"name": "a", "erased": 1, "lines": [f"#0 {day} user lovelace said hi"]},
        {"name": "b", "erased": 1, "lines": [f"#0 {day} lovelace again"]},
    ]
    assert dry["total"] == 2
    assert "lovelace" in api.get("/m/a/wake", owner).text
    done = api.post("/memories/erase", owner, json={"q": "lovelace"})
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["memories"] == [{"name": "main", "erased": 1}, {"name": "a", "erased": 1}, {"name": "b", "erased": 1}]
    assert "lovelace" not in done.text and len(body["fingerprint"]) == 32
    for path in ("/wake", "/m/a/wake", "/m/b/wake"):
        assert "lovelace" not in api.get(path, owner).text
    assert "someone else" in api.get("/m/b/wake", owner).text
    assert api.post("/memories/erase", owner, json={"q": "x", "memories": ["nope"]}).json()["error"] == "memory.unknown"
    assert api.post("/memories/erase", owner, json={}).json()["error"] == "memory.bad_query"


def test_erase_across_by_words_takes_every_word_folded(api: Api) -> None:
    """An end user's name typed without its accents or case erases every memory holding all of its words, in
    every memory, and no memory holding only one of them."""
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "support"})
    api.post("/note", owner, json={"text": "Ayşe Yılmaz asked for a refund"})
    api.post("/m/support/note", owner, json={"text": "ticket from AYŞE YILMAZ, Café Istanbul"})
    api.post("/m/support/note", owner, json={"text": "Ayşe Demir is another customer"})
    dry = api.post("/memories/erase", owner, json={"words": "ayse yilm", "dry_run": True}).json()
    assert {m["name"]: m["erased"] for m in dry["memories"]} == {"main": 1, "support": 1} and dry["total"] == 2
    done = api.post("/memories/erase", owner, json={"words": "ayse yilm"})
    assert done.status_code == 200, done.text
    assert "ayse" not in done.text.lower() and "Yılmaz" not in api.get("/m/support/wake", owner).text
    assert "Ayşe Demir" in api.get("/m/support/wake", owner).text
    assert "Yılmaz" not in api.get("/wake", owner).text
    assert api.post("/memories/erase", owner, json={"words": "x", "q": "x"}).json()["error"] == "memory.bad_query"


def test_max_memories_and_quotas_count_every_memory(data_dir) -> None:
    from stash.web.app import create_app
    from tests.support.api import make_settings

    api = Api(create_app(make_settings(data_dir, max_memories=2, quota_memories=3)))
    try:
        owner = api.init()["token"]
        assert api.post("/memories", owner, json={"name": "a"}).status_code == 201
        assert api.post("/memories", owner, json={"name": "b"}).json()["error"] == "memory.too_many"
        for _ in range(2):
            assert api.post("/note", owner, json={"text": "in main"}).status_code == 200
        assert api.post("/m/a/note", owner, json={"text": "third of the identity"}).status_code == 200
        assert api.post("/m/a/note", owner, json={"text": "one too many"}).json()["error"] == "quota.memories"
        app = _mint(api, owner, "append", "a")["token"]
        assert api.post("/note", app, json={"text": "one too many"}).json()["error"] == "quota.memories"
    finally:
        api.close()


def test_audit_names_the_memory(api: Api) -> None:
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "a"})
    g = _mint(api, owner, "read", "a")
    api.delete(f"/grants/{g['id']}", owner)
    api.post("/m/a/config", owner, json={"WAKE_LINES": 50})
    events = api.get("/audit", owner).json()["events"]
    seen = {(e["event"], e["memory"]) for e in events}
    assert {("mint", "a"), ("revoke", "a"), ("config", "a")} <= seen
    assert all(e["memory"] == "a" for e in events if e["event"] in ("mint", "revoke", "config"))


def test_an_owner_route_naming_another_memory_is_refused_for_scope_not_memory(api: Api) -> None:
    owner = api.init()["token"]
    api.post("/memories", owner, json={"name": "b"})
    in_b = _mint(api, owner, "read", "b")
    reader = _mint(api, owner, "full")["token"]
    resp = api.delete(f"/grants/{in_b['id']}", reader)
    assert resp.status_code == 403 and resp.json()["error"] == "auth.scope"
    assert api.get("/wake", in_b["token"]).status_code == 200
