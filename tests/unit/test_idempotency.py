"""Idempotency records at the store level, without HTTP: a real vault on
disk, real sessions, the service functions the routes call."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stash.core.errors import Conflict, Damaged, Invalid, Malformed
from stash.crypto import keys
from stash.service import idempotency
from stash.service.access import Vault
from stash.service.idempotency import WINDOW_SECONDS, Keyed, memory_write
from tests.support.api import token_parts

T0 = 1_900_000_000  # a fixed clock, so the window is tested without waiting


@pytest.fixture
def vault(tmp_path: Path, file_cipher: str) -> Vault:
    return Vault(tmp_path / "data", file_cipher=file_cipher)


def note(vault: Vault, token: str, key: str | None, text: str, now: float = T0, route: str = "POST /note"):
    with vault.session(token, "full") as s:
        return memory_write(s, key, route, {"text": text}, lambda: s.open_memory().note(text), now)


def log(vault: Vault, token: str) -> list[str]:
    with vault.session(token, "read") as s:
        return [text for _, _, text in s.open_memory().mf.memories(0, s.open_memory().mf.count())]


def records(vault: Vault, token: str) -> int:
    with vault.session(token, "read") as s:
        return s.open_memory().mf.conn.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0]


def folder_bytes(vault: Vault, user_id: str) -> bytes:
    folder = vault.data_dir / "users" / user_id
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


def test_an_exact_retry_replays_and_writes_nothing(vault: Vault):
    token = vault.create_identity().token
    first = note(vault, token, "k-1", "chose jade")
    assert not first.replayed and first.body["id"] == 0
    for _ in range(4):
        again = note(vault, token, "k-1", "chose jade", now=T0 + 60)
        assert again.replayed and again.body == first.body
    assert log(vault, token) == ["chose jade"]
    assert records(vault, token) == 1


def test_without_a_key_every_request_writes(vault: Vault):
    token = vault.create_identity().token
    note(vault, token, None, "same")
    note(vault, token, None, "same")
    assert log(vault, token) == ["same", "same"]
    assert records(vault, token) == 0


def test_the_answer_replayed_is_the_first_even_after_the_memory_moved_on(vault: Vault):
    token = vault.create_identity().token
    first = note(vault, token, "a", "one")
    note(vault, token, "b", "two")  # a nap is due now; the first answer said none
    again = note(vault, token, "a", "one")
    assert again.replayed and again.body == first.body
    assert first.body["head"]["count"] == 1  # the head of that moment, not of now
    assert {k: v for k, v in first.body.items() if k != "head"} == {"id": 0, "nap": None}


def test_the_same_key_with_another_body_or_route_is_refused(vault: Vault):
    token = vault.create_identity().token
    note(vault, token, "k", "original")
    with pytest.raises(Conflict) as err:
        note(vault, token, "k", "something else")
    assert err.value.status == 409 and err.value.code == "idempotency.key_reused"
    with pytest.raises(Conflict):
        note(vault, token, "k", "original", route="POST /nap")
    assert log(vault, token) == ["original"]


def test_the_body_is_compared_as_json_not_as_text(vault: Vault):
    token = vault.create_identity().token
    with vault.session(token, "full") as s:
        s.open_memory().mf.append([("2020-01-01", "a"), ("2020-01-02", "b")])

        def nap(body: dict):
            return memory_write(s, "n", "POST /nap", body, lambda: s.open_memory().nap(body["block"], body["text"]))

        first = nap({"block": "0-1", "text": "both"})
        again = nap({"text": "both", "block": "0-1"})
    assert first.body["saved"] == "0-1" and again.replayed and again.body == first.body


def test_a_refusal_is_not_recorded_so_a_corrected_retry_runs(vault: Vault):
    token = vault.create_identity().token
    with pytest.raises(Invalid):
        note(vault, token, "k", "two\nlines")
    assert records(vault, token) == 0
    fixed = note(vault, token, "k", "one line")
    assert not fixed.replayed and log(vault, token) == ["one line"]


def test_after_the_window_a_retry_is_a_new_request_and_the_old_record_is_gone(vault: Vault):
    token = vault.create_identity().token
    note(vault, token, "k", "x")
    assert note(vault, token, "k", "x", now=T0 + WINDOW_SECONDS - 1).replayed
    later = note(vault, token, "k", "x", now=T0 + WINDOW_SECONDS)
    assert not later.replayed and later.body["id"] == 1
    assert log(vault, token) == ["x", "x"]
    assert records(vault, token) == 1  # the expired one was purged by this write


def test_keys_are_per_user(vault: Vault):
    alice, bob = vault.create_identity().token, vault.create_identity().token
    assert not note(vault, alice, "shared", "hello").replayed
    assert not note(vault, bob, "shared", "hello").replayed
    assert log(vault, alice) == ["hello"] and log(vault, bob) == ["hello"]


def test_neither_the_key_nor_the_answer_is_in_the_files(vault: Vault):
    ident = vault.create_identity()
    key = "Key-Sentinel-7f3a9c41d2"
    text = "Memory-Sentinel-5be2"
    answer = note(vault, ident.token, key, text).body
    with vault.session(ident.token, "owner") as s:
        grant = idempotency.keyring_write(
            s, key, "POST /grants", {"scope": "read"}, lambda: {"token": vault.mint_grant(s, "read")[1]}, T0
        ).body
    data = folder_bytes(vault, ident.user_id)
    secret = token_parts(grant["token"]).secret
    for value in (
        key.encode(),
        text.encode(),
        f'"id":{answer["id"]},"nap"'.encode(),
        grant["token"].encode(),
        secret,
        secret[:16],
    ):
        assert value not in data


def test_a_flipped_byte_in_a_stored_answer_is_refused_not_replayed(vault: Vault):
    token = vault.create_identity().token
    note(vault, token, "k", "x")
    with vault.session(token, "full") as s:
        conn = s.open_memory().mf.conn
        (sealed,) = conn.execute("SELECT sealed FROM idempotency").fetchone()
        flipped = bytearray(sealed)
        flipped[40] ^= 1
        conn.execute("UPDATE idempotency SET sealed = ?", (bytes(flipped),))
    with pytest.raises(Damaged):
        note(vault, token, "k", "x")
    assert log(vault, token) == ["x"]


def test_a_record_moved_to_another_key_does_not_open(vault: Vault):
    token = vault.create_identity().token
    note(vault, token, "a", "first")
    note(vault, token, "b", "first")  # same body, another key: a second memory
    with vault.session(token, "full") as s:
        conn = s.open_memory().mf.conn
        rows = conn.execute("SELECT lookup, sealed FROM idempotency").fetchall()
        (la, sa), (lb, sb) = rows
        conn.execute("UPDATE idempotency SET sealed = ? WHERE lookup = ?", (sb, la))
        conn.execute("UPDATE idempotency SET sealed = ? WHERE lookup = ?", (sa, lb))
    with pytest.raises(Damaged):
        note(vault, token, "a", "first")
    assert log(vault, token) == ["first", "first"]


def test_a_minted_token_replays_and_opens_only_with_the_owner_capability(vault: Vault):
    ident = vault.create_identity()

    def mint():
        with vault.session(ident.token, "owner") as s:
            return idempotency.keyring_write(
                s, "g", "POST /grants", {"scope": "full"}, lambda: {"token": vault.mint_grant(s, "full")[1]}, T0
            )

    first, again = mint(), mint()
    assert not first.replayed and again.replayed and again.body == first.body
    with vault.session(ident.token, "owner") as s:
        assert len(vault.list_grants(s)) == 2
        # The master key alone (which every capability unwraps) does not open it.
        store = keys.subkey(s.master, b"idempotency")
        as_if = Keyed.make(
            user_id=ident.user_id,
            file="keyring",
            master=s.master,
            seal_root=store,
            route="POST /grants",
            key="g",
            body={"scope": "full"},
        )
        ((sealed,),) = s.keyring.conn.execute("SELECT sealed FROM idempotency").fetchall()
        with pytest.raises(Damaged):
            as_if.open(sealed)
    with vault.session(first.body["token"], "full"):
        pass  # the replayed token is the live one


def test_concurrent_requests_with_one_key_write_once(vault: Vault):
    token = vault.create_identity().token
    answers, errors = [], []
    start = threading.Barrier(6)

    def worker():
        try:
            start.wait(timeout=30)
            answers.append(note(vault, token, "race", "only once"))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(answers) == 6
    assert sum(not a.replayed for a in answers) == 1
    assert {a.body["id"] for a in answers} == {0}
    assert log(vault, token) == ["only once"]


@pytest.mark.parametrize("value", ["", " ", "a b", "é", "x" * 256, "tab\there"])
def test_malformed_keys_are_refused(value: str):
    with pytest.raises(Malformed) as err:
        idempotency.parse_key([value])
    assert err.value.status == 400 and err.value.code == "idempotency.bad_key"


def test_a_key_sent_twice_is_refused_and_good_keys_pass():
    with pytest.raises(Malformed):
        idempotency.parse_key(["a", "a"])
    assert idempotency.parse_key([]) is None
    for good in ("a", "x" * 255, "550e8400-e29b-41d4-a716-446655440000", '"quoted"', "~!#$%&'()*+,-./:;<=>?@[]^_`{|}"):
        assert idempotency.parse_key([good]) == good


def test_any_later_write_deletes_expired_records(vault: Vault):
    ident = vault.create_identity()
    note(vault, ident.token, "k", "x")
    note(vault, ident.token, None, "y", now=T0 + WINDOW_SECONDS - 1)
    assert records(vault, ident.token) == 1
    note(vault, ident.token, None, "z", now=T0 + WINDOW_SECONDS)
    assert records(vault, ident.token) == 0

    def mint(key: str | None, now: int):
        with vault.session(ident.token, "owner") as s:
            idempotency.keyring_write(
                s, key, "POST /grants", {"scope": "read"}, lambda: {"token": vault.mint_grant(s, "read")[1]}, now
            )
            return s.keyring.conn.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0]

    assert mint("g", T0) == 1
    assert mint(None, T0 + WINDOW_SECONDS) == 0  # the sealed token is gone from the key ring


def test_an_erasure_deletes_every_record(vault: Vault):
    token = vault.create_identity().token
    note(vault, token, "a", "to be erased")
    note(vault, token, "b", "kept")
    with vault.session(token, "owner") as s:
        s.open_memory().erase([0], "2026-01-01T00:00:00Z")
    assert records(vault, token) == 0
    # So a retry of a write made before the erasure is a new request.
    assert not note(vault, token, "b", "kept").replayed
