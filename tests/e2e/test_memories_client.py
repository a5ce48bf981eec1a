"""Memories end to end, real server and client: the owner makes a memory and
mints capabilities bound to it with ``stash``; an agent whose STASH_URL ends
in /m/{name} runs its AGENTS.md block and the client unchanged; a reporter
with an append capability notes with curl and reads nothing."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.support.server import Cli, Http

# The client as a user installs it (GET /client); its package form runs the same code.
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("cli", ["file"], indirect=True)]


def _agent(cli: Cli, url: str, tok: str) -> Cli:
    return Cli(cli.argv0, {**cli.env, "STASH_URL": url, "STASH_TOKEN": tok})


def test_an_agent_bound_to_a_memory_runs_everything_unchanged(cli: Cli, http: Http, token: str, tmp_path) -> None:
    base = cli.env["STASH_URL"].rstrip("/")
    assert "STASH_URL=" in cli.ok("memories", "create", "proj")
    out = cli.ok("grants", "full", "--memory", "proj")
    assert "bound to memory proj" in out
    agent = _agent(cli, f"{base}/m/proj", out.splitlines()[-1])
    assert "Saved as #0." in agent.ok("note", "the agent's first line")
    assert "the agent's first line" in agent.ok("wake")
    assert "#0" in agent.ok("recall", "first line")
    # At the root it acts on its own memory (its own pins file: the client keys pins by address and identity).
    root = _agent(cli, base, out.splitlines()[-1])
    main_view = root.run("wake", env={**root.env, "STASH_PINS": str(tmp_path / "root-pins.json")})
    assert "the agent's first line" in main_view.stdout
    assert "the agent's first line" not in cli.ok("wake")  # the owner's root is main
    lines = cli.ok("memories").splitlines()
    assert lines[0].startswith("main:") and lines[1].startswith("proj: 1 note")
    assert "No such memory" in _agent(cli, f"{base}/m/main", out.splitlines()[-1]).run("wake").stderr


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_a_reporter_runs_its_block_with_curl_and_reads_nothing(cli: Cli, http: Http, token: str) -> None:
    base = cli.env["STASH_URL"].rstrip("/")
    cli.ok("memories", "create", "ci")
    minted = cli.run("grants", "append", "--memory", "ci")
    assert minted.returncode == 0, minted.stderr
    rep, block = minted.stdout.splitlines()[-1], minted.stderr
    assert f"{base}/m/ci" in block
    # The block's note command, as an agent pastes it, with its line by plain replacement.
    command = next(ln.strip() for ln in block.splitlines() if ln.strip().startswith("curl") and "/note" in ln)
    text = 'it\'s $(not run) `x` \\ "q" 100% done!'
    line = command + "\n" + text + "\nSTASH_END\n"
    res = cli.shell(line, env={**cli.env, "STASH_URL": f"{base}/m/ci", "STASH_TOKEN": rep})
    assert res.returncode == 0, res.stderr
    assert re.search(r"#0\b", res.stdout) or '"id":0' in res.stdout.replace(" ", "")
    reporter = _agent(cli, f"{base}/m/ci", rep)
    assert reporter.run("wake").returncode != 0
    assert text in cli.ok("recall", "done!", env={**cli.env, "STASH_URL": f"{base}/m/ci"})
    erased = cli.ok("memories", "erase", "--q", "done!", "--dry-run")
    assert "memory ci: 1 note matches" in erased and "done!" not in erased


def test_fork_import_and_delete_from_the_client(cli: Cli, http: Http, token: str, tmp_path) -> None:
    base = cli.env["STASH_URL"].rstrip("/")
    cli.ok("memories", "create", "src")
    src = {**cli.env, "STASH_URL": f"{base}/m/src"}
    for i in range(3):
        cli.ok("note", f"src line {i}", env=src)
    cli.ok("note", "a line of main")  # pins main's head: a fork opens src, so that pin must stay out of it
    forked = cli.ok("memories", "fork", "src", "copy", "--at", "2")
    assert "Forked memory src into memory copy with its first 2 notes" in forked
    copy = {**cli.env, "STASH_URL": f"{base}/m/copy"}
    woke = cli.ok("wake", env=copy)
    assert "src line 1" in woke and "src line 2" not in woke
    # An export of one memory moves into another with import-optmem --memory.
    cli.ok("export", str(tmp_path / "exported"), env=src)
    cli.ok("memories", "create", "moved")
    cli.ok("import-optmem", str(tmp_path / "exported"), "--memory", "moved")
    assert cli.ok("wake", env={**cli.env, "STASH_URL": f"{base}/m/moved"}) == cli.ok("wake", env=src)
    assert cli.run("memories", "delete", "copy").returncode == 2
    assert "Destroyed memory copy" in cli.ok("memories", "delete", "copy", "--yes")
    assert cli.run("wake", env=copy).returncode != 0


def test_the_owners_verbs_act_on_the_identity_from_a_memorys_address(cli: Cli, http: Http, token: str) -> None:
    """With STASH_URL ending in /m/NAME, the owner's verbs (grants, memories,
    rotate) act on the identity as at the root, a capability minted there is
    bound to NAME unless another memory is named, and each command printed
    next runs as printed."""
    base = cli.env["STASH_URL"].rstrip("/")
    created = cli.ok("memories", "create", "jade")
    told = re.search(r"STASH_URL=(\S+?);", created)
    assert told and told.group(1) == f"{base}/m/jade", created
    owner_at_jade = _agent(cli, told.group(1), token)
    printed = re.search(r"with: (.+)$", created.strip())
    assert printed, created
    # The command it printed, run from jade's address, mints a capability bound to jade.
    minted = owner_at_jade.shell(printed.group(1))
    assert minted.returncode == 0 and "bound to memory jade" in minted.stdout, (minted.stdout, minted.stderr)
    # Bound to jade by default from jade's address; to main when main is named.
    assert "bound to memory jade" in owner_at_jade.ok("grants", "read")
    assert "bound to memory" not in owner_at_jade.ok("grants", "read", "--memory", "main")
    listed = owner_at_jade.ok("grants")
    assert listed.count("memory jade") == 2 and len(listed.splitlines()) == 4, listed
    assert sorted(line.split(":")[0] for line in owner_at_jade.ok("memories").splitlines()) == ["jade", "main"]
    gid = listed.splitlines()[-1].split()[0].lstrip("#")
    assert "Revoked" in owner_at_jade.ok("grants", "revoke", gid)
    refused = owner_at_jade.run("destroy", "--yes")
    assert refused.returncode != 0 and "memories delete jade --yes" in refused.stderr, refused.stderr
    assert http.ok("GET", "/wake", token)["T"] == 0  # nothing was destroyed
