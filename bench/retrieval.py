"""Retrieval quality of recall by words, against the regex a careful agent writes and a plain BM25.

Two generated lives, seeded, each in a real store (an identity minted by
:class:`stash.service.access.Vault`, memories appended as an import appends
them), searched through the service exactly as ``POST /recall`` searches:

* **A, keywords** — ``--memories`` (default 100,000) memories of a busy life:
  people (Turkish, German, French, Vietnamese, Nordic names), places and
  things, in templates that pair them all the time. Planted among them,
  ``--facts`` facts, each the only memory holding its (person, thing, place).
  Each fact is asked seven ways, as a user would type it: exact, cut to
  prefixes, in capitals, accents dropped, accents added where the memory has
  none, Turkish i's swapped (``i``/``ı``, ``I``/``İ``), words in another order.
  No misspelling: word search does not forgive one, so none is asked.
  Compared with two regexes an agent would send as ``q``: the words as typed,
  every order of them joined by ``.*`` (``as typed``), and the same with each
  letter a class of its accented forms (``careful``: ``a`` → ``[aàáâäãåā]``,
  ``ss`` → ``(?:ss|ß)``...; as many orders as fit the 512 bytes a pattern
  may have). A regex answer is newest first, so a fact's rank there is its
  place among the matches, newest first.
* **B, questions** — ``--chat`` (default 20,000) memories of a conversational
  life, with facts ("Priya moved the harbor review to Thursday because ...")
  asked as whole questions in other words than the memory's ("when did Priya
  move the harbor review?", "what happened to the harbor review Priya had?"):
  the four *original* forms. Each English fact is also asked *inflected*, in
  other forms of the memory's own words ("is Priya moving the harbor
  reviews?" for "Priya moved the harbor review"). Beside them, a Turkish part
  (a quarter as many memories, a third as many facts, seeded apart so the
  English part is the same life as before): facts such as "Ayşe
  toplantılarımızı erteledi çünkü oda doluydu" (Ayşe postponed our meetings),
  asked as written ("Ayşe toplantılarımızı ne zaman erteledi?") and
  inflected ("Ayşe toplantıyı ne zaman erteledi?", the meeting), among
  fillers where the same person did the same to another thing or another
  thing to the same one. Compared with a plain BM25 (k1 1.2, b 0.75,
  lower-cased ``\\w+`` tokens (``İ`` to ``i``), no prefixes, no folding) computed here over the
  same memories, and with the same BM25 over stems (each token counted as
  its English and its Turkish Snowball stem, two terms).

hit@k: the planted memory among the first k answers; hit@page: among the
answers of the first page (PART_CHARS = 20,000 bytes, the default).

    python bench/retrieval.py                # both lives, prints the tables
    python bench/retrieval.py --memories 20000 --facts 100   # quicker
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)

from stash.core.words import fold
from stash.crypto.keys import KdfParams
from stash.service.access import Vault

CHEAP = KdfParams(time_cost=1, memory_kib=8)  # the KDF is not what is measured
PART = 20_000

PEOPLE = [
    "Ayşe Yılmaz",
    "İlker Işık",
    "Priya Raman",
    "José Núñez",
    "Zoë Brontë",
    "François Lefèvre",
    "Jürgen Groß",
    "Nguyễn Thị Hương",
    "Søren Dahl",
    "Łukasz Wróbel",
    "Şule Çelik",
    "Ömer Doğan",
    "Chloé Gauthier",
    "Björn Åström",
    "Trần Văn Đức",
    "Elif Güneş",
    "Marta Kowalczyk",
    "Ines Müller",
    "Jon Banks",
    "Ana Lima",
    "Kemal Aydın",
    "Hélène Roux",
    "Dmitri Ivanov",
    "Mei Chen",
]
PLACES = [
    "İstanbul",
    "Kadıköy",
    "Café Noir",
    "Zürich",
    "Malmö",
    "Đà Nẵng",
    "Reykjavík",
    "São Paulo",
    "Kraków",
    "Gödel Hall",
    "Üsküdar",
    "Montréal",
    "Düsseldorf",
    "Hà Nội",
    "Ålesund",
    "Beşiktaş",
    "the office",
    "the harbor",
    "Lisbon",
    "Osaka",
    "Izmir",
    "Nice",
    "Genève",
    "Valparaíso",
]
THINGS = [
    "budget review",
    "harbor project",
    "contract renewal",
    "dentist appointment",
    "piano lesson",
    "tax filing",
    "server migration",
    "wedding plan",
    "visa interview",
    "roof repair",
    "book launch",
    "quarterly report",
    "design sprint",
    "hiring panel",
    "lease signing",
    "vaccine shot",
    "marathon training",
    "garden party",
    "database upgrade",
    "pitch deck",
    "school visit",
    "insurance claim",
    "kitchen remodel",
    "conference talk",
]
VERBS = [
    "moved",
    "cancelled",
    "approved",
    "postponed",
    "booked",
    "signed",
    "rescheduled",
    "discussed",
    "finished",
    "started",
    "reviewed",
    "planned",
]
FILL = (
    "and then after because we said that it was fine today tomorrow again later with about for the a of "
    "to in on at by also maybe should could really quick note remember"
).split()
WHEN = [
    "on Monday",
    "on Friday",
    "next week",
    "at noon",
    "in March",
    "before lunch",
    "after the call",
    "for the third time",
    "with little notice",
    "as agreed",
]


def first_name(person: str) -> str:
    return person.split()[0]


def main_word(thing: str) -> str:
    return thing.split()[0]


# ---------------------------------------------------------------- life A: keywords


def life_a(n: int, facts: int, rng: random.Random) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The memories, and per fact its position and its three words."""
    plan = set()
    while len(plan) < facts:
        plan.add((rng.randrange(len(PEOPLE)), rng.randrange(len(THINGS)), rng.randrange(len(PLACES))))
    chosen = sorted(plan)
    rng.shuffle(chosen)
    slots = sorted(rng.sample(range(n // 10, n), facts))
    triples = {(p, t, pl) for p, t, pl in chosen}
    texts: list[str] = []
    planted: list[tuple[int, list[str]]] = []
    by_slot = dict(zip(slots, chosen))
    for i in range(n):
        if i in by_slot:
            p, t, pl = by_slot[i]
            person, thing, place = PEOPLE[p], THINGS[t], PLACES[pl]
            texts.append(f"{person} {rng.choice(VERBS)} the {thing} in {place} {rng.choice(WHEN)}")
            planted.append((i, [first_name(person), main_word(thing), place.split()[-1]]))
            continue
        while True:  # a filler pairs two of the three, never all three of a fact
            p, t, pl = rng.randrange(len(PEOPLE)), rng.randrange(len(THINGS)), rng.randrange(len(PLACES))
            if (p, t, pl) not in triples:
                break
        shape = rng.randrange(4)
        fill = " ".join(rng.choices(FILL, k=rng.randint(2, 8)))
        if shape == 0:
            texts.append(f"{PEOPLE[p]} {rng.choice(VERBS)} the {THINGS[t]} {fill} in {PLACES[pl]}")
        elif shape == 1:
            texts.append(f"{fill} {PEOPLE[p]} {rng.choice(VERBS)} the {THINGS[t]} {rng.choice(WHEN)}")
        elif shape == 2:
            texts.append(f"met {PEOPLE[p]} in {PLACES[pl]} {fill}")
        else:
            texts.append(f"the {THINGS[t]} in {PLACES[pl]} was {rng.choice(VERBS)} {fill}")
    return texts, planted


_ACCENT = {"a": "á", "e": "é", "i": "í", "o": "ó", "u": "ú", "c": "ç", "s": "ş", "n": "ñ"}


def asked(words: list[str], way: str, rng: random.Random) -> list[str]:
    """The fact's words as a user would type them, one way."""
    if way == "exact":
        return list(words)
    if way == "prefix":
        return [w[: max(3, len(w) - 3)] for w in words]
    if way == "capitals":
        return [w.upper() for w in words]
    if way == "no accents":
        return [fold(w) for w in words]
    if way == "accents added":  # on the words the memory writes without any
        return [
            "".join(_ACCENT.get(c, c) if k == 1 else c for k, c in enumerate(w)) if fold(w) == w.lower() else w
            for w in words
        ]
    if way == "turkish i":
        return [
            w.replace("i", "ı").replace("I", "İ").replace("İ", "I", 1) if "i" in w.lower() else w.upper() for w in words
        ]
    if way == "reordered":
        return list(reversed(words))
    raise ValueError(way)


WAYS = ("exact", "prefix", "capitals", "no accents", "accents added", "turkish i", "reordered")
_CLASS = {
    "a": "aàáâäãåāă",
    "c": "cçćč",
    "e": "eèéêëēėęě",
    "i": "iìíîïīįı",
    "o": "oòóôõöøō",
    "u": "uùúûüūůư",
    "s": "sśšş",
    "g": "gğ",
    "n": "nñń",
    "z": "zźżž",
    "y": "yýÿ",
    "l": "lł",
    "d": "dđ",
}


def regex_typed(words: list[str]) -> str:
    return "|".join(".*".join(re.escape(w) for w in order) for order in itertools.permutations(words))


def regex_careful(words: list[str]) -> str:
    def word(w: str) -> str:
        out = []
        for c in fold(w):
            if c in _CLASS:
                out.append(f"[{_CLASS[c]}]")
            else:
                out.append(re.escape(c))
        return "".join(out).replace("ss", "(?:ss|ß)")

    # Every order of the words as long as the pattern stays within the 512 bytes a pattern may have
    # (the typed order first): three words with their classes rarely fit in more than two orders.
    out: list[str] = []
    for order in itertools.permutations(words):
        alt = ".*".join(word(w) for w in order)
        if len("|".join([*out, alt]).encode()) > 512:
            break
        out.append(alt)
    return "|".join(out)


# ---------------------------------------------------------------- life B: questions


OBJECTS = [
    "harbor review",
    "budget meeting",
    "dentist visit",
    "flight to Lisbon",
    "team offsite",
    "code freeze",
    "board meeting",
    "piano recital",
    "apartment viewing",
    "launch party",
    "job interview",
    "tax audit",
    "vet appointment",
    "design review",
    "sales call",
    "hackathon",
    "family dinner",
    "release candidate",
]
# (past in the memory, base in a question, a paraphrase's verb)
# (past in the memory, base in a question, a paraphrase's verb, the -ing form of an inflected question)
ACTS = [
    ("moved", "move", "reschedule", "moving"),
    ("cancelled", "cancel", "call off", "cancelling"),
    ("booked", "book", "reserve", "booking"),
    ("postponed", "postpone", "push back", "postponing"),
    ("lost", "lose", "lose", "losing"),
    ("approved", "approve", "sign off", "approving"),
    ("started", "start", "kick off", "starting"),
    ("finished", "finish", "wrap up", "finishing"),
]
# Each object of OBJECTS with its noun in the plural, for an inflected question.
PLURALS = [
    "harbor reviews",
    "budget meetings",
    "dentist visits",
    "flights to Lisbon",
    "team offsites",
    "code freezes",
    "board meetings",
    "piano recitals",
    "apartment viewings",
    "launch parties",
    "job interviews",
    "tax audits",
    "vet appointments",
    "design reviews",
    "sales calls",
    "hackathons",
    "family dinners",
    "release candidates",
]
REASONS = [
    "because the client asked for more time",
    "since the room was taken",
    "after the storm",
    "as the budget was cut",
    "because she was sick",
    "to fit the new roadmap",
    "after a long talk",
    "because the flights were full",
]
CHAT = (
    "I think we should talk about it later, honestly it was a long day and everyone was tired. "
    "She said the weather was nice and we had coffee. He asked what we did last week and when. "
    "We did not decide anything yet. Did you see the news? It is what it is. The team had lunch. "
    "What a week. When is the next one? They did well."
).split()


def life_b(n: int, facts: int, rng: random.Random) -> tuple[list[str], list[tuple[int, list[str]]]]:
    names = [first_name(p) for p in PEOPLE]
    plan = set()
    while len(plan) < facts:
        plan.add((rng.randrange(len(names)), rng.randrange(len(OBJECTS)), rng.randrange(len(ACTS))))
    chosen = sorted(plan)
    rng.shuffle(chosen)
    slots = dict(zip(sorted(rng.sample(range(n // 10, n), facts)), chosen))
    acts: dict[tuple[int, int], set[int]] = defaultdict(set)  # a fact's pair, in fillers only with other acts
    for a, b, c in chosen:
        acts[(a, b)].add(c)
    texts: list[str] = []
    planted: list[tuple[int, list[str]]] = []
    for i in range(n):
        if i in slots:
            a, b, c = slots[i]
            who, what, (past, base, para, ing) = names[a], OBJECTS[b], ACTS[c]
            texts.append(f"{who} {past} the {what} {rng.choice(REASONS)}")
            planted.append(
                (
                    i,
                    [
                        f"When did {who} {base} the {what}?",
                        f"what happened to the {what} {who} had?",
                        f"did {who} {para} the {what}",
                        f"{who.lower()} {what} {base}?",
                        f"is {who} {ing} the {PLURALS[b]}?",
                    ],
                )
            )
            continue
        chat = " ".join(rng.choices(CHAT, k=rng.randint(6, 16)))
        a, b, c = rng.randrange(len(names)), rng.randrange(len(OBJECTS)), rng.randrange(len(ACTS))
        shape = rng.randrange(3)
        if shape == 0 and c not in acts.get((a, b), ()):
            texts.append(f"{names[a]} {ACTS[c][0]} the {OBJECTS[b]} {chat}")
        elif shape == 1:
            texts.append(f"{names[a]}: {chat}")
        else:
            texts.append(f"the {OBJECTS[b]} {chat}")
    return texts, planted


TR_NAMES = ["Ayşe", "İlker", "Şule", "Ömer", "Elif", "Kemal", "Zeynep", "Mehmet", "Deniz", "Emre", "Gül", "Burak"]
# (in a fact: our ... as an object; in an inflected question: the ... as an object; in fillers: in the ...),
# each row's words of one Turkish Snowball stem, none a prefix of the fact's.
TR_NOUNS = [
    ("toplantılarımızı", "toplantıyı", "toplantıda"),
    ("sözleşmelerimizi", "sözleşmeyi", "sözleşmede"),
    ("raporlarımızı", "raporu", "raporda"),
    ("bütçelerimizi", "bütçeyi", "bütçede"),
    ("randevularımızı", "randevusunu", "randevuda"),
    ("uçuşlarımızı", "uçuşu", "uçuşta"),
    ("tatillerimizi", "tatili", "tatilde"),
    ("projelerimizi", "projeyi", "projede"),
    ("sınavlarımızı", "sınavı", "sınavda"),
    ("ziyaretlerimizi", "ziyareti", "ziyarette"),
    ("görüşmelerimizi", "görüşmeyi", "görüşmede"),
    ("faturalarımızı", "faturayı", "faturada"),
    ("siparişlerimizi", "siparişi", "siparişte"),
    ("kongrelerimizi", "kongreyi", "kongrede"),
    ("seyahatlerimizi", "seyahati", "seyahatte"),
]
TR_ACTS = ["erteledi", "iptal etti", "onayladı", "bitirdi", "başlattı", "taşıdı", "planladı", "imzaladı"]
TR_REASONS = [
    "çünkü müşteri daha fazla zaman istedi",
    "çünkü oda doluydu",
    "fırtınadan sonra",
    "para kesildiği için",
    "hasta olduğu için",
    "yeni plana uymak için",
    "uzun bir konuşmadan sonra",
]
TR_CHAT = (
    "bence bunu sonra konuşalım dürüst olmak gerekirse uzun bir gündü ve herkes yorgundu hava güzeldi "
    "ve kahve içtik geçen hafta ne yaptığımızı sordu henüz bir şey karar vermedik haberleri gördün mü "
    "ekip öğle yemeği yedi ne hafta ama bir sonraki ne zaman iyi iş çıkardılar"
).split()


def life_b_turkish(n: int, facts: int, first: int, rng: random.Random) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The Turkish part of life B, its memories numbered from ``first``: per
    fact its position and its questions, as written and inflected."""
    plan = set()
    while len(plan) < facts:
        plan.add((rng.randrange(len(TR_NAMES)), rng.randrange(len(TR_NOUNS)), rng.randrange(len(TR_ACTS))))
    chosen = sorted(plan)
    rng.shuffle(chosen)
    slots = dict(zip(sorted(rng.sample(range(n // 10, n), facts)), chosen))
    texts: list[str] = []
    planted: list[tuple[int, list[str]]] = []
    for i in range(n):
        if i in slots:
            a, b, c = slots[i]
            who, (ours, the, _), act = TR_NAMES[a], TR_NOUNS[b], TR_ACTS[c]
            texts.append(f"{who} {ours} {act} {rng.choice(TR_REASONS)}")
            planted.append((first + i, [f"{who} {ours} ne zaman {act}?", f"{who} {the} ne zaman {act}?"]))
            continue
        chat = " ".join(rng.choices(TR_CHAT, k=rng.randint(6, 16)))
        while True:  # a filler never holds all three of a fact
            a, b, c = rng.randrange(len(TR_NAMES)), rng.randrange(len(TR_NOUNS)), rng.randrange(len(TR_ACTS))
            if (a, b, c) not in plan:
                break
        shape = rng.randrange(4)
        if shape == 0:
            texts.append(f"{TR_NAMES[a]} {TR_NOUNS[b][0]} {TR_ACTS[c]} {chat}")
        elif shape == 1:
            texts.append(f"{TR_NAMES[a]} {TR_NOUNS[b][2]} {chat}")
        elif shape == 2:
            texts.append(f"{TR_NAMES[a]}: {chat}")
        else:
            texts.append(f"{TR_NOUNS[b][2]} {chat}")
    return texts, planted


def _lower(word: str) -> str:
    return word.lower().replace("i\u0307", "i")  # İ lowercases to i + a combining dot: the dot dropped


class BM25:
    """Okapi BM25 (k1 1.2, b 0.75) over lower-cased \\w+ tokens: no prefixes, no folding. Plain, or with
    ``stems``: each token counted as two terms, its English and its Turkish Snowball stem."""

    def __init__(self, texts: list[str], stems: bool = False) -> None:
        self.stems = stems
        if stems:
            import Stemmer  # PyStemmer: the Snowball stemmers word search uses

            self.en, self.tr = Stemmer.Stemmer("english"), Stemmer.Stemmer("turkish")
        self.docs = [self.terms(t) for t in texts]
        self.avg = sum(map(len, self.docs)) / len(self.docs)
        self.post: dict[str, dict[int, int]] = defaultdict(dict)
        for i, d in enumerate(self.docs):
            for w, tf in Counter(d).items():
                self.post[w][i] = tf

    def terms(self, text: str) -> list[str]:
        tokens = re.findall(r"\w+", _lower(text))
        if not self.stems:
            return tokens
        return [t for w in tokens for t in ("en " + self.en.stemWord(w), "tr " + self.tr.stemWord(w))]

    def top(self, query: str, k: int) -> list[int]:
        n = len(self.docs)
        scores: dict[int, float] = defaultdict(float)
        for w in set(self.terms(query)):
            post = self.post.get(w, {})
            idf = math.log(1 + (n - len(post) + 0.5) / (len(post) + 0.5))
            for i, tf in post.items():
                dl = len(self.docs[i])
                scores[i] += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / self.avg))
        return [i for i, _ in sorted(scores.items(), key=lambda x: (-x[1], -x[0]))[:k]]


# ---------------------------------------------------------------- running


def store(folder: Path, texts: list[str]):
    vault = Vault(folder, CHEAP)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        for k in range(0, len(texts), 10_000):
            s.open_memory().mf.append([("2024-01-02", t) for t in texts[k : k + 10_000]])
        s.open_memory().mf.bulk_loaded()
    return vault, ident.token


def ids(lines: list[str]) -> list[int]:
    return [int(line.split(" ", 1)[0][1:]) for line in lines]


def rank_of(found: list[int], want: int) -> int | None:
    return found.index(want) + 1 if want in found else None


def table(title: str, rows: dict[str, list[int | None]], ks: tuple[str, ...]) -> None:
    print(f"\n{title}\n")
    print("| asked | " + " | ".join(ks) + " | n |")
    print("|---|" + "---|" * (len(ks) + 1))
    for name, ranks in rows.items():
        cells = []
        for k in ks:
            if k == "hit@page":
                hit = sum(1 for r in ranks if r is not None)
            else:
                lim = int(k.split("@")[1])
                hit = sum(1 for r in ranks if r is not None and r <= lim)
            cells.append(f"{100 * hit / len(ranks):.1f} %")
        print(f"| {name} | " + " | ".join(cells) + f" | {len(ranks)} |")


def run_a(n: int, facts: int, seed: int, tmp: Path) -> None:
    rng = random.Random(seed)
    texts, planted = life_a(n, facts, rng)
    t0 = time.perf_counter()
    vault, token = store(tmp / "a", texts)
    print(f"life A: {n} memories, {facts} facts, stored in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows: dict[str, list[int | None]] = defaultdict(list)
    times: list[float] = []
    with vault.session(token, "read") as s:
        for i, words in planted:
            for way in WAYS:
                typed = asked(words, way, rng)
                t = time.perf_counter()
                page = ids(s.open_memory().recall_words(" ".join(typed))["matches"])
                times.append(time.perf_counter() - t)
                rows[f"words, {way}"].append(rank_of(page, i))
                for kind, regex in (("regex as typed", regex_typed(typed)), ("careful regex", regex_careful(typed))):
                    newest_first = ids(s.open_memory().recall(regex)["matches"])[::-1]
                    rows[f"{kind}, {way}"].append(rank_of(newest_first, i))
    summary: dict[str, list[int | None]] = {}
    for kind in ("words", "regex as typed", "careful regex"):
        summary[f"{kind}, all ways"] = [r for name, rs in rows.items() if name.startswith(kind + ",") for r in rs]
    table(
        f"Life A: {n:,} memories, {facts} planted facts, each asked {len(WAYS)} ways "
        f"(words: median {sorted(times)[len(times) // 2] * 1000:.0f} ms a query)",
        {**summary, **dict(sorted(rows.items()))},
        ("hit@1", "hit@5", "hit@page"),
    )


B_FORMS = ("original form 1", "original form 2", "original form 3", "original form 4", "inflected, English")
B_TURKISH = ("Turkish, as written", "inflected, Turkish")


def run_b(n: int, facts: int, seed: int, tmp: Path) -> None:
    rng = random.Random(seed + 1)
    texts, planted = life_b(n, facts, rng)
    more, turkish = life_b_turkish(n // 4, facts // 3, len(texts), random.Random(seed + 2))
    texts += more
    vault, token = store(tmp / "b", texts)
    rankers = {"plain BM25": BM25(texts), "stemmed BM25": BM25(texts, stems=True)}
    print(f"life B: {len(texts)} memories, {facts} + {len(turkish)} facts", file=sys.stderr)
    rows: dict[str, list[int | None]] = defaultdict(list)
    with vault.session(token, "read") as s:
        for forms, facts_of in ((B_FORMS, planted), (B_TURKISH, turkish)):
            for i, questions in facts_of:
                for form, q in zip(forms, questions):
                    got = {"words": ids(s.open_memory().recall_words(q)["matches"])[:10]}
                    got.update({name: bm25.top(q, 10) for name, bm25 in rankers.items()})
                    for name, found in got.items():
                        if form.startswith("original"):
                            rows[f"{name}, original (forms 1-4)"].append(rank_of(found, i))
                        rows[f"{name}, {form}"].append(rank_of(found, i))
    order = ["original (forms 1-4)", *B_FORMS, *B_TURKISH]
    table(
        f"Life B: {len(texts):,} conversational memories ({len(more):,} in Turkish), {facts} English facts "
        f"asked as whole questions (4 original forms and 1 inflected) and {len(turkish)} Turkish ones "
        "(as written and inflected)",
        {f"{name}, {form}": rows[f"{name}, {form}"] for form in order for name in ("words", *rankers)},
        ("hit@1", "hit@5", "hit@10"),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--memories", type=int, default=100_000)
    p.add_argument("--facts", type=int, default=200)
    p.add_argument("--chat", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=29)
    p.add_argument("--only", choices=("a", "b"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stash-retrieval-") as tmp:
        if args.only != "b":
            run_a(args.memories, args.facts, args.seed, Path(tmp))
        if args.only != "a":
            run_b(args.chat, args.facts, args.seed, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
