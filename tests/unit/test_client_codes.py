"""Every error code the server declares (stash/web/codes.py, the one declaration) raises, in the library,
the exception class its status names in stash/CLIENT.md ("The Python library"), and the command reports
it as a refusal (exit 1), never as "no Stash server answered" (exit 3). The table below is that page's
list, written from it; the codes come from the declaration, so a code added there is checked here at once.
tests/e2e/test_library.py raises the codes themselves from a real server."""

from __future__ import annotations

import pytest

from stash import client
from stash.client import (
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    Misdirected,
    NapNeeded,
    NotAllowed,
    NotFound,
    RateLimited,
    ServerError,
    TooLarge,
    Unauthorized,
    Unreachable,
    error_class,
)
from stash.web.codes import CODES

BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: NotAllowed,
    409: Conflict,
    413: TooLarge,
    421: Misdirected,
    422: Invalid,
    429: RateLimited,
}
BY_CODE = {"wake.needs_nap": NapNeeded}


# Codes only POST /mcp answers: the library never calls it (an MCP host does), so they need no class of theirs.
MCP_ONLY = {code for code in CODES if code.startswith("mcp.")}


@pytest.mark.parametrize("code", sorted(set(CODES) - MCP_ONLY))
def test_each_declared_code_raises_the_class_of_its_status(code: str) -> None:
    status = CODES[code].status
    expected = BY_CODE.get(code) or BY_STATUS.get(status) or (ServerError if status >= 500 else None)
    assert expected is not None, f"{code}: status {status} has no class in CLIENT.md's list"
    assert error_class(code, status) is expected
    error = error_class(code, status)("a message", code, status, {"error": code, "message": "a message"})
    assert not isinstance(error, Unreachable)
    failure = client.refused(error)
    assert (failure.code, failure.status, failure.body) == (client.REFUSED, status, error.body)


def test_no_answer_is_unreachable_and_exit_3() -> None:
    failure = client.refused(Unreachable("stash: cannot reach the server"))
    assert (failure.code, failure.status, failure.body) == (client.UNREACHABLE, None, None)


def test_an_export_that_fails_its_check_is_a_server_error() -> None:
    """A 200 whose archive is not what a Stash export is (here: not a tar.gz) raises ServerError from the
    library, and the command reports it as a refusal; a scripted peer on loopback serves it."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Peer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"not a tar")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Peer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServerError) as broken:
            client.Stash(f"http://127.0.0.1:{server.server_port}", None, pin=False).archive()
    finally:
        server.shutdown()
    assert broken.value.status == 0 and "not a readable tar.gz" in broken.value.message
    assert client.refused(broken.value).code == client.REFUSED
