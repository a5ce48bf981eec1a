"""Every template printed for an agent to fill takes any line (docs/DESIGN.md,
"Next steps"): a few hundred lines — English with apostrophes and quotes,
shell and JSON metacharacters, Unicode, ``EOF``, the here-document delimiter
itself — each put into the templates by plain string replacement of the
placeholder, exactly as an agent does, and run in sh, dash and bash against
a real server. The server must then hold exactly that line (or have searched
exactly that regex), and the empty folder each script runs in must still be
empty: every hostile line tries to create a file there.

The templates are taken from what each surface prints — the server's text
and JSON answers, the ``/init`` block, SKILL.md and the client's output — and
checked to be the same commands the fuzz fills in. ``stash mcp`` prints tool
calls, not shell commands: an MCP host passes the line as a JSON argument
(tests/e2e/test_mcp.py)."""

from __future__ import annotations

import datetime as dt
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash import client as client_module
from stash.core.lines import DELIMITER, check_line
from stash.service import instructions
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.docs.commands import SKILL, indented_commands
from tests.support.docs.printed import orders
from tests.support.server import Http, Server, cli_env, path_with, start_server

pytestmark = pytest.mark.slow

HOSTILE = [
    'ok" $(touch pwned1) "',
    "ok' $(touch pwned2) '",
    "`touch pwned3`",
    "$(touch pwned4)",
    "it's; touch pwned5; echo '",
    'say "hi"; touch pwned6',
    "a\\' ; touch pwned7 #",
    '\\"; touch pwned8; \\"',
    "$STASH_TOKEN and ${HOME} and $((1+1))",
    "!! !$ !-1 history",
    "100% of %s %n %d",
    "> pwned9",
    "| touch pwned10",
    "&& touch pwned11 &",
    "* ? [a-z] ~ ~root {a,b}",
    "-",
    "--",
    "-x",
    "--json",
    "-- --help",
    "'",
    '"',
    "\\",
    "$'\\x41' and $\"translated\"",
    "'\"'\"'",
    "x=$(id) IFS=: ; touch pwned12",
    "#0-1 looks like a summary line",
    "Run: stash note pwned",
    'curl -s -H "Authorization: Bearer $STASH_TOKEN" -X POST "$STASH_URL/note" -d \'{"text": "x"}\'; touch pwned13',
]
ORDINARY = [
    "Priya's review is due Friday",
    "don't use the v2 API; it's deprecated",
    'she said "ship it"',
    "C:\\Users\\priya\\new folder\\",
    "a path ending in a backslash \\",
    "EOF",
    "eof",
    "STASH_END is how printed commands end",
    "STASH_END;touch pwned14",
    "STASH_ENDX",
    "0-1 looks like a block line",
    "before 12",
    '{"text": "JSON-looking", "block": "0-1"}',
    '["a", 1, null, true]',
    "%s",
    "%",
    "!!",
    "!",
    "café naïve — “quotes” ‘single’ ¿qué?",
    "日本語のメモ：締め切りは金曜日",
    "مراجعة بريا يوم الجمعة",
    "emoji 😀🎉 and a family 👨‍👩‍👧",
    "Ünïcödé ÅÆØ ß ﬁ",
    "tab-free but wide:　full-width space",
    "<one line> and more: a placeholder's text inside a line of one's own",
    "see <your line>",
    "<<'STASH_END'",
    "cat <<'EOF'",
    "a line with trailing spaces removed",
    "$(",
    "`",
    ";",
    "#",
    "&",
    "\\n is not a newline here",
    "\\\\server\\share",
    "it's 5 o'clock; don't \"quote\" me on `that` $HOME",
]
SHELL_CHARS = "'\"$()`\\!%;&|<>*?~#{}[]=-^ aZ9é😀日ع"
SHELLS = ("sh", "dash", "bash")
TIMEOUT = 120.0
PART_CHARS_MAX = 10_000_000
CURSOR = "w1.8.8.16.8.1100000.3"  # a words page's `more`, put where each printed page names its own


