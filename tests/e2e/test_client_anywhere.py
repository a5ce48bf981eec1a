"""The client works anywhere (issue 12 item 7): UTF-8 output whatever the
locale, no traceback ever, and a zoom past the end names a block that
opens."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.api import matched
from tests.support.server import CLI_TIMEOUT, Cli, Http

pytestmark = pytest.mark.slow

NON_UTF8 = [
    {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"},  # ASCII, as a bare container has
    {"PYTHONIOENCODING": "latin-1", "PYTHONUTF8": "0"},  # a terminal that cannot encode →
]


def run_bytes(cli: Cli, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*cli.argv0, *args], env=env, capture_output=True, timeout=CLI_TIMEOUT)


@pytest.mark.parametrize("locale", NON_UTF8, ids=["ascii", "latin-1"])
def test_output_is_utf8_whatever_the_locale(cli: Cli, http: Http, token: str, locale: dict[str, str]) -> None:
    http.ok("POST", "/note", token, json={"text": "moved A → B, ünïcödé 😀"})
    env = {k: v for k, v in cli.env.items() if k not in ("PYTHONIOENCODING", "LANG")} | locale
    for args in (("wake",), ("recall", "moved"), ("--json", "wake")):
        done = run_bytes(cli, *args, env=env)
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode("utf-8")
        assert "A → B, ünïcödé 😀" in out and b"Traceback" not in done.stderr
    refused = run_bytes(cli, "note", "→" * 300, env=env)
    assert refused.returncode == 1 and b"Traceback" not in refused.stderr
    refused.stderr.decode("utf-8")


def test_zoom_past_the_end_names_a_block_that_opens(cli: Cli, http: Http, token: str) -> None:
    for i in range(4):
        http.ok("POST", "/note", token, json={"text": f"z{i}"})
    done = cli.run("zoom", "8-15")
    assert done.returncode == 1
    assert "holds 4 notes (#0 to #3)" in done.stderr and "curl" not in done.stderr
    # The wake of 4 memories prints each word for word: the hint and the order name a block that still opens.
    block = matched(re.search(r"like (\d+-\d+)\.", done.stderr)).group(1)
    assert block == "0-3"
    assert re.search(rf"^Run: .*stash zoom {block}$", done.stderr, re.M), done.stderr
    assert cli.ok("zoom", block).splitlines() == ["#0-1 not compressed yet", "#2-3 not compressed yet"]


class _Odd(BaseHTTPRequestHandler):
    """A server that answers 200 with JSON of the wrong shape."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"[1, 2]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST


@pytest.fixture
def odd_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_no_traceback_even_from_an_answer_of_the_wrong_shape(cli: Cli, odd_server: str) -> None:
    env = {**cli.env, "STASH_URL": odd_server}
    for args in (("wake",), ("note", "x"), ("recall", "x"), ("zoom", "0-1"), ("nap",)):
        done = cli.run(*args, env=env)
        assert done.returncode != 0, args
        assert "Traceback" not in done.stderr and done.stderr.startswith("stash: "), (args, done.stderr)
        assert cli.env["STASH_TOKEN"] not in done.stderr + done.stdout
