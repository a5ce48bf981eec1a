"""The first session works as printed (issue 19 item 5), against a real
server: README.md's "A first session" run line for line in sh (only the
address changed), ``eval "$(stash init URL)"``, init's errors naming where
the address came from, the client naming itself with the shortest words that
run it, and what it prints for a minted capability, a rotation and a forget."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import CLI_TIMEOUT, REPO, Cli, Http, cli_env, free_port, path_with, python_bin

README_ADDRESS = "http://127.0.0.1:8080"


def first_session_blocks() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## A first session", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def sh(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )


@pytest.fixture
def checkout(tmp_path: Path, client_file: Path) -> Path:
    """A folder laid out as README.md's checkout is after the quickstart, as
    far as the first session uses it: ``.venv/bin/stash`` is the client."""
    venv_bin = tmp_path / "checkout" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "stash").write_bytes(client_file.read_bytes())
    (venv_bin / "stash").chmod(0o755)
    return venv_bin.parent.parent


def bare_env(tmp_path: Path) -> dict[str, str]:
    """No STASH_URL or STASH_TOKEN, as in a new shell; python3 is this interpreter."""
    return {"PATH": path_with(python_bin(tmp_path / "bin")), "HOME": str(tmp_path), "LANG": "C.UTF-8"}


@pytest.mark.parametrize("which", ["client", "curl"])
def test_the_readmes_first_session_runs_as_printed(
    base_url: str, http: Http, checkout: Path, tmp_path: Path, which: str
) -> None:
    blocks = first_session_blocks()
    assert len(blocks) == 2
    script = blocks[0 if which == "client" else 1]
    assert README_ADDRESS in script
    # One shell, every line as printed (only the address is this server's), stopping at the first failure.
    done = sh("set -e\n" + script.replace(README_ADDRESS, base_url), bare_env(tmp_path), checkout)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "chose jade over chrome" in done.stdout  # the wake shows the note
    if which == "client":
        assert done.stdout.rstrip("\n").endswith("You are awake.")
        assert "stash1_" not in done.stdout  # eval took the token; nothing printed it
        assert "Paste this block at the top of your AGENTS.md:" in done.stderr


def test_init_prints_only_exports_on_stdout_and_eval_sets_them(
    base_url: str, http: Http, client_file: Path, tmp_path: Path
) -> None:
    env = bare_env(tmp_path)
    done = sh(f"{shlex.quote(str(client_file))} init {shlex.quote(base_url)}", env, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split("=")[0] for line in lines] == ["export STASH_URL", "export STASH_TOKEN"]
    assert "AGENTS.md" in done.stderr and "shown once" in done.stderr
    # eval in a shell: both set, and the memory they name answers.
    probe = (
        f'eval "$({shlex.quote(str(client_file))} init {shlex.quote(base_url)} 2>/dev/null)" && '
        'curl -fsS -H "Authorization: Bearer $STASH_TOKEN" -X POST "$STASH_URL/wake" -d "{}"'
    )
    woke = sh(probe, env, tmp_path)
    assert woke.returncode == 0, woke.stderr
    assert '"awake":true' in woke.stdout.replace(" ", "")


def test_inits_errors_name_where_the_address_came_from(client_file: Path, tmp_path: Path) -> None:
    env = bare_env(tmp_path)
    run = [sys.executable, str(client_file), "init"]

    def err(*args: str, **extra: str) -> str:
        done = subprocess.run([*run, *args], env={**env, **extra}, capture_output=True, text=True, timeout=CLI_TIMEOUT)
        assert done.returncode in (2, 3) and done.stdout == "", (done.returncode, done.stdout)
        return done.stderr

    assert "the URL given to init must start with http://" in err(
        "ftp://stash.example", STASH_URL="https://fine.example"
    )
    assert "STASH_URL must start with http://" in err(STASH_URL="stash.example")
    closed = f"http://127.0.0.1:{free_port()}"
    said = err(closed, STASH_URL="https://elsewhere.example")
    assert f"cannot reach the server at {closed} (the URL given to init)" in said and "STASH_URL" not in said
    said = err(STASH_URL=closed)
    assert f"cannot reach the server at STASH_URL={closed}" in said


# ---------------------------------------------------------------- the client's own name


def printed_prog(cli: Cli, cwd: Path) -> str:
    """The words the client names itself with: the command ``grants bogus``'s
    refusal ends with (``... listed by: PROG grants``)."""
    done = cli.run("grants", "bogus", cwd=cwd)
    assert done.returncode == 2
    m = re.search(r"listed by: (.+) grants$", done.stderr.strip())
    assert m, done.stderr
    return m.group(1)


def test_the_client_names_itself_with_the_shortest_words_that_run_it(
    base_url: str, token: str, client_file: Path, tmp_path: Path
) -> None:
    here = tmp_path / "work"
    here.mkdir()
    mine = here / "stash"
    mine.write_bytes(client_file.read_bytes())
    mine.chmod(0o755)
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "stash").write_text("#!/bin/sh\necho not this client\n", encoding="utf-8")
    (other / "stash").chmod(0o755)
    bin_dir = python_bin(tmp_path / "bin")

    cases = [
        # this file on PATH as stash: the bare name
        (
            Cli([str(mine)], cli_env(base_url, token, os.pathsep.join([str(here), str(bin_dir), "/usr/bin", "/bin"]))),
            "stash",
        ),
        # another program is "stash" on PATH: never named, the file's shortest path instead
        (
            Cli(["./stash"], cli_env(base_url, token, os.pathsep.join([str(other), str(bin_dir), "/usr/bin"]))),
            "./stash",
        ),
        # run through the interpreter but executable by itself: the file alone
        (Cli([sys.executable, "stash"], cli_env(base_url, token, path_with(bin_dir))), "./stash"),
    ]
    for cli, expected in cases:
        prog = printed_prog(cli, here)
        assert prog == expected, (cli.argv0, prog)
        ran = subprocess.run(
            ["/bin/sh", "-c", f"{prog} grants"],
            env=cli.env,
            cwd=here,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
        )
        assert ran.returncode == 0 and ran.stdout.startswith("#1  owner"), (prog, ran.stdout, ran.stderr)
    # python -m stash from the checkout: no interpreter path longer than it needs.
    module = Cli([sys.executable, "-m", "stash"], cli_env(base_url, token, path_with(bin_dir)))
    prog = printed_prog(module, REPO)
    assert prog.endswith(" -m stash") and len(prog) <= len(shlex.quote(sys.executable) + " -m stash")
    assert not prog.startswith("/") or os.path.relpath(sys.executable, REPO).startswith("..")
    ran = subprocess.run(
        ["/bin/sh", "-c", f"{prog} grants"],
        env=module.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    assert ran.returncode == 0 and ran.stdout.startswith("#1  owner"), (prog, ran.stderr)


# ---------------------------------------------------------------- what the client prints


def test_grants_rotate_and_forget_print_what_comes_next(
    base_url: str, http: Http, client_file: Path, tmp_path: Path
) -> None:
    owner = http.init()["token"]
    cli = Cli([sys.executable, str(client_file)], cli_env(base_url, owner, path_with(client_file.parent)))
    # A read capability comes with the read-only block, naming this server.
    minted = cli.run("grants", "read")
    assert minted.returncode == 0, minted.stderr
    reader = minted.stdout.splitlines()[-1]  # the token stays the last line of stdout, for scripts
    block = (REPO / "skill" / "AGENTS-read.md").read_text(encoding="utf-8").replace("{url}", base_url)
    assert minted.stderr.rstrip("\n").endswith("\n" + block.rstrip("\n")) and "read-only" in minted.stderr
    woke = cli.ok("wake", env={**cli.env, "STASH_TOKEN": reader})
    assert "read-only" in woke and woke.rstrip("\n").endswith("You are awake.")
    # forget prints the nap its answer carries, not a bare "nap".
    for k in range(4):
        http.ok("POST", "/note", owner, json={"text": f"memory {k}"})
    while (due := http.ok("POST", "/nap", owner, json={})["nap"]) is not None:
        http.ok("POST", "/nap", owner, json={"block": due["block"], "text": f"summary of {due['block']}"})
    forgot = cli.ok("forget", "0-1")
    assert forgot.startswith("Dropped 3 summaries: 0-1, 2-3, 0-3.")
    assert "Compress memories #0-1 into one line" in forgot and "Run: stash nap 0-1 - <<'STASH_END'" in forgot
    # rotate says to update STASH_TOKEN, and the export line it prints runs.
    rotated = cli.ok("rotate")
    assert "Update STASH_TOKEN" in rotated
    export = next(line for line in rotated.splitlines() if line.startswith("export STASH_TOKEN="))
    check = sh(
        export + ' && curl -fsS -H "Authorization: Bearer $STASH_TOKEN" -X POST "$STASH_URL/wake" -d "{}"',
        cli.env,
        tmp_path,
    )
    assert check.returncode == 0, check.stderr