def random_hostile(n: int, seed: int = 19) -> list[str]:
    """Seeded lines over the characters a shell or JSON treats specially."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        text = "".join(rng.choice(SHELL_CHARS) for _ in range(rng.randint(1, 60))).strip()
        if text and text not in out and text not in HOSTILE + ORDINARY:
            out.append(text)
    return out


LINES = HOSTILE + ORDINARY + random_hostile(240)
# Templates that cost a request, and a disk flush, per line take a sample; the others take every line.
PER_REQUEST = 8


def test_the_lines_are_memories_and_the_delimiter_is_not() -> None:
    # Otherwise the fuzz below would be refused by the server and prove nothing.
    assert len(LINES) >= 300 and len(set(LINES)) == len(LINES)
    for text in LINES:
        assert check_line(text, 280) == text
    with pytest.raises(Exception, match="reserved"):
        check_line(DELIMITER, 280)


# ---------------------------------------------------------------- running scripts


def run(shell: str, script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [shutil.which(shell) or shell, "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert list(cwd.iterdir()) == [], f"{shell} ran part of a line as a command"
    return done


def split_lines(lines: list[str]) -> dict[str, list[str]]:
    """The lines dealt out among the shells, every line to one."""
    return {shell: lines[k :: len(SHELLS)] for k, shell in enumerate(SHELLS)}


def fill(template: str, placeholder: str, text: str) -> str:
    assert template.count(placeholder) == 1, template
    return template.replace(placeholder, text)


class Memory:
    """A fresh memory on the real server, read back through JSON."""

    def __init__(self, http: Http, env: dict[str, str]) -> None:
        self.http = http
        self.token = http.init()["token"]
        self.env = {**env, "STASH_TOKEN": self.token}
        http.ok("POST", "/config", self.token, json={"PART_CHARS": PART_CHARS_MAX})

    def texts(self) -> list[str]:
        lines = self.http.ok("POST", "/recall", self.token, json={"q": "."})["matches"]
        return [line.split(" ", 2)[2] for line in lines]

    def import_(self, n: int) -> None:
        self.http.ok(
            "POST", "/import", self.token, json={"entries": [{"date": "2024-01-02", "text": f"m{i}"} for i in range(n)]}
        )

    def summaries(self, n: int) -> list[str]:
        """The summaries of 0-1, 2-3, … as stored."""
        out = []
        for lo in range(0, 2 * n, 4):
            zoomed = self.http.ok("POST", "/zoom", self.token, json={"block": f"{lo}-{lo + 3}"})["lines"]
            out += [line.split(" ", 1)[1] for line in zoomed]
        return out[:n]

    def text(self, method: str, path: str, **kw) -> str:
        return self.http.send(
            method,
            self.http.client.base_url.join(path),
            {"Authorization": f"Bearer {self.token}", "Accept": "text/plain"},
            **kw,
        ).text


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """This module's own server, with the cheap KDF: it mints a memory per
    case, and what is under test is the commands, not the KDF."""
    with start_server(tmp_path_factory.mktemp("fuzz-server"), *CHEAP_KDF_FLAGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(fuzz_server: Server) -> Iterator[Http]:
    h = Http(fuzz_server.url)
    yield h
    h.close()


@pytest.fixture(scope="module")
def env(fuzz_server: Server, client_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    assert shutil.which("curl"), "curl is needed: the server's printed commands are curl commands"
    home = tmp_path_factory.mktemp("home")
    return {**cli_env(fuzz_server.url, None, path_with(client_file.parent)), "HOME": str(home), "STASH_PIN": "off"}


@pytest.fixture(scope="module")
def printed(http: Http, env: dict[str, str]) -> Iterator[dict[str, str]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield _printed(http, env, monkeypatch)


def _printed(http: Http, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The templates as the surfaces print them, each checked to be the same
    on every surface that prints it: curl ones (server text and JSON
    answers, the /init block, SKILL.md) and the client's."""
    monkeypatch.setattr(client_module, "_prog", lambda: "stash")
    m = Memory(http, env)
    got: dict[str, list[str]] = {}

    def saw(name: str, command: str) -> None:
        got.setdefault(name, []).append(command)

    # The server, in text and in JSON.
    saw("note", orders(m.text("GET", "/wake"))[0])
    m.import_(8)
    text_nap = m.text("POST", "/nap", json={})
    json_nap = http.ok("POST", "/nap", m.token, json={})["nap"]
    saw("nap 0-1", orders(text_nap)[0])
    saw("nap 0-1", orders(json_nap["prompt"])[0])
    saw("batch", orders(m.text("POST", "/nap", json={"batch": 3}))[0])
    saw("batch", orders(http.ok("POST", "/nap", m.token, json={"batch": 3})["prompt"])[0])
    http.ok("POST", "/config", m.token, json={"PART_CHARS": 40})
    saw("recall page", orders(m.text("POST", "/recall", json={"q": "m"}))[0])
    saw("words page", orders(m.text("POST", "/recall", json={"words": "m"}))[0])
    # The /init block and the skill.
    block = http.ok("POST", "/init", json={"url": "https://stash.test"})["prompt"]
    skill = SKILL.read_text(encoding="utf-8")
    for doc in (block, skill):
        for command in indented_commands(doc):
            for name, marker in (
                ("note", '/note"'),
                ("recall", "<regex>"),
                ("zoom", '/zoom"'),
                ("import", '/import"'),
                ("nap 0-1", "\n0-1 <your line>\n"),
                ("batch 0-1", "<your line for 0-1>"),
                ("recall page", "<the same regex>"),
                ("words", "<words>"),
            ):
                if command.startswith("curl ") and marker in command:
                    saw(name, command)
    # The client, on the same memory (its batch at the default PART_CHARS, which a batch fills; its recall
    # pages at the small one).
    http.ok("POST", "/config", m.token, json={"PART_CHARS": None})
    for name, args in (("client nap 0-1", ("nap",)), ("client batch", ("nap", "--batch", "3"))):
        done = subprocess.run(["stash", *args], env=m.env, capture_output=True, text=True, timeout=TIMEOUT)
        saw(name, orders(done.stdout)[-1 if "batch" in name else 0])
    http.ok("POST", "/config", m.token, json={"PART_CHARS": 40})
    done = subprocess.run(["stash", "recall", "m"], env=m.env, capture_output=True, text=True, timeout=TIMEOUT)
    saw("client recall page", orders(done.stdout)[0])
    done = subprocess.run(
        ["stash", "recall", "--words", "m"], env=m.env, capture_output=True, text=True, timeout=TIMEOUT
    )
    saw("client words page", orders(done.stdout)[0])
    fresh = Memory(http, env)
    done = subprocess.run(["stash", "wake"], env=fresh.env, capture_output=True, text=True, timeout=TIMEOUT)
    saw("client note", orders(done.stdout)[0])
    for command in indented_commands(skill):
        for name, start in (
            ("client recall", "stash recall - <<"),
            ("client import", "stash import -"),
            ("client words", "stash recall --words - <<"),
        ):
            if command.startswith(start):
                saw(name, command)

    canonical = {
        "note": instructions.render(instructions.note()),
        "nap 0-1": instructions.render(instructions.nap("0-1")),
        "batch": instructions.render(instructions.nap_summaries(["0-1", "2-3", "4-5"])),
        "batch 0-1": instructions.render(instructions.nap_summaries(["0-1"])),
        "recall": instructions.render(instructions.recall()),
        "recall page": instructions.render(instructions.recall(4)),
        "zoom": instructions.render(instructions.zoom()),
        "import": instructions.render(instructions.import_()),
        "client note": client_module.SHELL.note(),
        "client nap 0-1": client_module.SHELL.nap("0-1"),
        "client batch": client_module.SHELL.nap_summaries(["0-1", "2-3", "4-5"]),
        "client recall": client_module.SHELL.recall(),
        "client recall page": client_module.SHELL.recall(4),
        "client import": "stash import - <<'STASH_END'\nYYYY-MM-DD <one line>\nSTASH_END",
        "words": instructions.render(instructions.recall_words()),
        "words page": instructions.render(instructions.recall_words(CURSOR)),
        "client words": client_module.SHELL.recall_words(),
        "client words page": client_module.SHELL.recall_words(CURSOR),
    }
    for name, seen in got.items():
        want = canonical[name]
        # The file form of an import takes a file the agent writes, not a line pasted in: not a template.
        seen = [s for s in seen if not s.endswith(("@memories.txt", "import memories.txt"))]
        if "recall page" in name:  # the page printed names its own `before`
            seen = [re.sub(r"before \d+", "before 4", s) for s in seen]
        if "words page" in name:
            seen = [re.sub(r"before w1[0-9.-]+", f"before {CURSOR}", s) for s in seen]
        assert set(seen) == {want}, (name, seen, want)
    assert set(got) == set(canonical), set(canonical) - set(got)
    return canonical


