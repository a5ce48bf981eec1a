#!/usr/bin/env python3
"""stash — the command-line client of a Stash memory server.

One file, Python 3 standard library only: fetch it from any server with

    curl -o stash "$STASH_URL/client" && chmod +x stash

It reads two environment variables, the whole integration:

    STASH_URL    the server's address, like https://stash.example
    STASH_TOKEN  your capability (a secret: never print it, never commit it)

Every instruction it prints is a command that runs as printed. The server's
prompts end with a line "Run: curl ..."; this client swaps each such curl
command for its own equivalent verb.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["VERBS", "main"]

VERBS = {
    "init": "mint a new memory on URL: prints its token once, the two export lines and the block for AGENTS.md",
    "wake": "read the wake, part by part, until it says you are awake",
    "note": "record one line of lasting effect",
    "nap": "show the due compression, or answer it: nap <block> \"<line>\"",
    "recall": "search every memory, word for word, with a regex",
    "zoom": "open a block of the wake into its two halves",
    "forget": "drop a bad summary and every summary built on it",
    "config": "show the sizes, or set them: config NAME=VALUE (empty value restores the default)",
    "import": "bulk-append dated memories from a file of 'YYYY-MM-DD text' lines",
    "grants": "list capabilities, mint one (read | full), or revoke one (revoke ID)",
    "erase": "shred memories for good by id (owner): erase ID [ID ...]",
    "erasures": "list the erasure receipts (owner)",
    "destroy": "destroy this whole memory and every token of it (owner): destroy --yes",
    "export": "download the whole memory as an OptMem-readable tar.gz",
    "health": "check that the server answers, and which ciphers it uses",
}

TIMEOUT = 30.0
LONG_TIMEOUT = 300.0
IMPORT_BATCH_BYTES = 8 * 1024 * 1024  # well under the server's 16 MiB import cap
_DATED = re.compile(r"(?:#\d+\s+)?(\d{4}-\d{2}-\d{2})\s+(.*)")
_CURL = re.compile(
    r"curl -s -H \"Authorization: Bearer \$STASH_TOKEN\"(?: -X (?P<method>[A-Z]+))?"
    r" \"\$STASH_URL/(?P<path>[a-z]+)(?:\?(?P<query>[^\"]*))?\"(?: -d '(?P<body>[^']*)')?"
)


# Exit statuses a script can rely on (API-REFERENCE.md, "The stash client").
OK = 0
REFUSED = 1  # the server answered with an error: its message is on stderr
USAGE = 2  # wrong arguments, STASH_URL or STASH_TOKEN unset or malformed, an unreadable file
UNREACHABLE = 3  # no answer from a Stash server: connection, DNS, timeout, or not Stash at that address

# --json: print each answer of the server as it came, one JSON document per line, instead of text.
_JSON = {"on": False}


class Failure(Exception):
    """A refusal to report: ``message`` goes to stderr, ``code`` is the exit status;
    ``body`` is the server's error object, printed on stdout under --json."""

    def __init__(self, message: str, code: int = REFUSED, extra: str | None = None,
                 body: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.extra = extra
        self.body = body


# ---------------------------------------------------------------- the command this client is run as


def _prog() -> str:
    """The shell words that run this client again, so that printed commands
    run as printed: ``stash`` when that is on PATH, else how we were started."""
    if shutil.which("stash"):
        return "stash"
    a0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(a0) == "__main__.py":
        return f"{shlex.quote(sys.executable)} -m stash"
    if a0 and os.path.isfile(a0):
        return f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(a0))}"
    return "stash"


def _quote_text(placeholder: str) -> str:
    return f'"{placeholder}"'


def _translate(match: re.Match) -> str:
    """One of the server's curl commands as this client's verb; unknown forms
    stay as they are, since they run as printed anyway."""
    prog = _prog()
    path = match.group("path")
    query = urllib.parse.parse_qs(match.group("query") or "")
    body: dict = {}
    if match.group("body"):
        try:
            body = json.loads(match.group("body"))
        except ValueError:
            return match.group(0)
    if path == "wake":
        if "part" in query and "T" in query:
            return f"{prog} wake {int(query['part'][0])} {int(query['T'][0])}"
        return f"{prog} wake"
    if path == "nap":
        if body.get("block") and "text" in body:
            return f"{prog} nap {body['block']} {_quote_text(body['text'])}"
        if not body:
            return f"{prog} nap"
    if path == "note" and "text" in body:
        return f"{prog} note {_quote_text(body['text'])}"
    return match.group(0)


