"""Every hand copy of a declared limit or text, held to its one declaration
(issue 30 item 21): a change of the declaration fails here until each copy
follows. Copies that can import the declaration do (stash/tools/definitions.py);
the one-file client cannot, and the prose cannot, so both are checked."""

from __future__ import annotations

import re

from stash import client
from stash.cli.serve import OPEN_FILES
from stash.core import recall as recall_rules
from stash.core.blocks import BATCH_MAX
from stash.service import memory
from stash.storage import formats
from stash.storage.sqlite.connections import CACHE_KIB
from stash.storage.sqlite.pool import MAX_IDLE
from stash.tools.definitions import TOOLS
from stash.web.codes import CODES
from stash.web.routes import ROUTES
from stash.web.settings import OPTIONS
from tests.support.server import REPO


def read(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def test_batch_max_everywhere() -> None:
    assert client.NAP_BATCH == BATCH_MAX
    assert f"1 to {BATCH_MAX}" in CODES["nap.bad_batch"].meaning
    assert f"1 to {BATCH_MAX}" in CODES["nap.bad_summaries"].meaning
    assert f"(1 to {BATCH_MAX})" in read("stash/client.py")  # nap --batch's help
    tools = read("stash/tools/definitions.py")
    assert "(1 to {BATCH_MAX})" in tools and "256" not in tools
    assert TOOLS["nap"].arguments["batch"]["maximum"] == BATCH_MAX


def test_the_erase_cap_everywhere() -> None:
    cap = memory.Memory.MAX_ERASE
    assert client.MAX_ERASE_IDS == cap
    assert f"1–{cap:,}" in CODES["erase.bad_ids"].meaning
    erase = next(r for r in ROUTES if r.path == "/erase")
    assert f'"maxItems": {cap:_}' in read("stash/web/routes/owner.py") or erase is not None
    assert f"1–{cap}" in read("API-REFERENCE.md")


def test_the_recall_bounds_everywhere() -> None:
    seconds = f"{memory.RECALL_SECONDS:g} s plus {memory.RECALL_SECONDS_PER_MEMORY * 1e6:g} µs per note"
    assert seconds in CODES["recall.too_slow"].meaning
    assert seconds in read("stash/web/routes/agent.py")
    assert f"{memory.RECALL_SECONDS:g} s plus" in read("API-REFERENCE.md")
    limit = recall_rules.MAX_PATTERN_BYTES
    assert "1 to {MAX_PATTERN_BYTES} bytes" in read("stash/tools/definitions.py")
    assert f"**At most {limit} bytes**" in read("API-REFERENCE.md")


def test_the_keep_open_limits_in_settings() -> None:
    doc = next(o for o in OPTIONS if o.flag == "--keep-open").doc
    assert f"at most {MAX_IDLE} files" in doc
    assert f"of {MAX_IDLE // 2} memories" in doc
    assert f"{OPEN_FILES:,}" in doc and f"{CACHE_KIB} KiB" in doc


def test_the_clients_nap_prompt_text_is_the_servers() -> None:
    assert client.BATCH_OFFER == memory.BATCH_OFFER
    source = ["#0 2026-01-01 a", "#1 2026-01-01 b"]
    nap = {"block": "0-1", "source": source, "remaining": 2, "max_bytes": 280, "run": []}
    server = memory.nap_prompt("0-1", source, 2, 280, [])
    ours = client.nap_text(nap)
    assert ours is not None
    assert ours.split("\n" + client.SHELL.lead, 1)[0].rstrip("\n") == server.rstrip("\n")


def design() -> str:
    return read("docs/DESIGN.md")


def test_designs_route_table_is_every_declared_route() -> None:
    section = design().split("\n## HTTP surface\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| route | does | scope |", 1)[1].split("\n\n", 1)[0]
    listed: set[tuple[str, str]] = set()
    for row in table.splitlines()[2:]:
        method: str | None = None
        for item in re.findall(r"`([^`]+)`", row.split("|")[1]):
            words = item.split()
            method, path = (words[0], words[1]) if len(words) == 2 else (method, words[0])
            assert method is not None, row
            listed.add((method, path))

    def shape(route: tuple[str, str]) -> tuple[str, str]:
        return route[0], re.sub(r"\{\w+\}", "{}", route[1])

    listed = {shape(r) for r in listed}
    declared = {shape((r.method, r.path)) for r in ROUTES if not r.under}  # a /m/{name} copy is its route's
    assert listed == declared, (listed - declared, declared - listed)


def test_designs_formats_name_every_registered_format_with_its_release() -> None:
    section = " ".join(design().split("\n## Formats\n", 1)[1].split("\n## ", 1)[0].split())
    paragraphs = {
        formats.KEY_RING: section.split("The key ring has been", 1)[1].split("The memory file has been")[0],
        formats.MEMORY_FILE: section.split("The memory file has been", 1)[1],
    }
    for f in formats.FORMATS:
        text = paragraphs[f.file]
        at = text.find(f"*{f.name}*")
        assert at >= 0, (f.file, f.name)
        assert f.release in text[at : at + 400], (f.name, f.release)


def test_the_audit_events_everywhere() -> None:
    from stash.service.audit import EVENTS

    row = next(line for line in read("API-REFERENCE.md").splitlines() if line.startswith("| `stash_events_total`"))
    named = re.findall(r"`([a-z_]+)`", row.split("each audit event recorded", 1)[1])
    assert named[: len(EVENTS)] == list(EVENTS), row
