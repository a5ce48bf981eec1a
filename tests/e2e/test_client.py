"""The ``stash`` client against the real server, in both of its forms: the
package (``python -m stash``) and the one file served at ``GET /client``.

What it prints is checked against what the server answers over plain HTTP,
and every command it prints is run exactly as printed, through ``/bin/sh``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.api import assert_error, member_bytes
from tests.support.docs.printed import orders
from tests.support.server import REPO, Cli, Http, cli_env, free_port, path_with, settle_all

pytestmark = pytest.mark.slow

CLIENT_SOURCE = REPO / "stash" / "client.py"


def run_line(output: str) -> str:
    """The last command an output hands over, here-document included."""
    runs = orders(output)
    assert runs, output
    return runs[-1]


def run_as_printed(cli: Cli, command: str, env: dict[str, str] | None = None, **fill: str) -> str:
    for placeholder, text in fill.items():
        command = command.replace(f"<{placeholder.replace('_', ' ')}>", text)
    assert re.search(r"<[a-z][a-z -]*>", command) is None, command
    done = cli.shell(command, env=env)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def test_get_client_serves_the_client_file_as_is(client_file: Path) -> None:
    served = client_file.read_bytes()
    assert served == CLIENT_SOURCE.read_bytes()
    assert served.startswith(b"#!/usr/bin/env python3\n")


def test_client_needs_only_the_standard_library(client_file: Path, base_url: str) -> None:
    tree = ast.parse(CLIENT_SOURCE.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would tie the file to the package"
            assert node.module is not None
            imported.add(node.module.split(".")[0])
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    # -I -S: no site-packages, no PYTHONPATH, no current directory, so only the stdlib can answer.
    env = cli_env(base_url, None, path_with(client_file.parent))
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(client_file), "health"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # Installed as the brief says (chmod +x), it runs by its shebang line.
    done = subprocess.run([str(client_file), "health"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
# The file form only: the package form reaches the same code through `python -m stash`, whose
# dispatch every other test of this module runs in both forms.
@pytest.mark.parametrize("cli", ["file"], indirect=True)
def test_every_verb(cli: Cli, http: Http, token: str, tmp_path: Path) -> None:
    outputs: list[str] = []

    def ok(*args: str) -> str:
        res = cli.run(*args)
        outputs.extend([res.stdout, res.stderr])
        assert res.returncode == 0, (args, res.returncode, res.stdout, res.stderr)
        return res.stdout

    def shell(command: str, **fill: str) -> str:
        out = run_as_printed(cli, command, None, **fill)
        outputs.append(out)
        return out

    assert "ok" in ok("health")

    # An empty memory: the wake says so, and how to record the first memory.
    empty = ok("wake")
    assert "You are awake." in empty.splitlines()
    first = [cmd for cmd in orders(empty) if " note " in cmd]
    assert first, empty
    shell(first[0], one_line="first memory from the printed command")
    assert http.ok("GET", "/wake", token)["lines"][0].endswith(" first memory from the printed command")

    # note: the answer carries the due nap, whose printed command settles it.
    out = ok("note", "second", "memory")
    command = run_line(out)
    assert " nap 0-1 " in command
    shell(command, your_line="first and second")
    assert http.ok("GET", "/zoom", token, params={"block": "0-3"})["lines"] == ["#0-1 first and second"]
    assert ok("zoom", "0-3").splitlines() == ["#0-1 first and second"]
    assert "Run: " not in ok("nap")  # nothing due

    for word in ("Teapot", "kettle", "TEAPOT again", "spoon", "teapot third"):
        ok("note", word)
    settle_all(http, token)

    # recall prints the server's matches and OptMem's count line; when cut, the
    # command that pages to the older matches, which runs as printed.
    want = http.ok("POST", "/recall", token, json={"q": "teapot"})
    assert ok("recall", "teapot").splitlines() == want["matches"] + ["3 matches."]
    assert ok("recall", "kettle").splitlines()[-1] == "1 match."
    assert ok("recall", "no such word").splitlines() == ["No match."]
    ok("config", "PART_CHARS=60")
    cut = http.ok("POST", "/recall", token, json={"q": "teapot"})
    assert cut["total"] == 3 and len(cut["matches"]) < 3
    printed = ok("recall", "teapot")
    shown = printed.splitlines()[: len(cut["matches"])]
    assert shown == cut["matches"]
    assert printed.splitlines()[len(shown)] == (
        f"3 matches. The newest {len(shown)} are shown; the command below fetches the older ones."
    )
    older = shell(run_line(printed), the_same_regex="teapot").splitlines()
    assert older[:-1] == http.ok("POST", "/recall", token, json={"q": "teapot", "before": cut["more"]})["matches"]
    assert [m.split()[0] for m in older[:-1] + shown] == [m.split()[0] for m in want["matches"]]
    ok("config", "PART_CHARS=")  # an empty value restores the default
    sizes = http.ok("GET", "/config", token)
    assert sizes["sizes"] == sizes["defaults"]

    # config prints every size; setting one shows in the server's answer.
    ok("config", "WAKE_LINES=50")
    listed = ok("config")
    assert http.ok("GET", "/config", token)["sizes"]["WAKE_LINES"] == 50
    for name, value in http.ok("GET", "/config", token)["sizes"].items():
        assert any(line.split()[0] == f"{name}={value}" for line in listed.splitlines()), (name, listed)
    ok("config", "WAKE_LINES=")

    assert ok("zoom", "4-7").splitlines() == http.ok("GET", "/zoom", token, params={"block": "4-7"})["lines"]

    # forget drops a summary and prints the nap its answer carries, which settles as printed.
    out = ok("forget", "2-3")
    assert http.ok("POST", "/nap", token, json={})["nap"]["block"] == "2-3"
    rebuild = orders(out)[0]  # the nap; a batch offer may follow as an order of its own
    assert " nap 2-3 " in rebuild
    shell(rebuild, your_line="rebuilt summary")
    assert http.ok("GET", "/zoom", token, params={"block": "0-3"})["lines"][1] == "#2-3 rebuilt summary"
    settle_all(http, token)

    wake = ok("wake").splitlines()
    assert wake[:-1] == http.ok("GET", "/wake", token)["lines"] and wake[-1] == "You are awake."

    # export writes an OptMem archive; import reads OptMem's LOG.txt records into another memory.
    archive = tmp_path / "memory.tar.gz"
    ok("export", str(archive))
    with tarfile.open(archive, "r:gz") as tar:
        log = member_bytes(tar, "memory/LOG.txt").decode()
    logfile = tmp_path / "LOG.txt"
    logfile.write_text(log, encoding="utf-8")
    other = http.init()["token"]
    done = cli.run("import", str(logfile), env={**cli.env, "STASH_TOKEN": other})
    assert done.returncode == 0, done.stderr
    mine = http.ok("POST", "/recall", token, json={"q": "."})["matches"]
    assert http.ok("POST", "/recall", other, json={"q": "."})["matches"] == mine
    # The printed way on asks for the first nap the import made due.
    prompt = run_as_printed(cli, run_line(done.stdout), env={**cli.env, "STASH_TOKEN": other})
    assert " nap 0-1 " in orders(prompt)[0]

    # grants: mint a read capability, see it listed, revoke it.
    out = ok("grants", "read")
    minted = [w for w in out.split() if w.startswith("stash1_")]
    assert len(minted) == 1
    reader = minted[0]
    assert http.ok("GET", "/wake", reader)["T"] == http.ok("GET", "/wake", token)["T"]
    assert_error(http.post("/note", reader, json={"text": "no"}), 403)
    grants = http.ok("GET", "/grants", token)["grants"]
    rid = next(g["id"] for g in grants if g["scope"] == "read")
    assert any(line.startswith(f"#{rid} ") for line in ok("grants").splitlines())
    ok("grants", "revoke", str(rid))
    assert_error(http.get("/wake", reader), 401)

    # erase shreds a memory and leaves a receipt; destroy ends a memory.
    out = ok("erase", "#0")
    assert "receipt" in out and "Erased 1 of 1" in out
    assert http.ok("GET", "/zoom?block=0-1", token)["lines"][0].endswith(" [erased]")
    assert "#0" in ok("erasures")
    doomed = http.init()["token"]
    refused = cli.run("destroy", env={**cli.env, "STASH_TOKEN": doomed})
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert http.ok("GET", "/wake", doomed)["T"] == 0
    gone = cli.run("destroy", "--yes", env={**cli.env, "STASH_TOKEN": doomed})
    assert gone.returncode == 0, gone.stderr
    assert_error(http.get("/wake", doomed), 401)

    # The caller's token is never printed, whatever the verb.
    joined = "\n".join(outputs)
    assert token not in joined and token.split("_")[2] not in joined


def test_init_prints_the_token_line_and_the_prompt(cli: Cli, http: Http) -> None:
    env = {k: v for k, v in cli.env.items() if k != "STASH_TOKEN"}
    done = cli.run("init", "--url", "https://memory.example", env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    exports = [line for line in out.splitlines() if line.startswith("export STASH_TOKEN=")]
    assert len(exports) == 1
    new = exports[0].removeprefix("export STASH_TOKEN=")
    assert http.ok("GET", "/wake", new)["T"] == 0
    assert "https://memory.example" in out and "Your memory is Stash, at https://memory.example." in done.stderr
    # The printed line works as printed: a shell that runs it has the token.
    done = cli.shell(exports[0] + ' && test -n "$STASH_TOKEN" && echo set', env=env)
    assert done.stdout.strip() == "set"


def test_wake_parts_are_read_by_the_printed_commands(cli: Cli, http: Http, token: str) -> None:
    for i in range(7):
        http.ok("POST", "/note", token, json={"text": f"parted {i}"})
    settle_all(http, token)
    whole = http.ok("GET", "/wake", token)["lines"]
    http.ok("POST", "/config", token, json={"PART_LINES": 2})
    out = cli.ok("wake")
    got: list[str] = []
    for _ in range(len(whole)):
        lines = out.splitlines()
        assert lines[0].startswith("Your memory, part ")  # each part says which, as curl's does
        lines = lines[1:]
        if lines[-1] == "You are awake.":
            got += lines[:-1]
            break
        assert lines[-2] == "Not awake yet." and lines[-1].startswith("Run: ")
        got += lines[:-2]
        out = run_as_printed(cli, lines[-1].removeprefix("Run: "))
    assert got == whole


def test_a_refused_wake_hands_over_the_nap(cli: Cli, http: Http, token: str) -> None:
    http.ok("POST", "/config", token, json={"WAKE_LINES": 1})
    for i in range(2):
        http.ok("POST", "/note", token, json={"text": f"needs {i}"})
    refused = cli.run("wake")
    assert refused.returncode == 1
    body = assert_error(http.get("/wake", token), 409)
    # The server's message, then the nap and the wake again as this client's own commands.
    assert refused.stderr.startswith(body["message"])
    assert "curl" not in refused.stderr and not refused.stdout
    nap, wake = orders(refused.stderr)
    assert wake.endswith(" wake")
    run_as_printed(cli, nap, your_line="needs both")
    assert cli.ok("wake").splitlines() == ["#0-1 needs both", "You are awake."]


def test_errors_are_clean(cli: Cli, http: Http, token: str) -> None:
    no_url = cli.run("wake", env={k: v for k, v in cli.env.items() if k != "STASH_URL"})
    assert no_url.returncode == 2 and "STASH_URL" in no_url.stderr and not no_url.stdout
    no_token = cli.run("wake", env={k: v for k, v in cli.env.items() if k != "STASH_TOKEN"})
    assert no_token.returncode == 2 and "STASH_TOKEN" in no_token.stderr and not no_token.stdout

    dead = f"http://127.0.0.1:{free_port()}"
    refused = cli.run("wake", env={**cli.env, "STASH_URL": dead})
    assert refused.returncode == 3 and dead in refused.stderr and "Traceback" not in refused.stderr

    # A server refusal: its message on stderr, nothing on stdout, exit 1.
    expected = assert_error(http.get("/zoom", token, params={"block": "64-127"}), 422)["message"]
    done = cli.run("zoom", "64-127")
    assert (done.returncode, done.stdout) == (1, "")
    message, _, order = done.stderr.strip().partition("\n\n")
    assert message == expected and "curl" not in done.stderr  # no wake shows a block of 0 memories
    assert order.startswith("Run: ") and order.endswith("stash wake")  # what helps instead, as memo names it

    wrong = cli.run("wake", env={**cli.env, "STASH_TOKEN": "not-a-token"})
    assert wrong.returncode == 1
    assert_error(http.get("/wake", "not-a-token"), 401)
    # The client's words for a 401 name its own variable, not curl's header.
    assert "refused STASH_TOKEN" in wrong.stderr and "Authorization: Bearer" not in wrong.stderr

    reader = http.ok("POST", "/grants", token, json={"scope": "read"})["token"]
    scoped = cli.run("grants", env={**cli.env, "STASH_TOKEN": reader})
    assert scoped.returncode == 1
    assert scoped.stderr.strip() == assert_error(http.get("/grants", reader), 403)["message"]
    assert reader not in scoped.stderr + scoped.stdout

    assert cli.run("no-such-verb").returncode == 2
    for res in (no_url, no_token, refused, done, wrong):
        assert token not in res.stdout + res.stderr


@pytest.mark.parametrize("text", ["line with ünïcödé ✓", "quotes \" and ' and $HOME stay literal"])
def test_note_sends_the_text_verbatim(cli: Cli, http: Http, token: str, text: str) -> None:
    cli.ok("note", text)
    assert http.ok("GET", "/wake", token)["lines"][-1].split(" ", 2)[2] == text


def test_import_reads_dated_lines_and_refuses_bad_ones(cli: Cli, http: Http, token: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("2021-03-01 fine\nnot a dated line\n", encoding="utf-8")
    assert cli.run("import", str(bad)).returncode == 2
    assert http.ok("GET", "/wake", token)["T"] == 0
    good = tmp_path / "good.txt"
    good.write_text("2021-03-01 spring\n\n2021-03-02 second day  \n2021-04-01 april\n", encoding="utf-8")
    cli.ok("import", str(good))
    assert http.ok("GET", "/wake", token)["lines"] == [
        "#0 2021-03-01 spring",
        "#1 2021-03-02 second day",
        "#2 2021-04-01 april",
    ]