# ---------------------------------------------------------------- the fuzz


def test_every_printed_template_takes_every_line(
    http: Http, env: dict[str, str], printed: dict[str, str], tmp_path: Path
) -> None:
    today = dt.datetime.now(dt.UTC).date().isoformat()
    cwd = tmp_path / "cwd"
    per_shell = split_lines(LINES)

    # note (server, /init block, skill): a sample of lines per shell, one command each.
    m = Memory(http, env)
    for shell, lines in per_shell.items():
        lines = lines[:PER_REQUEST]
        done = run(shell, "\n".join(fill(printed["note"], "<one line>", t) for t in lines), m.env, cwd)
        assert done.stdout.count("Saved as #") == len(lines), (shell, done.stderr)
    assert m.texts() == [t for lines in per_shell.values() for t in lines[:PER_REQUEST]]

    # import (server, skill): every line in one here-document per shell.
    m = Memory(http, env)
    for shell, lines in per_shell.items():
        body = fill(printed["import"], "YYYY-MM-DD <one line>", "\n".join(f"{today} {t}" for t in lines))
        assert run(shell, body, m.env, cwd).stdout.startswith(f"Imported {len(lines)} notes")
    assert m.texts() == [t for lines in per_shell.values() for t in lines]

    # A batch of summaries (server, skill): every line, one command per shell.
    for shell, lines in per_shell.items():
        m = Memory(http, env)
        m.import_(2 * len(lines))
        template = orders(http.ok("POST", "/nap", m.token, json={"batch": len(lines)})["prompt"])[0]
        script = template
        for k, t in enumerate(lines):
            script = fill(script, f"<your line for {2 * k}-{2 * k + 1}>", t)
        assert run(shell, script, m.env, cwd).stdout.startswith(f"{len(lines)} summaries saved."), shell
        assert m.summaries(len(lines)) == lines

    # A single nap (server, skill): a sample per shell, each its own command for the block due.
    for shell, lines in per_shell.items():
        lines = lines[PER_REQUEST : 2 * PER_REQUEST]
        m = Memory(http, env)
        m.import_(2 * len(lines))
        script = "\n".join(
            fill(instructions.render(instructions.nap(f"{2 * k}-{2 * k + 1}")), "<your line>", t)
            for k, t in enumerate(lines)
        )
        assert run(shell, script, m.env, cwd).stdout.count(" saved.") == len(lines), shell
        assert m.summaries(len(lines)) == lines

    # recall, its next page, and zoom (server, /init block, skill): reads, so more lines. The server
    # searched exactly the regex when the answer is the one a JSON request with that regex gets.
    m = Memory(http, env)
    http.ok("POST", "/import", m.token, json={"entries": [{"date": "2024-01-02", "text": t} for t in LINES]})
    for shell, lines in per_shell.items():
        for name, placeholder in (
            ("recall", "<regex>"),
            ("recall page", "<the same regex>"),
            ("zoom", "<lo-hi>"),
            ("words", "<words>"),
            ("words page", "<the same words>"),
        ):
            chosen = lines[:12] if name in ("recall", "words") else lines[12:16]
            script = "\necho @@@\n".join(fill(printed[name], placeholder, t) for t in chosen)
            got = run(shell, script, m.env, cwd).stdout.split("@@@\n")
            body_of = {
                "zoom": lambda t: {"block": t},
                "recall": lambda t: {"q": t},
                "recall page": lambda t: {"q": t, "before": 4},
                "words": lambda t: {"words": t},
                "words page": lambda t: {"words": t, "before": CURSOR},
            }[name]
            path = "/zoom" if name == "zoom" else "/recall"
            want = [m.text("POST", path, json=body_of(t)) for t in chosen]
            assert got == want, (shell, name)


