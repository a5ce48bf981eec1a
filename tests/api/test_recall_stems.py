"""Stems in word search over HTTP (API-REFERENCE.md, "Word search";
docs/DESIGN.md, "Word search"): a fact worded in one inflection is found by
a question in another, English and Turkish; erasure by words still matches
prefixes alone; and an erased memory's stems are found by nothing, not even
from its `recall.db` of before the erasure put back while the server was
stopped. In main and in a second memory, on SQLCipher and plain stores."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.web.app import create_app
from tests.support.api import Api, make_settings

DATE = "2026-01-05"


@pytest.fixture(params=["main", "bravo"])
def where(request) -> str:
    return request.param


def at(where: str, path: str) -> str:
    return path if where == "main" else f"/m/{where}{path}"


def ok(resp, status: int = 200) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    return resp.json()


class Served:
    """The app on one data folder, stopped and started again as a server is."""

    def __init__(self, data_dir: Path, file_cipher: str) -> None:
        self.data_dir, self.file_cipher = data_dir, file_cipher
        self.api = self.start()

    def start(self) -> Api:
        return Api(create_app(make_settings(self.data_dir, file_cipher=self.file_cipher)))

    def restart(self, between=lambda: None) -> None:
        self.api.close()
        between()
        self.api = self.start()


@pytest.fixture
def served(data_dir: Path, file_cipher: str):
    s = Served(data_dir, file_cipher)
    yield s
    s.api.close()


def setup(api: Api, where: str) -> dict:
    made = api.init()
    if where != "main":
        ok(api.post("/memories", made["token"], json={"name": where}), 201)
    return made


def put(api: Api, owner: str, where: str, texts: list[str]) -> None:
    ok(api.post(at(where, "/import"), owner, json={"entries": [{"date": DATE, "text": t} for t in texts]}))


def ask(api: Api, owner: str, where: str, words: str) -> list[int]:
    got = ok(api.post(at(where, "/recall"), owner, json={"words": words}))
    return [int(line.split(" ", 1)[0][1:]) for line in got["matches"]]


def test_a_fact_in_one_inflection_is_found_by_a_question_in_another(served: Served, where: str) -> None:
    api = served.api
    owner = setup(api, where)["token"]
    put(
        api,
        owner,
        where,
        [
            "Caroline: we're moving next month",
            "Caroline likes tea",
            "the movement grew",
            "Ayşe evlerimizden birini sattı",
            "Ayşe kahve içti",
            "evet dedi",
        ],
    )
    # English: "move" prefixes none of #0's words; its stem is that of "moving". Without stems #1, newer,
    # would come first (both hold "caroline" alone).
    assert ask(api, owner, where, "when did Caroline move?")[0] == 0
    assert ask(api, owner, where, "moved") == [0]  # not "movement": a stem is not a prefix
    # Turkish: "evi" (the house) and "evlerimizden" (from our houses) share the Turkish stem "ev".
    assert ask(api, owner, where, "Ayşe'nin evi ne zaman satıldı?")[0] == 3
    assert ask(api, owner, where, "EVİ") == [3]


def test_erasure_by_words_matches_prefixes_alone(served: Served, where: str) -> None:
    api = served.api
    owner = setup(api, where)["token"]
    put(api, owner, where, ["Caroline: we're moving next month", "she moved the desk"])
    assert ask(api, owner, where, "moved") == [1, 0]  # found by a stem, and by the word itself
    dry = ok(api.post("/memories/erase", owner, json={"words": "moved", "memories": [where], "dry_run": True}))
    assert dry["total"] == 1  # only the memory holding a word "moved" prefixes
    ok(api.post("/memories/erase", owner, json={"words": "moved", "memories": [where]}))
    assert ask(api, owner, where, "moving") == [0]  # the stem's memory kept


def test_an_erased_memorys_stems_are_found_by_nothing(served: Served, where: str) -> None:
    """600 memories: the first 512 are a piece the search keeps in
    recall.db, stems and all. The memory erased, neither its words nor its
    stems find it; with the server stopped and that recall.db of before
    the erasure put back, not after the start either."""
    api = served.api
    made = setup(api, where)
    owner = made["token"]
    texts = [f"filler note {i}" for i in range(600)]
    texts[5] = "Caroline: we're moving next month"
    texts[7] = "Ayşe evlerimizden birini sattı"
    put(api, owner, where, texts)
    assert ask(api, owner, where, "moved") == [5] and ask(api, owner, where, "evi") == [7]
    folder = served.data_dir / "users" / made["user_id"]
    db = folder / "recall.db" if where == "main" else folder / "m" / where / "recall.db"
    with sqlite3.connect(db) as conn:
        before = sorted(conn.execute("SELECT piece, seg, sealed FROM word_tail_segs"))
    assert before and {piece for piece, _, _ in before} == {0}  # the piece holding #5 and #7, kept
    kept = served.data_dir.parent / "kept"
    kept.mkdir()
    for name in ("recall.db", "recall.db-wal"):  # the file as it is, its WAL with it
        if (db.parent / name).exists():
            shutil.copyfile(db.parent / name, kept / name)
    ok(api.post(at(where, "/erase"), owner, json={"ids": [5, 7]}))

    def nothing_finds_them() -> None:
        for asked in ("moved", "moving", "move", "caroline", "evi", "ev", "evlerimizden", "ayşe"):
            assert ask(served.api, owner, where, asked) == [], asked
        assert len(ask(served.api, owner, where, "filler")) > 100  # the rest is searched

    nothing_finds_them()

    def put_back() -> None:
        for name in ("recall.db", "recall.db-wal", "recall.db-shm"):
            (db.parent / name).unlink(missing_ok=True)
            if (kept / name).exists():
                shutil.copyfile(kept / name, db.parent / name)
        with sqlite3.connect(db) as conn:  # what is put back holds the erased memories' piece
            assert sorted(conn.execute("SELECT piece, seg, sealed FROM word_tail_segs")) == before

    served.restart(put_back)
    nothing_finds_them()
    with sqlite3.connect(db) as conn:
        after = sorted(conn.execute("SELECT piece, seg, sealed FROM word_tail_segs"))
    assert after and not set(after) & set(before)  # the piece of before did not open: rebuilt without them
