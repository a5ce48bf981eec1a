"""The OpenAPI 3.1 document served at ``GET /openapi.json``, generated from
the route declarations alone (:class:`stash.web.dispatch.RouteSpec`): paths,
methods, scopes, fields with their limits, answer schemas and each route's
error codes. There is no second table to keep in step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..crypto import tokens
from ..service import idempotency
from ..service.access import NAME_PATTERN
from .dispatch import RouteSpec
from .fields import SECURED, error_codes
from .schemas import SCHEMAS, integer, ref, string

_IDEMPOTENCY_KEY = {
    "name": idempotency.HEADER,
    "in": "header",
    "required": False,
    "description": f"Makes a retry safe: an exact retry (same route and JSON body) within "
    f"{idempotency.WINDOW_SECONDS // 3600} hours answers the first answer and writes nothing; the "
    "same key with another request is 409 idempotency.key_reused. Keys are per user. Send a fresh "
    "random key (a UUID) with each new request, and the same one with each retry of it.",
    "schema": {"type": "string", "minLength": 1, "maxLength": idempotency.KEY_MAX_CHARS, "pattern": "^[\\x21-\\x7e]+$"},
}

_STATUS_WORDS = {
    400: "Unparseable or wrongly shaped request",
    401: "Missing, malformed, unknown or revoked token (always the same answer)",
    403: "Not allowed",
    404: "Nothing there",
    409: "Conflict",
    413: "Body too large",
    422: "Valid JSON with an invalid value",
    405: "The route does not take that method",
    406: "Not an answer the request accepts",
    421: "Not this server's Host",
    429: "Too many requests; wait Retry-After seconds",
    500: "The server failed, or stored data failed its integrity check",
    503: "The storage cannot serve this now (read-only folder, missing or unreadable file; for /health?ready=1, "
    "the data folder cannot be written); nothing was changed",
    507: "The server's disk is full; nothing was written",
}


def _operation(route: RouteSpec, settings: Any) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.method.lower() + "_" + (route.path.strip("/").replace(".", "_") or "landing"),
        "summary": route.summary,
        "x-stash-scope": route.scope,
    }
    words = route.description
    if route.scope in SECURED:
        op["security"] = [{"bearerAuth": []}]
        words += f" Needs a capability of scope {route.scope} or above."
    elif route.scope == "capability":
        op["security"] = [{"bearerAuth": []}]
    elif route.scope == "operator":
        op["security"] = [{"operatorToken": []}, {}]
    else:
        op["security"] = []
    if words.strip():
        op["description"] = words.strip()
    memory_names = (["name"] if route.under else []) + list(route.name_params)
    params = [
        {"name": name, "in": "path", "required": True, "schema": string("a memory's name", pattern=f"^{NAME_PATTERN}$")}
        for name in memory_names
    ]
    params += [{"name": name, "in": "path", "required": True, "schema": schema} for name, schema in route.path_params]
    if route.method == "GET" and route.fields is not None:
        params += [
            {"name": f.name, "in": "query", "required": f.required, "schema": f.openapi_schema()}
            for f in route.fields.items
        ]
    if route.idempotent:
        params.append(_IDEMPOTENCY_KEY)
    if route.scope in SECURED:
        params.append(
            {
                "name": "Stash-Pin",
                "in": "header",
                "required": False,
                "schema": string(pattern="^[0-9]{1,18}:[0-9a-f]{64}(:[0-9]{1,18})?$"),
                "description": "A head this client saw (`head.pin` of an earlier answer). The request is refused "
                "with 409 store.pin_mismatch unless the log is that one or grew from it and the "
                "memory's whole state is at least at the pinned version.",
            }
        )
    if params:
        op["parameters"] = params
    if route.protocol is not None:
        return _protocol_operation(route, op, params)
    if route.method != "GET" and route.fields is not None:
        op["requestBody"] = {
            "required": route.fields.body_required,
            "description": f"A JSON object of at most {route.body_cap.of(settings)} bytes (this server's cap); "
            "an unknown field is refused.",
            "content": {"application/json": {"schema": route.fields.schema()}},
        }
        if route.fields.plain is not None:
            op["requestBody"]["description"] += (
                f" Or a `text/plain` body (UTF-8; one final line break is removed): {route.fields.plain_doc}."
            )
            op["requestBody"]["content"]["text/plain"] = {"schema": {"type": "string"}}
    ok: dict[str, Any] = {"description": "Success", "content": {route.media: {}}}
    if route.answer is not None:
        ok["content"][route.media]["schema"] = route.answer
    if route.media == "application/json":
        # Accept: text/plain (plaintext.py): the same answer as memo prints it.
        ok["content"]["text/plain"] = {"schema": {"type": "string"}}
    if route.idempotent:
        ok["headers"] = {
            idempotency.REPLAYED_HEADER: {
                "description": "`true` when this is the recorded answer to an earlier request with the same "
                "Idempotency-Key, replayed without writing; absent otherwise.",
                "schema": {"const": "true"},
            }
        }
    responses: dict[str, Any] = {str(route.status): ok}
    special = {s.status: s for s in route.special}
    for status, codes in error_codes(route).items():
        schema = ref("Error")
        text = _STATUS_WORDS[status]
        if status in special:
            plain = [c for c in codes if c not in special[status].codes]
            schema = {"oneOf": [ref("Error"), ref(special[status].schema)]} if plain else ref(special[status].schema)
            text += f"; {special[status].words}"
        resp: dict[str, Any] = {
            "description": f"{text}. Codes: {', '.join(codes)}.",
            "x-error-codes": codes,
            "content": {
                "application/json": {"schema": schema},
                "text/plain": {
                    "schema": {
                        "type": "string",
                        "description": "With Accept: text/plain: the "
                        "message, then any nap and `Run:` lines; the code is in the "
                        "Stash-Error header.",
                    }
                },
            },
        }
        if status == 429:
            resp["headers"] = {"Retry-After": {"description": "Seconds to wait.", "schema": integer(1)}}
        responses[str(status)] = resp
    op["responses"] = responses
    return op


def _protocol_operation(route: RouteSpec, op: dict[str, Any], params: list[dict[str, Any]]) -> dict[str, Any]:
    """The operation of a route whose body is another protocol's: its request, its answers and its refusals
    as that protocol writes them."""
    protocol = route.protocol
    assert protocol is not None, "called for a route whose body is another protocol's"
    op["x-stash-protocol"] = protocol.name
    if params:
        op["parameters"] = params
    if route.method != "GET" and protocol.request is not None:
        op["requestBody"] = protocol.request
    elif route.method != "GET" and route.fields is not None:
        kind = "application/x-www-form-urlencoded" if route.fields.form else "application/json"
        op["requestBody"] = {
            "required": route.fields.body_required,
            "content": {kind: {"schema": route.fields.schema()}},
        }
    ok: dict[str, Any] = {"description": "Success"}
    if route.answer is not None:
        ok["content"] = {route.media: {"schema": route.answer}}
    responses: dict[str, Any] = {str(route.status): ok, **dict(route.more_answers)}
    for status, codes in error_codes(route).items():
        resp: dict[str, Any] = {
            "description": f"{_STATUS_WORDS.get(status, 'Refused')}. {protocol.error_words}. "
            f"Codes: {', '.join(codes)}.",
            "x-error-codes": codes,
            "content": protocol.error,
        }
        if status == 429:
            resp["headers"] = {"Retry-After": {"description": "Seconds to wait.", "schema": integer(1)}}
        if status == 401 and route.scope == "capability":
            resp["headers"] = {
                "WWW-Authenticate": {
                    "description": '`Bearer resource_metadata="…/.well-known/oauth-protected-resource…"`: where this '
                    "endpoint's OAuth protected-resource metadata is (RFC 9728)",
                    "schema": string(),
                }
            }
        responses[str(status)] = resp
    op["responses"] = responses
    return op


def document(
    routes: Iterable[RouteSpec], version: str, settings: Any = None, server: str | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (the ROUTES table); the body
    caps are ``settings``' (None: the defaults); ``server`` is its public
    address (``--url``, else the address it was called at), named in
    ``servers`` so a generated client or a broker calls the right host."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, settings)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Stash",
            "version": version,
            "summary": "Permanent, encrypted memory for AI agents.",
            "description": 'JSON in, JSON out. Every refusal is {"error": code, "message": sentence} with the '
            "status of its kind. The field-by-field contract is GET /reference on this server; "
            "the protocol for an agent is GET /skill.",
        },
        **({"servers": [{"url": server}]} if server else {}),
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "stash1",
                    "description": f"A capability token, matching {tokens.TOKEN_PATTERN}. Never in a query string.",
                },
                "operatorToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The operator's metrics token (STASH_METRICS_TOKEN); without one, /metrics "
                    "answers on loopback only.",
                },
            },
        },
    }
