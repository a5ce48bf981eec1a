"""Plain text in and out, for agents that use only curl (docs/DESIGN.md,
"HTTP surface").

In: the ``text/plain`` bodies of note, nap, recall, zoom and import, each the
lines an agent writes into a printed here-document, read into the same fields
a JSON body carries. Out: the answer rendered as OptMem's ``memo`` prints it,
for a request whose ``Accept`` prefers ``text/plain``; JSON stays the default.
Every command in a text answer is rendered from the answer's ``run`` steps as
a ``Run:`` line of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..core.errors import Malformed
from ..core.lines import plural
from ..service import instructions

ERROR_HEADER = "Stash-Error"


# ---------------------------------------------------------------- bodies in


def _rows(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.strip()]


def _pair(line: str, n: int, what: str) -> tuple[str, str]:
    head, sep, rest = line.partition(" ")
    if not sep:
        raise Malformed(f"Line {n + 1} must be {what}.", code="request.bad_plain")
    return head, rest


def note_body(text: str) -> dict[str, Any]:
    """The whole body is the memory."""
    return {"text": text}


def nap_body(text: str) -> dict[str, Any]:
    """``lo-hi text`` lines: none asks what is due, one settles that block,
    several settle them in order (a batch)."""
    pairs = [_pair(line, n, "a block and its summary, like: 0-1 chose SQLite") for n, line in enumerate(_rows(text))]
    if not pairs:
        return {}
    if len(pairs) == 1:
        return {"block": pairs[0][0], "text": pairs[0][1]}
    return {"summaries": [{"block": b, "text": t} for b, t in pairs]}


def recall_body(text: str) -> dict[str, Any]:
    """The pattern, exactly as its first line holds it; a second line
    ``before N`` asks for the page before memory N. A second line ``#words``
    makes the first line words instead (docs/DESIGN.md, "Word search"), and
    ``#words before CURSOR`` asks for the page a words search's ``more``
    named. The ``#`` is there for the shell: should a pasted line close a
    here-document early, the marker line left over is a comment, not a
    command."""
    q, *rest = text.split("\n")
    if not rest:
        return {"q": q}
    word, _, n = rest[0].partition(" ")
    if len(rest) == 1 and word == "#words":
        cursor = n.removeprefix("before ")
        if not n:
            return {"words": q}
        if cursor != n and cursor:
            return {"words": q, "before": cursor}
    if len(rest) != 1 or word != "before":
        raise Malformed(
            "A recall body is the pattern on one line, then optionally a line `before N`; or words on "
            "one line, then a line `#words` (or `#words before CURSOR`).",
            code="request.bad_plain",
        )
    return {"q": q, "before": n}


def zoom_body(text: str) -> dict[str, Any]:
    return {"block": text.strip()}


def import_body(text: str) -> dict[str, Any]:
    """``YYYY-MM-DD text`` lines, oldest first (blank lines skipped)."""
    entries = []
    for n, line in enumerate(_rows(text)):
        date, text_ = _pair(line, n, "a date and a note, like: 2026-01-31 chose SQLite")
        entries.append({"date": date, "text": text_})
    return {"entries": entries}


# ---------------------------------------------------------------- answers out


def wants_text(request: Request) -> bool:
    """``Accept`` names ``text/plain`` with a higher weight than JSON (or
    first, at equal weight)."""
    best: dict[str, tuple[float, int]] = {}
    for pos, item in enumerate(request.headers.get("accept", "").split(",")):
        media, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for p in params:
            name, _, value = p.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        media = media.lower()
        if media in ("text/plain", "application/json") and media not in best:
            best[media] = (q, -pos)
    text = best.get("text/plain")
    return text is not None and text[0] > 0 and text > best.get("application/json", (0.0, 0))


def _runs(answer: dict[str, Any]) -> list[str]:
    run = answer.get("run") or []
    return [instructions.run_lines(run)] if run else []


def _nap(nap: Any) -> list[str]:
    return ["", nap["prompt"]] if isinstance(nap, dict) else []


def _wake(a: dict[str, Any]) -> list[str]:
    out = []
    if a["parts"] > 1:
        out.append(f"Your memory, part {a['part']} of {a['parts']}, oldest first ({plural(a['T'], 'memory')}).")
    out += a["lines"]
    if not a["awake"]:
        return out + ["Not awake yet.", *_runs(a)]
    return out + [a["message"], *_runs(a), *_nap(a.get("nap"))]


def _nap_answer(a: dict[str, Any]) -> list[str]:
    if "batch" in a:
        return [a["prompt"]] if a.get("prompt") else [a["message"]]
    nap = a.get("nap")
    if nap and a["saved"] is None and a["message"] == f"Compress {nap['block']} next.":
        return [nap["prompt"]]  # asked what is due: the prompt alone, as memo prints it
    out = [a["message"]]
    return out + (_nap(nap) if nap else [] if a["message"].startswith("Nothing") else ["Nothing left to compress."])


def _recall(a: dict[str, Any]) -> list[str]:
    return [*a["matches"], a["message"], *_runs(a)]


def _forget(a: dict[str, Any]) -> list[str]:
    return [
        f"Forgot {plural(len(a['dropped']), 'summary')}: {', '.join(a['dropped'])}. The log is untouched; "
        "the next naps write them again.",
        *_runs(a),
        *_nap(a.get("nap")),
    ]


def _import(a: dict[str, Any]) -> list[str]:
    n = a["last"] - a["first"] + 1
    out = [f"Imported {plural(n, 'note')}, #{a['first']} to #{a['last']}."]
    if a["pending"]:
        out.append(f"{plural(a['pending'], 'compression')} pending.")
    return out + _runs(a)


def _init(a: dict[str, Any]) -> list[str]:
    return [
        f"export STASH_TOKEN={a['token']}",
        "",
        a["note"],
        "",
        "Paste this block at the top of your AGENTS.md:",
        "",
        a["prompt"].rstrip("\n"),
    ]


def _generic(a: Any) -> list[str]:
    if not isinstance(a, dict):
        return [orjson.dumps(a).decode()]
    return [f"{k}: {v if isinstance(v, str) else orjson.dumps(v).decode()}" for k, v in a.items()]


_RENDER: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "/wake": _wake,
    "/note": lambda a: [f"Saved as #{a['id']}.", *_nap(a.get("nap"))],
    "/nap": _nap_answer,
    "/recall": _recall,
    "/zoom": lambda a: list(a["lines"]),
    "/forget": _forget,
    "/import": _import,
    "/init": _init,
}


def answer_text(path: str, answer: Any) -> str:
    """A route's JSON answer as memo's plain text."""
    render: Callable[[dict[str, Any]], list[str]] = _RENDER.get(path, _generic)
    return "\n".join(render(answer) if isinstance(answer, dict) else _generic(answer)) + "\n"


def error_text(body: dict[str, Any]) -> str:
    """A refusal: its message, then the nap it carries and what to run."""
    return "\n".join([body["message"], *_nap(body.get("nap")), *_runs(body)]) + "\n"


def as_text(path: str, response: Response) -> Response:
    """``response`` (a :class:`~stash.web.jsonio.JSON`) as plain text, with
    its status and headers; a refusal's code in the ``Stash-Error`` header."""
    content = getattr(response, "content", None)
    if content is None:
        return response
    status = response.status_code
    is_error = status >= 400 and isinstance(content, dict) and "error" in content
    text = error_text(content) if is_error else answer_text(path, content)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-type", "content-length")}
    if is_error:
        headers[ERROR_HEADER] = content["error"]
    return PlainTextResponse(text, status_code=status, headers=headers, media_type="text/plain; charset=utf-8")