def test_the_client_templates_take_every_line(
    http: Http, env: dict[str, str], printed: dict[str, str], tmp_path: Path
) -> None:
    today = dt.datetime.now(dt.UTC).date().isoformat()
    cwd = tmp_path / "cwd"
    per_shell = split_lines(LINES)

    # The client's batch and import take every line, one process per shell (the batch command as the
    # client renders it for those blocks: the fixture checked it is the one it prints).
    for shell, lines in per_shell.items():
        m = Memory(http, env)
        m.import_(2 * len(lines))
        script = client_module.SHELL.nap_summaries([f"{2 * k}-{2 * k + 1}" for k in range(len(lines))])
        for k, t in enumerate(lines):
            script = fill(script, f"<your line for {2 * k}-{2 * k + 1}>", t)
        assert run(shell, script, m.env, cwd).stdout.startswith(f"{len(lines)} summaries saved."), shell
        assert m.summaries(len(lines)) == lines
        m = Memory(http, env)
        run(
            shell,
            fill(printed["client import"], "YYYY-MM-DD <one line>", "\n".join(f"{today} {t}" for t in lines)),
            m.env,
            cwd,
        )
        assert m.texts() == lines

    # note, nap and recall start a process each: one of the hardest lines each, through each shell.
    sample = dict(zip(SHELLS, [HOSTILE[0], ORDINARY[0], HOSTILE[4]]))
    m = Memory(http, env)
    for shell, t in sample.items():
        run(shell, fill(printed["client note"], "<one line>", t), m.env, cwd)
    assert m.texts() == list(sample.values())
    m.http.ok("POST", "/import", m.token, json={"entries": [{"date": today, "text": "x"}] * len(sample)})
    for k, (shell, t) in enumerate(sample.items()):
        run(shell, fill(client_module.SHELL.nap(f"{2 * k}-{2 * k + 1}"), "<your line>", t), m.env, cwd)
    assert m.summaries(len(sample)) == list(sample.values())
    for shell, t in sample.items():
        got = run(shell, fill(printed["client recall"], "<regex>", t), m.env, cwd).stdout
        assert (
            got
            == subprocess.run(
                ["stash", "recall", "--", t], env=m.env, capture_output=True, text=True, timeout=TIMEOUT
            ).stdout
        ), shell
        got = run(shell, fill(printed["client words"], "<words>", t), m.env, cwd).stdout
        assert (
            got
            == subprocess.run(
                ["stash", "recall", "--words", "--", t], env=m.env, capture_output=True, text=True, timeout=TIMEOUT
            ).stdout
        ), shell


