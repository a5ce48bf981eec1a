"""What a route takes: its request fields, declared once and read three ways.
The server parses and refuses requests from these declarations
(:meth:`Fields.read`), ``GET /openapi.json`` is built from them
(:mod:`stash.web.openapi`), and so are the field tables, the scope matrix and
the error-code table of API-REFERENCE.md (:mod:`stash.web.refgen`). A GET
route and its POST twin share one :class:`Fields`, so the two cannot drift
apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from starlette.requests import Request

from ..core.errors import Invalid, Malformed
from .codes import CODES
from .jsonio import check_fields, parse_int, query_object, read_body, read_object
from .schemas import Schema, obj

SECURED = ("append", "read", "full", "owner")


class Refusal(NamedTuple):
    code: str
    message: str


@dataclass(frozen=True)
class Field:
    name: str
    schema: Schema  # its JSON Schema in /openapi.json, limits included; the reference's type column says it
    doc: str  # Markdown: the meaning column of the reference's table, and the schema's description
    required: bool = False
    # Whole numbers are read here (a JSON integer or a string of digits; a query
    # string carries only digits) and get their default here. Every other field
    # goes to the service as sent, which checks it with its own codes.
    whole: bool = False
    default: Any = None
    default_doc: str = ""
    nullable: bool = False  # a JSON null is taken as absent
    # Absent although required: this message, after the body was taken as {} when
    # empty (a POST twin reads an empty body the way its GET reads an empty query).
    missing: str | None = None
    # For a whole number, the refusal of one outside the schema's minimum and
    # maximum; for any other field, of one that is not a string. None leaves the
    # value to the service.
    refuse: Refusal | None = None

    def openapi_schema(self) -> Schema:
        if "$ref" in self.schema:
            return self.schema
        return {**self.schema, "description": self.doc}


@dataclass(frozen=True)
class Fields:
    """The fields a route reads: from the query string of a GET, from the JSON
    body of any other method. Unknown names are refused, because a typo would
    silently do nothing."""

    items: tuple[Field, ...] = ()
    # The body's names are values the service validates (POST /config): this
    # schema describes it, and no name is refused here.
    open_schema: Schema | None = None
    empty_ok: bool = True
    # A route that also takes a text/plain body: how its text becomes these fields, and the Markdown that says
    # so in the reference. None: JSON only.
    plain: Callable[[str], dict[str, Any]] | None = None
    plain_doc: str = ""
    # OAuth's way (RFC 6749, 3.1 and 3.2): a GET's query or a POST's application/x-www-form-urlencoded body
    # (an HTML form's too), every value a string, and names the route does not take ignored.
    form: bool = False

    @property
    def names(self) -> set[str]:
        return {f.name for f in self.items}

    @property
    def body_required(self) -> bool:
        return not self.empty_ok or any(f.required for f in self.items)

    def schema(self) -> Schema:
        if self.open_schema is not None:
            return self.open_schema
        return obj(
            {f.name: f.openapi_schema() for f in self.items}, required=[f.name for f in self.items if f.required]
        )

    def _form_hint(self, request: Request, err: Malformed) -> Malformed:
        """A body that is not JSON, sent as a form (``curl -d 'text'`` sends
        application/x-www-form-urlencoded): the refusal also says how to send
        the text as it is, on a route that takes text/plain."""
        form = request.headers.get("content-type", "").split(";")[0].strip().lower() == (
            "application/x-www-form-urlencoded"
        )
        if err.code != "request.bad_json" or not form:
            return err
        how = (
            "send it as text: -H 'Content-Type: text/plain' --data-binary @- with the text on stdin, or send "
            "one JSON object"
            if self.plain is not None
            else "send one JSON object"
        )
        return Malformed(
            f"The body is not valid JSON, and it came as a form (curl -d sends one); {how}.", code="request.bad_json"
        )

    async def read(self, request: Request, method: str, cap: int) -> dict[str, Any]:
        """The fields of ``request``, whole numbers parsed and defaulted; the
        refusals of docs/DESIGN.md, "HTTP surface" otherwise. What the body carries beyond that is
        returned as sent: an idempotent write's record is keyed on it."""
        if self.form:
            data = await self._form(request, method, cap)
        elif method == "GET":
            data = query_object(request, self.names, ints={f.name for f in self.items if f.whole})
        elif is_plain(request):
            if self.plain is None:
                raise Malformed(
                    "This route takes a JSON body, not text/plain; send a JSON object.", code="request.malformed"
                )
            data = check_fields(self.plain(plain_text(await read_body(request, cap))), self.names)
        else:
            try:
                data = await read_object(
                    request,
                    None if self.open_schema is not None else self.names,
                    required={f.name for f in self.items if f.required and f.missing is None},
                    cap=cap,
                    empty_ok=self.empty_ok,
                )
            except Malformed as err:
                raise self._form_hint(request, err) from None
        for f in self.items:
            if f.missing is not None and f.name not in data:
                raise Malformed(f.missing, code="request.missing_field")
        for f in self.items:
            value = data.get(f.name)
            if f.whole:
                absent = f.name not in data or (f.nullable and value is None)
                data[f.name] = f.default if absent else parse_int(f.name, value)
            elif f.refuse is not None and f.name in data and not isinstance(value, str):
                raise Invalid(f.refuse.message, code=f.refuse.code)
        # Ranges only once every number is read: a request wrong twice over is refused for its type first.
        for f in self.items:
            if f.whole and f.refuse is not None and not _within(data[f.name], f.schema):
                raise Invalid(f.refuse.message, code=f.refuse.code)
        return data

    async def _form(self, request: Request, method: str, cap: int) -> dict[str, Any]:
        """The form's fields this route takes (each once), as strings."""
        if method == "GET":
            pairs = request.query_params.multi_items()
        else:
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/x-www-form-urlencoded":
                raise Malformed(
                    "Send the body as a form: Content-Type: application/x-www-form-urlencoded.",
                    code="request.malformed",
                )
            try:
                pairs = parse_qsl((await read_body(request, cap)).decode("utf-8"), keep_blank_values=True)
            except UnicodeDecodeError:
                raise Malformed("The form is not UTF-8; send it as UTF-8.", code="request.malformed") from None
        data: dict[str, Any] = {}
        for name, value in pairs:
            if name not in self.names:
                continue
            if name in data:
                raise Malformed(f"The form names {name} twice; send it once.", code="request.duplicate_field")
            data[name] = value
        missing = sorted(f.name for f in self.items if f.required and f.name not in data)
        if missing:
            raise Malformed(f"Missing {', '.join(missing)}.", code="request.missing_field")
        return data

    def codes(self, method: str) -> list[str]:
        """The codes :meth:`read` can answer."""
        if self.form:
            out = ["request.duplicate_field"] + ([] if method == "GET" else ["request.malformed", "request.too_large"])
            return out + (["request.missing_field"] if any(f.required for f in self.items) else [])
        out = (
            ["request.duplicate_field", "request.unknown_field"]
            if method == "GET"
            else ["request.malformed", "request.bad_json"]
        )
        if method != "GET" and self.plain is not None:
            out.append("request.bad_plain")
        if method != "GET" and self.open_schema is None:
            out.append("request.unknown_field")
        if method != "GET" and (not self.empty_ok or any(f.required and f.missing is None for f in self.items)):
            out.append("request.empty_body")
        if any(f.required for f in self.items):
            out.append("request.missing_field")
        if any(f.whole for f in self.items):
            out.append("request.bad_value")
        out += [f.refuse.code for f in self.items if f.refuse is not None]
        if method != "GET":
            out.append("request.too_large")
        return out


