"""The tables of the reference that say what the declarations say: in
API-REFERENCE.md each route's field table, the scope matrix and the error-code
table, written from ROUTES (:mod:`stash.web.routes`) and stash/web/codes.py;
in deploy/README.md ``stash serve``'s synopsis and options table, written from
the option declarations (:mod:`stash.web.settings`); in the client
(stash/client.py) the set of writes it sends with an Idempotency-Key, written
from the routes that take one. Prose stays hand-written around them; a
generated table stands between ``<!-- generated: NAME -->`` and
``<!-- end generated -->`` (in Python, each marker behind ``# ``).

    python -m stash.web.refgen --check   # exit 1, naming each stale table
    python -m stash.web.refgen --write   # rewrite them in place
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..service.access import allowed
from .codes import CODES
from .fields import SECURED, Field, Fields, error_codes
from .options import Option
from .routes import ROUTES, RouteSpec
from .schemas import SCHEMAS, Schema
from .settings import OPTIONS

# The checkout's files, from its root, where this is run (CONTRIBUTING): whichever copy of the package runs it
# (the checkout's, or one installed from it), what it checks and rewrites is the checkout's text.
REFERENCE = Path("API-REFERENCE.md")
DEPLOY_GUIDE = Path("deploy", "README.md")
CLIENT = Path("stash", "client.py")
REGENERATE = "python -m stash.web.refgen --write"
END = "<!-- end generated -->"
# Markers stand on lines of their own, so prose may name them.
_REGION = re.compile(r"^((?:# )?)<!-- generated: ([^\n]+?) -->\n(.*?)^\1" + re.escape(END) + "$", re.S | re.M)

# What each kind of token meets at a route of each scope (docs/DESIGN.md, "HTTP surface"): the scope
# matrix's columns. "other user" holds a valid owner token of another memory,
# so it is let in and acts on its own memory only.
MATRIX_COLUMNS = ("none", "bogus", "other user", "read", "full", "owner", "revoked")


def matrix_row(route: RouteSpec) -> dict[str, str]:
    """The status class of a well-formed request to ``route`` by each kind of
    token (a ``/metrics`` caller on loopback, without a metrics token)."""
    if route.scope == "capability":  # any live capability is let in; each of its calls is scoped
        return {column: "401" if column in ("none", "bogus", "revoked") else "2xx" for column in MATRIX_COLUMNS}
    if route.scope not in SECURED:
        return dict.fromkeys(MATRIX_COLUMNS, "2xx")
    row = {"none": "401", "bogus": "401", "revoked": "401", "other user": "2xx"}
    for scope in ("read", "full", "owner"):
        row[scope] = "2xx" if allowed(scope, route.scope) else "403"
    return {column: row[column] for column in MATRIX_COLUMNS}


def _name(route: RouteSpec) -> str:
    return f"{route.method} {route.path}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def line(cells: tuple[str, ...]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)]) + "\n"


# The shared schemas by the names the reference gives them: one, and many.
_REF_WORDS = {
    "BlockId": ("block id", "block ids"),
    "Timestamp": ("UTC time", "UTC times"),
    "Line": ("rendered line", "rendered lines"),
    "Nap": ("nap object", "nap objects"),
    "Head": ("head object", "head objects"),
    "Grant": ("grant", "grants"),
    "Receipt": ("receipt", "receipts"),
}


def describe(schema: Schema, many: bool = False) -> str:
    """A schema in the words of the reference's type column."""
    if "$ref" in schema:
        name: str = schema["$ref"].rsplit("/", 1)[1]
        return _REF_WORDS.get(name, (name, name))[many]
    if "anyOf" in schema:
        return _either([describe(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return _either([f"`{json.dumps(v)}`" for v in schema["enum"]])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type")
    if kind in ("null", "boolean"):
        return "`null`" if kind == "null" else "boolean"
    if kind == "integer":
        return _words("integer", _range(schema.get("minimum"), schema.get("maximum")))
    if kind == "string":
        length = _range(schema.get("minLength"), schema.get("maxLength"))
        words = "string" + (" (date)" if schema.get("format") == "date" else "")
        return f"{words}, {length} characters" if length else words
    if kind == "array":
        count = _range(schema.get("minItems"), schema.get("maxItems"))
        return _words("array of", count, describe(schema.get("items", {}), many=True))
    if kind == "object":
        names = ", ".join(f'"{n}"' for n in schema.get("properties", {}))
        return f"`{{{names}}}`"
    return "any JSON value"


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _words(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _number(n: int) -> str:
    digits = str(n)
    return f"10^{len(digits) - 1}" if n >= 10**6 and digits.strip("0") == "1" else str(n)


def _range(lo: Any, hi: Any) -> str:
    lo, hi = (None if n is None else _number(n) for n in (lo, hi))
    if lo is not None and hi is not None:
        return f"{lo}–{hi}"
    if lo is not None:
        return f"≥ {lo}"
    return "" if hi is None else f"≤ {hi}"


def _default(field: Field) -> str:
    if field.required:
        return "required"
    return field.default_doc or "optional"


def fields_table(fields: Fields) -> str:
    table = _table(
        ("field", "type", "default", ""),
        [
            (f"`{f.name}`", describe(f.schema) + (" or `null`" if f.nullable else ""), _default(f), f.doc)
            for f in fields.items
        ],
    )
    if fields.plain is None:
        return table
    return table + f"\nAs a `text/plain` body (see [Plain text](#plain-text)): {fields.plain_doc}.\n"


def _meaning(schema: Schema) -> str:
    inner = [s.get("description", "") for s in schema.get("anyOf", [])]
    return schema.get("description") or next((d for d in inner if d), "")


def properties_table(schema: Schema) -> str:
    """The fields of an object schema: an answer, or a shared shape."""
    return _table(
        ("field", "type", ""),
        [(f"`{name}`", describe(prop), _meaning(prop)) for name, prop in schema.get("properties", {}).items()],
    )


def scope_matrix(routes: list[RouteSpec]) -> str:
    return _table(("route", *MATRIX_COLUMNS), [(f"`{_name(r)}`", *matrix_row(r).values()) for r in routes])


def _groups(routes: list[RouteSpec]) -> list[tuple[str, set[str]]]:
    """Named sets of routes, so a code every route of a kind answers is listed
    by its kind rather than route by route."""
    named = [
        ("all", routes),
        ("any that reads a body or query", [r for r in routes if r.fields is not None]),
        ("authenticated routes", [r for r in routes if r.scope in SECURED]),
        ("full and owner routes", [r for r in routes if r.scope in ("full", "owner")]),
        ("any that reads a body", [r for r in routes if r.fields is not None and r.method != "GET"]),
        ("any that reads a query", [r for r in routes if r.fields is not None and r.method == "GET"]),
    ]
    return [(name, {_name(r) for r in group}) for name, group in named]


def _who(names: set[str], routes: list[RouteSpec]) -> str:
    parts: list[str] = []
    left = set(names)
    for label, group in _groups(routes):
        if len(group) > 1 and group <= left:
            parts.append(label)
            left -= group
        elif not parts and len(left) > 4 and left < group and len(group - left) <= 2:
            # Nearly all of a kind: named by the kind and the few it leaves out.
            parts.append(f"{label} except " + ", ".join(f"`{_name(r)}`" for r in routes if _name(r) in group - left))
            left = set()
    parts += [f"`{_name(r)}`" for r in routes if _name(r) in left]
    return ", ".join(parts) or "—"


def error_table(routes: list[RouteSpec]) -> str:
    raised_by: dict[str, set[str]] = {code: set() for code in CODES}
    for route in routes:
        for codes in error_codes(route).values():
            for code in codes:
                raised_by[code].add(_name(route))
    return _table(
        ("code", "status", "route(s)", "meaning"),
        [(f"`{code}`", str(c.status), _who(raised_by[code], routes), c.meaning) for code, c in CODES.items()],
    )


def _sharing(routes: list[RouteSpec], part: str) -> dict[str, Any]:
    """The declarations of one kind (``fields`` or ``answer``), once each, by
    the routes that share them: a GET route and its POST twin share theirs."""
    groups: dict[int, tuple[Any, list[str]]] = {}
    for r in routes:
        value = getattr(r, part)
        if value is not None:
            groups.setdefault(id(value), (value, []))[1].append(_name(r))
    return {" · ".join(names): value for value, names in groups.values()}


def regions(routes: list[RouteSpec] | None = None) -> dict[str, str]:
    """The tables the reference must carry, by the name its markers give
    them: the scope matrix, the error codes and every route's field table."""
    routes = [r for r in ROUTES if not r.under] if routes is None else routes
    out = {"scope matrix": scope_matrix(routes), "error codes": error_table(routes)}
    for names, fields in _sharing(routes, "fields").items():
        if fields.items:
            out[f"fields of {names}"] = fields_table(fields)
    return out


def optional_regions(routes: list[RouteSpec] | None = None) -> dict[str, str]:
    """The tables the reference may carry where its prose wants one: a
    route's answer, or a shared shape."""
    routes = [r for r in ROUTES if not r.under] if routes is None else routes
    out = {
        f"answer of {names}": properties_table(answer)
        for names, answer in _sharing(routes, "answer").items()
        if answer.get("properties")
    }
    out |= {f"schema {name}": properties_table(schema) for name, schema in SCHEMAS.items() if schema.get("properties")}
    return out


def serve_usage(options: list[Option], width: int = 72) -> str:
    """``stash serve``'s synopsis, one bracket per option, wrapped at ``width``."""
    words = [f"[{o.shown}]" + ("..." if o.repeat else "") for o in options]
    lines = ["stash serve"]
    for word in words:
        if len(lines[-1]) + 1 + len(word) > width:
            lines.append(" " * len("stash serve"))
        lines[-1] += " " + word
    return "```\n" + "\n".join(lines) + "\n```\n"


def options_table(options: list[Option]) -> str:
    """Every option: its flag, its variable, its default, the values it
    takes, and what it does."""

    def allowed(o: Option) -> str:
        return ", ".join(w for w in ("repeatable" if o.repeat else "", o.allowed_text()) if w)

    return _table(
        ("option", "variable", "default", "takes", ""),
        [
            (f"`{o.shown}`".replace("|", "\\|"), f"`{o.env_var}`", o.default_text(), allowed(o), o.doc or o.help)
            for o in options
        ],
    )


def option_regions(options: list[Option] | None = None) -> dict[str, str]:
    """The tables deploy/README.md must carry: ``stash serve``'s synopsis and its options."""
    options = OPTIONS if options is None else options
    return {"stash serve synopsis": serve_usage(options), "stash serve options": options_table(options)}


def keyed_writes(routes: list[RouteSpec] | None = None) -> str:
    """The client's KEYED_WRITES: every route that takes an Idempotency-Key."""
    routes = [r for r in ROUTES if not r.under] if routes is None else routes
    pairs = sorted({(r.method, r.path) for r in routes if r.idempotent})
    # Laid out as ruff format lays it out, so the formatter's check and this one agree.
    return (
        "KEYED_WRITES = frozenset(\n    {\n"
        + "".join(f"        ({json.dumps(m)}, {json.dumps(p)}),\n" for m, p in pairs)
        + "    }\n)\n"
    )


def tables_of(doc: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The tables the document ``doc`` must carry, and those it may: by its
    name, so a copy elsewhere (a test's) is checked as the original is."""
    if doc.parts[-2:] == DEPLOY_GUIDE.parts[-2:]:
        return option_regions(), {}
    if doc.name == CLIENT.name:
        return {"keyed writes": keyed_writes()}, {}
    return regions(), optional_regions()


def render(text: str, tables: dict[str, str] | None = None, doc: Path = REFERENCE) -> tuple[str, list[str]]:
    """``text`` with every generated table rewritten, and what is wrong with
    its markers: a table with no place in the text, a place no table has, or
    a table placed twice."""
    if tables is None:
        required, optional = tables_of(doc)
        tables = {**optional, **required}
    else:
        required = tables
    problems: list[str] = []
    seen: list[str] = []

    def fill(match: re.Match[str]) -> str:
        lead, name = match.group(1), match.group(2)
        seen.append(name)
        if name not in tables:
            problems.append(f"no table is generated for <!-- generated: {name} -->")
            return match.group(0)
        return f"{lead}<!-- generated: {name} -->\n{tables[name]}{lead}{END}"

    out = _REGION.sub(fill, text)
    problems += [
        f"<!-- generated: {n} --> appears {seen.count(n)} times" for n in sorted(set(seen)) if seen.count(n) > 1
    ]
    problems += [
        f"no place for the table {n!r}: put <!-- generated: {n} --> and {END} where it belongs"
        for n in required
        if n not in seen
    ]
    return out, problems


def stale(text: str, doc: Path = REFERENCE) -> list[str]:
    """Why the generated tables of ``text`` (the document ``doc``) are not
    what the declarations say now."""
    out, problems = render(text, doc=doc)
    if out != text:
        required, optional = tables_of(doc)
        tables = {**optional, **required}
        for _, name, body in _REGION.findall(text):
            if name in tables and body != tables[name]:
                problems.append(f"the table {name!r} is stale")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stash.web.refgen", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated table is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the generated tables in place")
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        default=[REFERENCE, DEPLOY_GUIDE, CLIENT],
        help="documents to check or rewrite (default: API-REFERENCE.md, deploy/README.md and stash/client.py)",
    )
    args = parser.parse_args(argv)
    failed = False
    missing = [str(path) for path in args.paths if not path.is_file()]
    if missing:
        print(f"no {', '.join(missing)} here: run this from the root of a checkout", file=sys.stderr)
        return 2
    for path in args.paths:
        text = path.read_text(encoding="utf-8")
        if args.check:
            problems = stale(text, path)
        else:
            out, problems = render(text, doc=path)
            if out != text:
                path.write_text(out, encoding="utf-8")
        for p in problems:
            print(f"{path.name}: {p}", file=sys.stderr)
        failed = failed or bool(problems)
    if failed and args.check:
        print(f"Regenerate with: {REGENERATE}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