@pytest.mark.parametrize(
    "name",
    [
        "note",
        "nap 0-1",
        "recall",
        "zoom",
        "import",
        "client note",
        "client nap 0-1",
        "client recall",
        "client import",
        "words",
        "client words",
    ],
)
def test_a_line_equal_to_the_delimiter_is_harmless(
    name: str, http: Http, env: dict[str, str], printed: dict[str, str], tmp_path: Path
) -> None:
    """The one line no note, summary or pattern accepts, pasted anyway: where
    the placeholder stands alone on its line it closes the here-document
    early, the request carries nothing and the stray delimiter line after it
    is a command that does not exist; where it follows a block id or a date,
    the server refuses it. Either way nothing is stored and nothing else
    runs."""
    m = Memory(http, env)
    m.import_(2)
    before = http.ok("GET", "/wake", m.token)
    template = printed[name].replace("YYYY-MM-DD", dt.datetime.now(dt.UTC).date().isoformat())
    placeholder = next(p for p in ("<one line>", "<your line>", "<regex>", "<lo-hi>", "<words>") if p in template)
    shell = SHELLS[len(name) % len(SHELLS)]
    if True:
        done = run(shell, fill(template, placeholder, DELIMITER), m.env, tmp_path / "cwd")
        assert DELIMITER in done.stdout + done.stderr and "Saved" not in done.stdout, (shell, done.stdout)
    after = http.ok("GET", "/wake", m.token)
    assert after["lines"] == before["lines"] and after["nap"] == before["nap"]