def is_plain(request: Request) -> bool:
    """The body is ``text/plain`` (any charset parameter is ignored: it is read as UTF-8)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower() == "text/plain"


def plain_text(raw: bytes) -> str:
    """A text/plain body as text: UTF-8, and the one line break a
    here-document or ``echo`` ends it with removed, so that the text is
    exactly the lines that were written."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("The text/plain body is not UTF-8; send it as UTF-8.", code="request.malformed") from None
    return text[:-1] if text.endswith("\n") else text


def _within(value: int | None, schema: Schema) -> bool:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    return value is None or ((lo is None or value >= lo) and (hi is None or value <= hi))


class Special(NamedTuple):
    """Refusals of one status whose body carries more than error and message."""

    status: int
    words: str  # added to the status's description
    schema: str  # the component schema of that body
    codes: tuple[str, ...]


def error_codes(route: Any) -> dict[int, list[str]]:
    """Every error code ``route`` can answer, by status: those every route of
    its kind shares, those its fields can answer, then its own."""
    out: dict[int, list[str]] = {}

    def add(*codes: str) -> None:
        for code in codes:
            status = CODES[code].status
            if code not in out.setdefault(status, []):
                out[status].append(code)

    add("auth.token_in_query", "internal", "server.stopping")
    if route.fields is not None:
        add(*route.fields.codes(route.method))
    if route.scope in SECURED:
        add(
            "auth.invalid",
            "fleet.elsewhere",
            "fleet.moving",
            "rate_limited",
            "request.bad_pin",
            "store.pin_mismatch",
            "store.rekeyed",
            "store.damaged",
            "store.rolled_back",
            "store.missing",
            "store.read_only",
            "store.unreadable",
            "store.full",
            "busy.user",
        )
    if route.slow:
        add("busy.slow", "busy.server")
    if route.scope in ("append", "full", "owner"):
        add("auth.scope")
    if route.scope == "capability":  # the token's liveness, checked before the protocol's code runs
        add(
            "auth.invalid",
            "fleet.elsewhere",
            "fleet.moving",
            "rate_limited",
            "store.damaged",
            "store.missing",
            "store.unreadable",
        )
    if route.scope in (*SECURED, "capability") and (
        getattr(route, "under", False) or getattr(route, "memory_from", None) or getattr(route, "memory_of", None)
    ):
        add("memory.unknown")
    if route.idempotent:
        add("idempotency.bad_key", "idempotency.key_reused")
    add(*route.errors)
    for special in route.special:
        add(*special.codes)
    return dict(sorted(out.items()))
