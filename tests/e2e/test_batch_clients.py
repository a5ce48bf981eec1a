"""Batch naps through the ``stash`` client and ``stash mcp``, against a real
server: each follows only what it printed — the batch the nap prompt offers,
then the one command (or tool call) that answers the whole batch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.docs.printed import orders, tail_command
from tests.support.mcp.session import Session, run_session
from tests.support.server import Cli, Http

pytestmark = pytest.mark.slow


def test_the_client_takes_a_batch_as_the_prompt_says(cli: Cli, http: Http, token: str) -> None:
    entries = [{"date": "2024-05-06", "text": f"m{i} ü"} for i in range(40)]
    http.ok("POST", "/import", token, json={"entries": entries})
    due = cli.ok("nap")
    # The batch offer is an order of its own, after the nap's.
    offer = re.fullmatch(r"\S.* nap --batch (\d+)", orders(due)[1])
    assert offer, due
    assert due.splitlines()[-2].startswith("Or write ") and due.splitlines()[-1] == "Run: " + offer.group(0)
    listed = cli.shell(offer.group(0))
    assert listed.returncode == 0, listed.stderr
    blocks = re.findall(r"^#(\d+-\d+):$", listed.stdout, re.M)
    assert blocks == [b["block"] for b in http.ok("POST", "/nap", token, json={"batch": int(offer.group(1))})["batch"]]
    command = tail_command(listed.stdout)
    assert "<<'STASH_END'" in command and command.endswith("\nSTASH_END")
    for b in blocks:
        command = command.replace(f"<your line for {b}>", f"sum {b} — ünï")
    assert "<" not in command.replace("<<'STASH_END'", "")
    done = cli.shell(command)
    assert done.returncode == 0, (command, done.stderr)
    assert done.stdout.startswith(f"{len(blocks)} summaries saved.")
    for b in blocks[:3]:
        lo, last = map(int, b.split("-"))
        size = last + 1 - lo
        parent = lo - lo % (2 * size)
        zoomed = http.ok("POST", "/zoom", token, json={"block": f"{parent}-{parent + 2 * size - 1}"})
        assert f"#{b} sum {b} — ünï" in zoomed["lines"]


def test_the_client_refuses_a_bad_summaries_file_and_sends_nothing(
    cli: Cli, http: Http, token: str, tmp_path: Path
) -> None:
    http.ok("POST", "/import", token, json={"entries": [{"date": "2024-05-06", "text": f"m{i}"} for i in range(8)]})
    bad = tmp_path / "s.txt"
    bad.write_text("0-1 fine\nnot a block line\n", encoding="utf-8")
    res = cli.run("nap", "--summaries", str(bad))
    assert res.returncode == 2 and "line 2" in res.stderr and "Traceback" not in res.stderr
    assert http.ok("POST", "/nap", token, json={})["nap"]["block"] == "0-1"
    wrong = tmp_path / "w.txt"
    wrong.write_text("0-1 fine\n4-5 out of order\n", encoding="utf-8")
    res = cli.run("nap", "--summaries", str(wrong))
    assert res.returncode == 1 and "2-3" in res.stderr
    assert http.ok("POST", "/nap", token, json={})["nap"]["block"] == "0-1"


def test_mcp_takes_a_batch_as_the_prompt_names_it(base_url: str, http: Http, token: str, tmp_path: Path) -> None:
    http.ok("POST", "/import", token, json={"entries": [{"date": "2024-05-06", "text": f"m{i}"} for i in range(20)]})

    async def script(s: Session) -> None:
        due = await s.ok("nap")
        offer = re.fullmatch(r"nap\(batch=(\d+)\)", orders(due, "Call: ")[1])
        assert offer, due
        listed = await s.ok("nap", batch=int(offer.group(1)))
        m = re.search(r"Call: nap\(summaries=(\[.*\])\)$", listed)
        assert m, listed
        args = json.loads(m.group(1))
        for item in args:
            item["text"] = item["text"].replace(f"<your line for {item['block']}>", f"mcp {item['block']}")
        saved = await s.ok("nap", summaries=args)
        assert saved.startswith(f"{len(args)} summaries saved.")
        assert http.ok("POST", "/zoom", token, json={"block": "0-3"})["lines"] == ["#0-1 mcp 0-1", "#2-3 mcp 2-3"]
        text, error = await s.call("nap", batch=2, block="0-1")
        assert error and "one of" in text

    run_session(base_url, token, tmp_path / "mcp.log", script)
