"""The ``stash`` client as a script and an agent meet it: every command it
prints is run exactly as printed, ``--json`` on every verb is the server's
raw answer, the exit statuses are the ones stash/CLIENT.md tabulates, and
``stash init URL`` prints the token once, the two export lines and the
AGENTS.md block."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from stash import client as client_module
from tests.support.api import assert_error
from tests.support.docs.commands import indented_commands
from tests.support.server import (
    CLI_TIMEOUT,
    REPO,
    Cli,
    Http,
    cli_env,
    free_port,
    interrupted_while_waiting,
    path_with,
    python_bin,
)

FILL = {"<your line>": "a summary the test wrote", "<one line>": "a memory the test wrote"}
OLD = "2021-03-0"


def prog_of(cli: Cli) -> str:
    """How the client names itself in what it prints (stash.client._prog):
    ``stash`` when that is this client on PATH, else the interpreter (by its
    shorter path, relative or absolute: the PATH here has no ``python3`` that
    is this very path) and the module."""
    if cli.argv0[-2:] == ["-m", "stash"]:
        return f"{shlex.quote(min(os.path.relpath(sys.executable), sys.executable, key=len))} -m stash"
    return "stash"


def printed_commands(text: str, prog: str) -> list[str]:
    """Every command in an output: from the client's name to the end of its
    line (a sentence's closing full stop is not part of it)."""
    found = []
    lines = text.splitlines()
    n = 0
    while n < len(lines):
        line = lines[n]
        n += 1
        k = line.find(prog + " ")
        if k < 0 or line.lstrip().startswith("usage:"):
            continue
        command = line[k:]
        if command.endswith(".") and not command.endswith('"."'):
            command = command[:-1]
        if command.endswith("<<'STASH_END'"):  # the lines it sends follow, to the delimiter
            while n < len(lines):
                command += "\n" + lines[n]
                n += 1
                if lines[n - 1] == "STASH_END":
                    break
        found.append(command)
    return found


class Follower:
    """Runs the client, then every command its output prints, through
    /bin/sh exactly as printed (placeholders like ``<your line>`` filled),
    then the commands those print, and so on, in the order printed (a
    refused wake hands over the nap, then the wake again); an order offered
    as an alternative to the one before it is left."""

    def __init__(self, cli: Cli) -> None:
        self.cli = cli
        self.prog = prog_of(cli)
        self.ran: list[str] = []

    def run(self, *args: str, status: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = self.cli.run(*args, env=env)
        assert done.returncode == status, (args, done.returncode, done.stdout, done.stderr)
        self.follow(done.stdout + done.stderr, env, 0)
        return done

    def follow(self, text: str, env: dict[str, str] | None, depth: int) -> None:
        assert depth < 60, "printed commands did not come to an end"
        lines = text.splitlines()
        for command in printed_commands(text, self.prog):
            first = command.split("\n")[0]
            above = [lines[k - 1] for k in range(1, len(lines)) if lines[k].endswith(first)]
            if above and above[0].startswith("Or "):
                continue  # an alternative to the order before it (the batch offer), taken by test_batch_clients
            line = command
            for placeholder, value in FILL.items():
                line = line.replace(placeholder, value)
            assert re.search(r"<[a-z][a-z -]*>", line) is None, f"an unknown placeholder: {command}"
            done = self.cli.shell(line, env=env)
            # A nap printed earlier may be run after another printed command
            # settled its block: it saves nothing, and says so by its status.
            answered = done.returncode == 1 and "nothing was saved" in done.stderr and "already settled" in done.stdout
            assert done.returncode == 0 or answered, (command, done.returncode, done.stdout, done.stderr)
            self.ran.append(command.removeprefix(self.prog + " "))
            # Help text describes commands rather than asking to run them, and init's output is the
            # AGENTS.md block, whose curl commands test_init_url_prints_exports_and_the_agents_block runs.
            if line.split()[-1] not in ("--help", "init"):
                self.follow(done.stdout + done.stderr, env, depth + 1)


def test_printed_commands_are_found_and_only_those() -> None:
    text = (
        'Saved as #3.\n\nRun: stash nap 0-1 "<your line>"\nTo go ahead: stash destroy --yes\n'
        "stash: STASH_TOKEN is not set. Set it; a new memory gets one from: stash init\n"
        "usage: stash [-h] [--json] VERB ...\nStash 0.1.0 at http://x; stash-export.tar.gz"
    )
    assert printed_commands(text, "stash") == ['stash nap 0-1 "<your line>"', "stash destroy --yes", "stash init"]


@pytest.fixture
def installed(base_url: str, token: str, client_file: Path) -> Cli:
    """The client as an agent has it: the file from GET /client, on PATH as ``stash``.
    (test_client.py runs printed commands in the ``python -m stash`` form too.)"""
    return Cli([sys.executable, str(client_file)], cli_env(base_url, token, path_with(client_file.parent)))


@pytest.mark.slow
def test_every_printed_command_runs_as_printed(installed: Cli, http: Http, token: str, tmp_path: Path) -> None:
    cli = installed
    f = Follower(cli)
    f.run("wake")  # an empty memory: how to record the first memory
    f.run("note", "second memory")  # its nap, answered as printed
    f.run("nap")  # nothing due
    f.run("nap", "0-1", status=2)  # the summary is missing: the usage line says how
    for k in range(3, 9):
        f.run("note", f"memory number {k}")
    f.run("forget", "0-1")  # "Run: stash nap", then each nap it chains to
    dated = tmp_path / "dated.txt"
    dated.write_text("".join(f"{OLD}{d} imported on day {d}\n" for d in range(1, 4)), encoding="utf-8")
    other = http.init()["token"]
    f.run("import", str(dated), env={**cli.env, "STASH_TOKEN": other})
    f.run("erase", "2")  # summaries dropped: "Run: stash nap"
    f.run("config", "PART_LINES=2")
    f.run("wake")  # parts: "Not awake yet. Run: stash wake 2 T", followed to the end
    f.run("config", "PART_LINES=", "WAKE_LINES=2")
    for k in range(9, 12):
        http.ok("POST", "/note", token, json={"text": f"unsettled {k}"})
    f.run("wake", status=1)  # refused: the nap below, then "wake again"
    f.run("grants", "revoke", "x", status=2)  # "as listed by: stash grants"
    f.run("grants", "bogus", status=2)
    f.run("no-such-verb", status=2)  # "See: stash --help"
    f.run("wake", status=2, env={k: v for k, v in cli.env.items() if k != "STASH_TOKEN"})  # "... from: stash init"
    doomed = http.init()["token"]
    f.run("destroy", status=2, env={**cli.env, "STASH_TOKEN": doomed})  # "To go ahead: stash destroy --yes"
    assert_error(http.get("/wake", doomed), 401)
    verbs = {command.split()[0] for command in f.ran}
    assert verbs == {"note", "nap", "wake", "grants", "--help", "init", "destroy"}, f.ran


# ---------------------------------------------------------------- --json


def module_cli(base_url: str, token: str | None, tmp_path: Path) -> Cli:
    return Cli([sys.executable, "-m", "stash"], cli_env(base_url, token, path_with(python_bin(tmp_path / "bin"))))


def json_lines(out: str) -> list:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow
def test_json_prints_the_raw_answer_of_every_verb(http: Http, base_url: str, token: str, tmp_path: Path) -> None:
    c = module_cli(base_url, token, tmp_path)

    def raw(*args: str, env: dict[str, str] | None = None) -> list:
        done = c.run("--json", *args, env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert done.stderr == ""
        return json_lines(done.stdout)

    assert raw("health") == [http.ok("GET", "/health")]
    init = raw("init", base_url, env={k: v for k, v in c.env.items() if k != "STASH_TOKEN"})
    assert set(init[0]) == {"user_id", "token", "content_cipher", "file_cipher", "note", "prompt"}
    noted = raw("note", "first")
    assert [(n["id"], n["nap"], n["head"]["count"]) for n in noted] == [(0, None, 1)]
    noted = raw("note", "second")
    assert noted[0]["id"] == 1 and noted[0]["nap"]["block"] == "0-1"
    assert raw("nap") == [http.ok("POST", "/nap", token, json={})]
    saved = raw("nap", "0-1", "both")
    assert saved[0]["saved"] == "0-1"
    # after the verb works too
    done = c.run("wake", "--json")
    assert done.returncode == 0 and json_lines(done.stdout) == [http.ok("GET", "/wake", token)]
    assert raw("wake", "1", "2") == [http.ok("GET", "/wake?part=1&T=2", token)]
    assert raw("recall", "SECOND") == [http.ok("POST", "/recall", token, json={"q": "SECOND"})]
    assert raw("zoom", "0-1") == [http.ok("GET", "/zoom?block=0-1", token)]
    assert raw("config") == [http.ok("GET", "/config", token)]
    assert raw("config", "WAKE_LINES=50")[0]["sizes"]["WAKE_LINES"] == 50
    forgot = raw("forget", "0-1")
    assert [(f["dropped"], f["nap"]["block"]) for f in forgot] == [(["0-1"], "0-1")]
    dated = tmp_path / "dated.txt"
    dated.write_text(f"{OLD}1 a\n{OLD}2 b\n", encoding="utf-8")
    fresh = http.init()["token"]
    imported = raw("import", str(dated), env={**c.env, "STASH_TOKEN": fresh})
    assert [(a["first"], a["last"], a["pending"], a["head"]["count"]) for a in imported] == [(0, 1, 1, 2)]
    minted = raw("grants", "read")[0]
    assert minted["scope"] == "read" and minted["token"].startswith("stash1_")
    assert raw("grants") == [http.ok("GET", "/grants", token)]
    assert raw("grants", "revoke", str(minted["id"]))[0]["id"] == minted["id"]
    receipt = raw("erase", "0")[0]
    assert receipt["erased"] == [0]
    assert raw("erasures") == [http.ok("GET", "/erasures", token)]
    assert raw("destroy", "--yes", env={**c.env, "STASH_TOKEN": fresh})[0]["destroyed"] is True


def test_json_refusal_is_the_error_object_on_stdout(http: Http, base_url: str, token: str, tmp_path: Path) -> None:
    c = module_cli(base_url, token, tmp_path)
    done = c.run("--json", "zoom", "64-127")
    expected = assert_error(http.get("/zoom?block=64-127", token), 422)
    assert done.returncode == 1
    assert json_lines(done.stdout) == [expected]
    # stderr is the server's message as it is, then the order that helps (a zoom past the end hands one
    # over, as memo's does) in the client's own words: no curl.
    message, _, order = done.stderr.strip().partition("\n\n")
    assert message == expected["message"] and "curl" not in done.stderr
    assert order.startswith("Run: ") and " wake" in order  # two memories: no block yet, so the wake


# ---------------------------------------------------------------- exit statuses


def documented_exit_statuses() -> dict[int, str]:
    text = (REPO / "stash" / "CLIENT.md").read_text(encoding="utf-8")
    section = text.split("## Exit statuses", 1)[1].split("\n#", 1)[0]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+?) \|", section, re.M)}


class NotStash(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>not a memory server</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_every_documented_exit_status(http: Http, base_url: str, token: str, tmp_path: Path) -> None:
    documented = documented_exit_statuses()
    assert documented.keys() == {0, 1, 2, 3, 130, 141}  # 130 and 141: test_interrupted_is_130, test_pipes_and_signals
    assert (client_module.OK, client_module.REFUSED, client_module.USAGE, client_module.UNREACHABLE) == (0, 1, 2, 3)
    assert (client_module.INTERRUPTED, client_module.CLOSED_PIPE) == (130, 141)
    c = module_cli(base_url, token, tmp_path)
    no_token = {k: v for k, v in c.env.items() if k != "STASH_TOKEN"}
    cases: list[tuple[int, tuple[str, ...], dict[str, str] | None]] = [
        (0, ("health",), None),
        (0, ("wake",), None),
        (1, ("zoom", "64-127"), None),  # refused: 422
        (1, ("wake",), {**c.env, "STASH_TOKEN": "stash1_not_a_token"}),  # refused: 401
        (2, ("wake",), no_token),
        (2, ("wake",), {k: v for k, v in c.env.items() if k != "STASH_URL"}),
        (2, ("wake",), {**c.env, "STASH_URL": "ftp://example"}),
        (2, ("no-such-verb",), None),
        (2, ("import", str(tmp_path / "missing.txt")), None),
        (2, ("wake", "one"), None),
        (3, ("wake",), {**c.env, "STASH_URL": f"http://127.0.0.1:{free_port()}"}),
    ]
    server = HTTPServer(("127.0.0.1", 0), NotStash)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cases.append((3, ("wake",), {**c.env, "STASH_URL": f"http://127.0.0.1:{server.server_port}"}))
        for status, args, env in cases:
            done = c.run(*args, env=env)
            assert done.returncode == status, (status, args, done.stdout, done.stderr)
            if status:  # a refusal says why on stderr, in one clean message, and prints nothing on stdout
                assert done.stdout == "" and done.stderr.strip(), (args, done.stdout, done.stderr)
                assert "Traceback" not in done.stderr and token not in done.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert {status for status, _, _ in cases} | {130, 141} == documented.keys()


def test_interrupted_is_130(base_url: str, token: str, tmp_path: Path) -> None:
    """A server that accepts and never answers; the client waits on it until
    interrupted, and exits 130 as a shell does after Ctrl-C."""
    argv0 = module_cli(base_url, token, tmp_path).argv0
    code, err = interrupted_while_waiting([*argv0, "wake"], lambda url: module_cli(url, token, tmp_path).env)
    assert code == 130
    assert "Traceback" not in err


# ---------------------------------------------------------------- stash init URL


def test_init_url_prints_exports_and_the_agents_block(base_url: str, http: Http, tmp_path: Path) -> None:
    c = module_cli(base_url, None, tmp_path)
    env = {k: v for k, v in c.env.items() if k != "STASH_URL"}
    done = c.run("init", base_url, env=env)
    assert done.returncode == 0, done.stderr
    exports = done.stdout.splitlines()  # only the exports, for eval "$(stash init URL)"
    assert [e.split("=")[0] for e in exports] == ["export STASH_URL", "export STASH_TOKEN"]
    new_token = exports[1].removeprefix("export STASH_TOKEN=")
    assert (done.stdout + done.stderr).count(new_token) == 1  # shown once
    assert http.ok("GET", "/wake", new_token)["T"] == 0
    # The AGENTS.md block, exactly, on stderr: skill/AGENTS.md with the address filled in.
    block = (REPO / "skill" / "AGENTS.md").read_text(encoding="utf-8").replace("{url}", base_url).rstrip("\n")
    assert done.stderr.rstrip("\n").endswith("\n" + block)
    assert "Paste this block at the top of your AGENTS.md:" in done.stderr
    # The export lines and every command of the block run as printed, in a shell that ran the exports.
    commands = [c for c in indented_commands(block) if c.startswith("curl ")]
    assert len(commands) >= 4
    fill = {"<one line>": "noted from the AGENTS.md block", "<regex>": "agents", "<lo-hi>": "0-1"}
    shell_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    for command in commands:
        for k, v in fill.items():
            command = command.replace(k, v)
        script = "\n".join(exports) + "\n" + command.replace("curl -s", "curl -f -s", 1)
        run = subprocess.run(
            ["/bin/sh", "-c", script], env=shell_env, capture_output=True, text=True, timeout=CLI_TIMEOUT
        )
        assert run.returncode == 0, (command, run.stdout, run.stderr)
        if command.endswith('"$STASH_URL/skill"'):  # the served skill, Markdown
            assert run.stdout == (REPO / "skill" / "SKILL.md").read_text(encoding="utf-8")
            continue
        assert run.stdout and run.stderr == "", run
    assert http.ok("GET", "/wake", new_token)["lines"][0].endswith(" noted from the AGENTS.md block")


@pytest.mark.parametrize("flag", [[], ["--url", "https://memory.example"]])
def test_init_public_address(base_url: str, http: Http, tmp_path: Path, flag: list[str]) -> None:
    """With STASH_URL set and no URL, init calls it; --url is written into
    the block and the export line when the public address differs."""
    c = module_cli(base_url, None, tmp_path)
    done = c.run("init", *flag)
    assert done.returncode == 0, done.stderr
    public = flag[1] if flag else base_url
    assert done.stdout.splitlines()[0] == f"export STASH_URL={public}"
    assert f"Your memory is Stash, at {public}." in done.stderr
