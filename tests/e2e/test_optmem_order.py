"""OptMem's order rule (docs/DESIGN.md, "Nap"): memo's nap prompt is a byte
prefix of ours, up to and including the ``Run: `` of its command — the
command itself is each surface's own — and every command any surface hands
over is an order on a line of its own (``Run: …``, ``Call: …`` for MCP),
never inside a sentence; the batch offer comes after the nap's own order.

memo's prompt comes from bench/memo_standin.py, which writes it as OptMem's
``memo`` does, over the OptMem folder ``GET /export`` writes of the same
memory; it is checked on a block of raw memories with none, one and many
compressions remaining, and on a block compressed from two summaries."""

from __future__ import annotations

import importlib.util
import io
import re
import tarfile
from pathlib import Path

import pytest

from stash import client
from stash.tools.render import ToolCalls
from tests.support.docs.printed import DELIMITER
from tests.support.server import REPO, Http


def _standin():
    spec = importlib.util.spec_from_file_location("memo_standin", REPO / "bench" / "memo_standin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MEMO = _standin()
COMMAND = re.compile(r"curl |\bstash |\bnap\(|\bwake\(|\bnote\(|\brecall\(|\bzoom\(")


def memo_prompt(http: Http, token: str, tmp_path: Path) -> str:
    archive = http.get("/export", token).content
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return MEMO.nap_prompt(MEMO.Folder(str(tmp_path / "memory")))


def assert_orders_stand_alone(text: str, lead: str) -> None:
    """Every command is an order on its own line: outside the memory lines
    (indented data) and the lines a here-document sends, nothing but an
    order names a command, and ``Run:``/``Call:`` only ever starts a line."""
    inside = False
    for line in text.splitlines():
        if inside:
            inside = line != DELIMITER
            continue
        if line.startswith("  #"):
            continue
        if line.startswith(lead):
            inside = line.endswith(f"<<'{DELIMITER}'")
            continue
        assert "Run:" not in line and "Call:" not in line, line
        assert not COMMAND.search(line), f"a command inside a sentence: {line}"


@pytest.mark.parametrize("memories,settle", [(2, 0), (4, 1), (40, 0), (40, 60)])
def test_memos_nap_prompt_is_a_prefix_of_ours(
    memories: int, settle: int, http: Http, token: str, base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    http.ok(
        "POST",
        "/import",
        token,
        json={"entries": [{"date": "2024-01-02", "text": f'memory {i} it\'s "quoted" ü'} for i in range(memories)]},
    )
    for _ in range(settle):  # single naps up to the block of 32 raw memories, then its two summaries
        nap = http.ok("POST", "/nap", token, json={})["nap"]
        if nap["block"] == "0-31":
            break
        http.ok("POST", "/nap", token, json={"block": nap["block"], "text": f"summary of {nap['block']}"})
    theirs = memo_prompt(http, token, tmp_path)
    body = theirs[: theirs.index("\nRun: ") + 1]
    nap = http.ok("POST", "/nap", token, json={})["nap"]
    assert theirs.startswith(f"Compress memories #{nap['block']} ")
    assert settle < 60 or (
        nap["block"] == "0-31" and nap["source"] == ["#0-15 summary of 0-15", "#16-31 summary of 16-31"]
    )

    text = http.send(
        "POST", base_url + "/nap", {"Authorization": f"Bearer {token}", "Accept": "text/plain"}, json={}
    ).text
    monkeypatch.setattr(client, "_prog", lambda: "stash")
    shell = "\n".join(client.nap_lines(client.Stash(base_url, token)))
    mcp = "\n".join(client.nap_lines(client.Stash(base_url, token), steps=ToolCalls()))
    for ours, lead in ((nap["prompt"], "Run: "), (text, "Run: "), (shell, "Run: "), (mcp, "Call: ")):
        prefix = body + lead  # memo's, with its order's lead
        assert ours.startswith(prefix), (prefix, ours)
        assert_orders_stand_alone(ours, lead)
        # The nap's own order comes first; the batch offer, when there is one, after it as an order too.
        first = ours[len(prefix) - len(lead) :].split("\n", 1)[0]
        assert " nap " in first or "/nap" in first or first.startswith("Call: nap(block="), ours
        if nap["remaining"]:
            assert ours.count("\n" + lead) == 2 and "batch" in ours.rsplit("\n" + lead, 1)[1], ours
        else:
            assert ours.count("\n" + lead) == 1, ours


def test_every_answer_that_hands_over_a_step_keeps_the_order_rule(
    http: Http, token: str, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wake parts, the empty wake, the refused wake, recall pages, batches:
    in the server's text answers, and as the client and MCP render them."""
    monkeypatch.setattr(client, "_prog", lambda: "stash")
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/plain"}
    texts = [http.send("GET", base_url + "/wake", headers).text]
    mem = client.Stash(base_url, token)
    shell, mcp = client.SHELL, ToolCalls()
    rendered = [
        ("\n".join(client.wake_lines(mem, steps=steps)), lead) for steps, lead in ((shell, "Run: "), (mcp, "Call: "))
    ]
    http.ok("POST", "/import", token, json={"entries": [{"date": "2024-01-02", "text": f"m{i}"} for i in range(40)]})
    http.ok("POST", "/config", token, json={"WAKE_LINES": 4, "PART_CHARS": 60})
    refused = http.send("GET", base_url + "/wake", headers)
    assert refused.status_code == 409 and refused.headers["stash-error"] == "wake.needs_nap"
    texts += [
        refused.text,
        http.send("POST", base_url + "/nap", headers, json={"batch": 4}).text,
        http.send("POST", base_url + "/recall", headers, json={"q": "m"}).text,
    ]
    for steps, lead in ((shell, "Run: "), (mcp, "Call: ")):
        with pytest.raises(client.StashError) as refusal:
            client.wake_lines(mem, steps=steps)
        failed = client.refused(refusal.value, steps)
        rendered.append((failed.message + "\n\n" + (failed.extra or ""), lead))
        rendered += [
            ("\n".join(client.batch_lines(mem, 4, steps)), lead),
            ("\n".join(client.recall_lines(mem, "m", steps=steps)), lead),
        ]
    http.ok("POST", "/config", token, json={"WAKE_LINES": None, "PART_LINES": 3})
    while http.ok("POST", "/nap", token, json={})["nap"]:
        due = http.ok("POST", "/nap", token, json={})["nap"]["block"]
        http.ok("POST", "/nap", token, json={"block": due, "text": "s"})
    texts.append(http.send("GET", base_url + "/wake", headers).text)
    rendered += [
        ("\n".join(client.wake_lines(mem, steps=shell)), "Run: "),
        ("\n".join(client.wake_lines(mem, steps=mcp)), "Call: "),
    ]
    for text in texts:
        assert "Run: " in text, text
        assert_orders_stand_alone(text, "Run: ")
    for text, lead in rendered:
        assert lead in text, text
        assert_orders_stand_alone(text, lead)