class BoundMemory(Memory):
    """A memory other than main, reached by a full capability bound to it at
    an address ending in /m/{name}, as POST /grants {"memory"} hands it over;
    read back through its owner at /m/{name}."""

    def __init__(self, http: Http, env: dict[str, str]) -> None:
        self.http = http
        self.owner = http.init()["token"]
        http.ok("POST", "/memories", self.owner, json={"name": "fz"})
        minted = http.ok("POST", "/grants", self.owner, json={"scope": "full", "memory": "fz"})
        self.token = minted["token"]
        assert (
            f"{env['STASH_URL'].rstrip('/')}/m/fz"
            in http.ok("POST", "/grants", self.owner, json={"scope": "read", "memory": "fz", "url": env["STASH_URL"]})[
                "prompt"
            ]
        )
        self.env = {**env, "STASH_URL": f"{env['STASH_URL'].rstrip('/')}/m/fz", "STASH_TOKEN": self.token}
        http.ok("POST", "/m/fz/config", self.token, json={"PART_CHARS": PART_CHARS_MAX})

    def texts(self) -> list[str]:
        lines = self.http.ok("POST", "/m/fz/recall", self.owner, json={"q": "."})["matches"]
        return [line.split(" ", 2)[2] for line in lines]

    def text(self, method: str, path: str, **kw) -> str:
        return super().text(method, f"/m/fz{path}", **kw)


def test_the_templates_take_every_line_at_an_address_ending_in_m_name(
    http: Http, env: dict[str, str], printed: dict[str, str], tmp_path: Path
) -> None:
    """The same templates, unchanged, run by an agent whose STASH_URL ends in
    /m/{name}: what they store lands in that memory, exactly, and the reads
    answer from it. A sample of lines per shell (the full fuzz is above)."""
    today = dt.datetime.now(dt.UTC).date().isoformat()
    cwd = tmp_path / "cwd"
    per_shell = split_lines(LINES)
    m = BoundMemory(http, env)
    stored = []
    for shell, lines in per_shell.items():
        lines = lines[:4]
        done = run(shell, "\n".join(fill(printed["note"], "<one line>", t) for t in lines), m.env, cwd)
        assert done.stdout.count("Saved as #") == len(lines), (shell, done.stderr)
        stored += lines
        body = fill(printed["import"], "YYYY-MM-DD <one line>", "\n".join(f"{today} {t}" for t in lines))
        assert run(shell, body, m.env, cwd).stdout.startswith(f"Imported {len(lines)} notes")
        stored += lines
        run(shell, fill(printed["client note"], "<one line>", lines[0]), m.env, cwd)
        stored.append(lines[0])
    assert m.texts() == stored
    assert http.ok("POST", "/recall", m.owner, json={"q": "."})["total"] == 0  # main holds none of it
    for shell, lines in per_shell.items():
        for name, placeholder in (("recall", "<regex>"), ("zoom", "<lo-hi>")):
            chosen = lines[4:7]
            script = "\necho @@@\n".join(fill(printed[name], placeholder, t) for t in chosen)
            got = run(shell, script, m.env, cwd).stdout.split("@@@\n")
            body_of = {"zoom": lambda t: {"block": t}, "recall": lambda t: {"q": t}}[name]
            assert got == [m.text("POST", f"/{name}", json=body_of(t)) for t in chosen], (shell, name)