def localize(text: str) -> str:
    """The server's instruction text with each of its curl commands replaced
    by the equivalent command of this client."""
    return _CURL.sub(_translate, text)


# ---------------------------------------------------------------- HTTP


def _env(name: str, hint: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise Failure(f"stash: {name} is not set. {hint}", USAGE)
    return value


def _shown(url: str) -> str:
    """The address without any user:password part, fit to print."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def server_url(fallback: str | None = None, explicit: str | None = None) -> str:
    url = (explicit or "").strip() or os.environ.get("STASH_URL", "").strip() or (fallback or "")
    if not url:
        raise Failure("stash: STASH_URL is not set. Set it to the server's address, like "
                      "export STASH_URL=https://stash.example", USAGE)
    if not url.startswith(("http://", "https://")):
        raise Failure(f"stash: STASH_URL must start with http:// or https:// (it is {_shown(url)!r}).", USAGE)
    return url.rstrip("/")


def token() -> str:
    return _env("STASH_TOKEN", "Set it to your capability (export STASH_TOKEN=...); "
                f"a new memory gets one from: {_prog()} init")


class Api:
    def __init__(self, url: str, tok: str | None) -> None:
        self.url = url
        self._token = tok

    def call(self, method: str, path: str, body: object = None, *, query: dict | None = None,
             raw: bool = False, timeout: float = TIMEOUT):
        target = self.url + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        data = None
        headers = {"Accept": "application/json", "User-Agent": "stash-client/1"}
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(target, data=data, headers=headers, method=method)  # noqa: S310 - http(s) only
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) checked above
                payload = resp.read()
        except urllib.error.HTTPError as err:
            raise self._refusal(err) from None
        except urllib.error.URLError as err:
            raise Failure(f"stash: cannot reach the server at STASH_URL={_shown(self.url)} "
                          f"({_reason(err.reason)}). Check the address and that the server is running.",
                          UNREACHABLE) from None
        except (TimeoutError, socket.timeout):  # noqa: UP041 - distinct classes before Python 3.10
            raise Failure(f"stash: the server at STASH_URL={_shown(self.url)} did not answer within "
                          f"{timeout:.0f} s; try again.", UNREACHABLE) from None
        except OSError as err:
            raise Failure(f"stash: the connection to STASH_URL={_shown(self.url)} failed "
                          f"({_reason(err)}); try again.", UNREACHABLE) from None
        if raw:
            return payload
        try:
            answer = json.loads(payload.decode("utf-8"))
        except ValueError:
            raise Failure(f"stash: the server at STASH_URL={_shown(self.url)} did not answer JSON; "
                          "is that the address of a Stash server?", UNREACHABLE) from None
        if _JSON["on"]:
            _emit_json(answer)
        return answer

    def _refusal(self, err: urllib.error.HTTPError) -> Failure:
        try:
            body = json.loads(err.read().decode("utf-8"))
        except (ValueError, OSError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("message"), str):
            return Failure(f"stash: the server at STASH_URL={_shown(self.url)} answered HTTP {err.code} "
                           "without a Stash error; is that the address of a Stash server?", UNREACHABLE)
        extra = None
        nap = body.get("nap")
        if isinstance(nap, dict) and isinstance(nap.get("prompt"), str):
            extra = localize(nap["prompt"])
        return Failure(localize(body["message"]), REFUSED, extra, body)


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    text = getattr(reason, "strerror", None) or str(reason)
    return text or type(reason).__name__


def _out(text: str = "") -> None:
    """The plain-text answer; under --json the server's own answers stand in for it."""
    if not _JSON["on"]:
        sys.stdout.write(text + "\n")


def _emit_json(answer: object) -> None:
    sys.stdout.write(json.dumps(answer, ensure_ascii=False) + "\n")


def _nap_prompt(nap: object) -> None:
    if isinstance(nap, dict) and isinstance(nap.get("prompt"), str):
        _out()
        _out(localize(nap["prompt"]))


def _api(need_token: bool = True, fallback_url: str | None = None) -> Api:
    url = server_url(fallback_url)
    return Api(url, token() if need_token else None)


# ---------------------------------------------------------------- verbs


def do_init(args: argparse.Namespace) -> int:
    """Mint a memory on the server named by URL (else STASH_URL); print its
    token once, as the two export lines, then the block for AGENTS.md. The
    address written into the block is --url, else URL; with neither, the
    server chooses (its own --url, else the address it was called at)."""
    api = Api(server_url(args.url, explicit=args.server), None)
    public = (args.url or args.server or "").rstrip("/")
    ans = api.call("POST", "/init", {"url": public} if public else {})
    _out(f"export STASH_URL={shlex.quote(public or api.url)}")
    _out(f"export STASH_TOKEN={ans['token']}")
    _out()
    if ans.get("note"):
        _out(ans["note"])
        _out()
    _out("Paste this block at the top of your AGENTS.md:")
    _out()
    _out(ans.get("prompt", "").rstrip("\n"))
    return 0


def do_wake(args: argparse.Namespace) -> int:
    query = {}
    if args.part is not None:
        query["part"] = args.part
    if args.T is not None:
        if args.part is None:
            raise Failure("stash: give the part before T, both as the previous part printed them.", USAGE)
        query["T"] = args.T
    ans = _api().call("GET", "/wake", query=query or None)
    for line in ans.get("lines", []):
        _out(line)
    if not ans.get("awake"):
        _out(f"Not awake yet. Run: {_prog()} wake {int(ans['part']) + 1} {int(ans['T'])}")
        return 0
    message = ans.get("message") or "You are awake."
    _out(localize(message))
    _nap_prompt(ans.get("nap"))
    return 0


def do_note(args: argparse.Namespace) -> int:
    text = _text(args.text, "note")
    ans = _api().call("POST", "/note", {"text": text})
    _out(f"Noted #{ans['id']}.")
    _nap_prompt(ans.get("nap"))
    return 0


def do_nap(args: argparse.Namespace) -> int:
    api = _api()
    if args.block is None:
        ans = api.call("POST", "/nap", {})
    else:
        ans = api.call("POST", "/nap", {"block": args.block, "text": _text(args.text, "summary")})
    message = ans.get("message") or (f"{ans['saved']} saved." if ans.get("saved") else "")
    if message:
        _out(localize(message))
    if ans.get("nap"):
        _nap_prompt(ans["nap"])
    elif not message.startswith("Nothing"):
        _out("Nothing left to compress.")
    return 0


def do_recall(args: argparse.Namespace) -> int:
    # The POST twin keeps the pattern (memory text) out of every URL and access log.
    ans = _api().call("POST", "/recall", {"q": args.regex})
    matches = ans.get("matches", [])
    total = int(ans.get("total", len(matches)))
    for line in matches:
        _out(line)
    if total == 0:
        _out("No matches.")
    elif total > len(matches):
        _out(f"Newest {len(matches)} of {total} matches. Narrow the regex.")
    return 0


def do_zoom(args: argparse.Namespace) -> int:
    ans = _api().call("GET", "/zoom", query={"block": args.block})
    for line in ans.get("lines", []):
        _out(line)
    return 0


def do_forget(args: argparse.Namespace) -> int:
    ans = _api().call("POST", "/forget", {"block": args.block})
    dropped = ans.get("dropped", [])
    _out(f"Dropped {', '.join(dropped)}. The log is untouched; the next naps write them again.")
    _out(f"Run: {_prog()} nap")
    return 0


def _config_value(text: str) -> object:
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        return text  # the server says which values it takes


def do_config(args: argparse.Namespace) -> int:
    api = _api()
    if args.changes:
        changes = {}
        for item in args.changes:
            name, eq, value = item.partition("=")
            if not eq or not name:
                raise Failure(f"stash: {item!r} is not NAME=VALUE; an empty VALUE restores the default.", USAGE)
            changes[name.strip()] = _config_value(value.strip())
        ans = api.call("POST", "/config", changes)
    else:
        ans = api.call("GET", "/config")
    sizes = ans.get("sizes", {})
    defaults = ans.get("defaults", {})
    for name, value in sizes.items():
        mark = "" if defaults.get(name) == value else f"  (default {defaults.get(name)})"
        _out(f"{name}={value}{mark}")
    return 0


def read_entries(path: str) -> list[dict]:
    """``YYYY-MM-DD text`` lines, oldest first; blank lines are skipped and a
    leading ``#i`` (OptMem's LOG.txt record) is accepted and dropped."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as err:
        raise Failure(f"stash: cannot read {path}: {err.strerror or err}.", USAGE) from None
    except UnicodeDecodeError:
        raise Failure(f"stash: {path} is not UTF-8 text.", USAGE) from None
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.rstrip()
        if not line.strip():
            continue
        m = _DATED.fullmatch(line.strip())
        if not m:
            raise Failure(f"stash: {path} line {n} is not 'YYYY-MM-DD text'; nothing was imported.", USAGE)
        entries.append({"date": m.group(1), "text": m.group(2)})
    if not entries:
        raise Failure(f"stash: {path} holds no 'YYYY-MM-DD text' lines; nothing was imported.", USAGE)
    return entries


def _batches(entries: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = [[]]
    size = 0
    for e in entries:
        n = len(json.dumps(e, ensure_ascii=False).encode("utf-8")) + 2
        if out[-1] and size + n > IMPORT_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(e)
        size += n
    return out


def do_import(args: argparse.Namespace) -> int:
    api = _api()
    entries = read_entries(args.file)
    first = last = pending = None
    done = 0
    for batch in _batches(entries):
        try:
            ans = api.call("POST", "/import", {"entries": batch}, timeout=LONG_TIMEOUT)
        except Failure as f:
            if done:
                f.message += f" (The first {done} entries were imported already; import the rest from there.)"
            raise
        first = ans["first"] if first is None else first
        last, pending = ans["last"], ans["pending"]
        done += len(batch)
    _out(f"Imported {done} memories, #{first} to #{last}.")
    if pending:
        _out(f"{pending} compression{'s are' if pending != 1 else ' is'} due, oldest first.")
        _out(f"Run: {_prog()} nap")
    return 0


def _grant_line(g: dict) -> str:
    parts = [f"#{g.get('id')}", str(g.get("scope", "?"))]
    for key in ("created", "revoked"):
        if g.get(key):
            parts.append(f"{key} {g[key]}")
    if not g.get("revoked") and "revoked" in g:
        parts.append("live")
    return "  ".join(parts)


def do_grants(args: argparse.Namespace) -> int:
    api = _api()
    words = args.words
    if not words:
        ans = api.call("GET", "/grants")
        grants = ans.get("grants", ans) if isinstance(ans, dict) else ans
        for g in grants if isinstance(grants, list) else []:
            _out(_grant_line(g) if isinstance(g, dict) else str(g))
        return 0
    if words[0] in ("read", "full") and len(words) == 1:
        ans = api.call("POST", "/grants", {"scope": words[0]})
        grant = ans.get("grant", ans)
        _out(f"Minted #{grant.get('id', ans.get('id'))}, scope {grant.get('scope', words[0])}. "
             "Its token is shown this once; hand it over as STASH_TOKEN:")
        _out(str(ans.get("token") or grant.get("token")))
        return 0
    if words[0] == "revoke" and len(words) == 2:
        gid = words[1].lstrip("#")
        if not gid.isdigit():
            raise Failure(f"stash: revoke takes the grant's number, as listed by: {_prog()} grants", USAGE)
        api.call("DELETE", f"/grants/{gid}")
        _out(f"Revoked #{gid}: its token opens nothing from now on.")
        return 0
    raise Failure(f"stash: grants takes nothing (list), read or full (mint), or revoke ID; the IDs are listed by: "
                  f"{_prog()} grants", USAGE)


def _receipt_line(r: dict) -> str:
    ids = ", ".join(f"#{i}" for i in r.get("ids", []))
    return f"receipt {r.get('receipt')}  {r.get('at')}  {ids}  ({r.get('dropped', 0)} summaries dropped)"


def do_erase(args: argparse.Namespace) -> int:
    ids = []
    for word in args.ids:
        word = word.lstrip("#")
        if not (word.isascii() and word.isdigit()):
            raise Failure("stash: erase takes memory ids as the wake prints them, like #12 or 12.", USAGE)
        ids.append(int(word))
    ans = _api().call("POST", "/erase", {"ids": ids})
    _out(f"Erased {len(ans.get('erased', []))} of {len(ids)} (the rest were erased before). "
         "Their lines now read [erased] everywhere.")
    _out(_receipt_line(ans))
    if ans.get("dropped"):
        _out(f"Run: {_prog()} nap")
    return 0


def do_erasures(args: argparse.Namespace) -> int:
    for r in _api().call("GET", "/erasures").get("erasures", []):
        _out(_receipt_line(r))
    return 0


def do_destroy(args: argparse.Namespace) -> int:
    if not args.yes:
        raise Failure("stash: destroy deletes this whole memory and every token of it, for good. "
                      f"To go ahead: {_prog()} destroy --yes", USAGE)
    ans = _api().call("DELETE", "/store")
    _out(f"Destroyed: {ans.get('memories')} memories, at {ans.get('at')}. Every token of it now opens nothing.")
    return 0


def do_export(args: argparse.Namespace) -> int:
    target = args.file or "stash-export.tar.gz"
    if target != "-" and os.path.exists(target) and not args.force:
        raise Failure(f"stash: {target} exists; name another file or add --force.", USAGE)
    data = _api().call("GET", "/export", raw=True, timeout=LONG_TIMEOUT)
    if target == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        return 0
    tmp = f"{target}.part"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    _out(f"Wrote {target} ({len(data)} bytes). It unpacks to memory/, which OptMem reads: "
         f"tar xzf {shlex.quote(target)} && MEMORY_DIR=memory memo wake")
    return 0


def do_health(args: argparse.Namespace) -> int:
    ans = _api(need_token=False).call("GET", "/health")
    state = "ok" if ans.get("ok") else "not ok"
    _out(f"{state}: Stash {ans.get('version', '?')} at {_shown(server_url())}; "
         f"content cipher {ans.get('content_cipher', '?')}, file cipher {ans.get('file_cipher', '?')}")
    return 0 if ans.get("ok") else 1


def _text(words: list[str], what: str) -> str:
    text = " ".join(words)
    if text == "-":
        text = sys.stdin.read().rstrip("\n")
    if not text.strip():
        raise Failure(f"stash: the {what} is empty; give one line of text in quotes.", USAGE)
    return text


# ---------------------------------------------------------------- argument parsing


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit; report like every other refusal
        raise Failure(f"stash: {message}. See: {_prog()} --help", USAGE)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="stash",
        description="Client of a Stash memory server. Reads STASH_URL and STASH_TOKEN from the environment.",
        epilog="Start every session with: stash wake. Exit status: 0 done, 1 the server refused (its "
               "message on stderr), 2 a usage mistake, 3 no Stash server answered.",
    )
    json_help = "print the server's raw JSON answer (one document per line) instead of text"
    p.add_argument("--json", action="store_true", help=json_help)
    sub = p.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    def verb(name: str, func) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=VERBS[name], description=VERBS[name])
        sp.set_defaults(func=func)
        # after the verb too (stash wake --json); SUPPRESS keeps a --json given before it
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
        return sp

    sp = verb("init", do_init)
    sp.add_argument("server", nargs="?", metavar="URL", help="the server to mint on (default: STASH_URL)")
    sp.add_argument("--url", help="the public address to write into the AGENTS.md block, when it differs "
                    "from URL (and to call, when neither URL nor STASH_URL is given)")
    sp = verb("wake", do_wake)
    sp.add_argument("part", nargs="?", type=int, help="part to read (default 1)")
    sp.add_argument("T", nargs="?", type=int, help="the snapshot T the first part named")
    sp = verb("note", do_note)
    sp.add_argument("text", nargs="+", help="one line (- reads it from stdin)")
    sp = verb("nap", do_nap)
    sp.add_argument("block", nargs="?", help="the due block, like 0-1 (omit to see what is due)")
    sp.add_argument("text", nargs="*", help="the one-line summary")
    sp = verb("recall", do_recall)
    sp.add_argument("regex", help="case-insensitive regular expression")
    sp = verb("zoom", do_zoom)
    sp.add_argument("block", help="a block of the wake, like 16-31")
    sp = verb("forget", do_forget)
    sp.add_argument("block", help="the summary to drop, like 16-31")
    sp = verb("config", do_config)
    sp.add_argument("changes", nargs="*", metavar="NAME=VALUE")
    sp = verb("import", do_import)
    sp.add_argument("file", help="file of 'YYYY-MM-DD text' lines, oldest first (- for stdin)")
    sp = verb("grants", do_grants)
    sp.add_argument("words", nargs="*", metavar="read|full|revoke ID")
    sp = verb("erase", do_erase)
    sp.add_argument("ids", nargs="+", metavar="ID", help="memory ids, as the wake prints them (#12 or 12)")
    verb("erasures", do_erasures)
    sp = verb("destroy", do_destroy)
    sp.add_argument("--yes", action="store_true", help="confirm: the memory cannot be recovered")
    sp = verb("export", do_export)
    sp.add_argument("file", nargs="?", help="where to write (default stash-export.tar.gz; - for stdout)")
    sp.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    sp = verb("health", do_health)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    try:
        args = p.parse_args(argv)
        if not getattr(args, "func", None):
            p.print_help(sys.stderr)
            return USAGE
        _JSON["on"] = bool(args.json)
        if args.verb == "nap" and args.block is not None and not args.text:
            raise Failure(f'stash: nap {args.block} needs the summary: {_prog()} nap {args.block} "<your line>"',
                          USAGE)
        return args.func(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except Failure as f:
        if _JSON["on"] and f.body is not None:
            _emit_json(f.body)
        sys.stdout.flush()
        sys.stderr.write(f.message.rstrip("\n") + "\n")
        if f.extra:
            sys.stderr.write("\n" + f.extra.rstrip("\n") + "\n")
        return f.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
