"""JSON in and out: orjson, size caps, and field checking."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import Invalid, Malformed, TooLarge

BODY_CAP = 64 * 1024  # default of `stash serve --max-body`
IMPORT_BODY_CAP = 16 * 1024 * 1024  # default of `stash serve --max-import-body`
# POST /nap's floor: a full batch of 256 summaries of 280 bytes, each up to 840 bytes JSON-escaped (4-byte
# characters as two \uXXXX escapes) with its block id and punctuation, fits in 256 KiB.
NAP_BODY_CAP = 256 * 1024


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        self.content = content  # kept for a text/plain rendering (plaintext.as_text)
        return orjson.dumps(content)


async def read_body(request: Request, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise Malformed("The Content-Length header is not a number; send a valid request.")
        if int(declared) > cap:
            raise TooLarge(f"The body is over {cap} bytes; send less (split an import into batches).")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"The body is over {cap} bytes; send less (split an import into batches).")
        chunks.append(chunk)
    return b"".join(chunks)


async def prefetch_small_body(request: Request, cap: int) -> None:
    """Read now, and keep for the route, a body that declares at most
    ``cap`` bytes (the server enforces the declared length); leave any other
    unread."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and 0 < int(declared) <= cap:
        await request.body()


async def read_object(
    request: Request,
    allowed: set[str] | None,
    *,
    required: set[str] | frozenset[str] = frozenset(),
    cap: int | None = None,
    empty_ok: bool = True,
) -> dict[str, Any]:
    """The body as a JSON object with only ``allowed`` fields: an unknown field
    is refused rather than ignored, because a typo would silently do nothing.
    ``allowed=None`` leaves the names to the service (POST /config, whose
    names are values it validates). ``cap`` defaults to the server's
    ``max_body``."""
    raw = await read_body(request, request.app.state.settings.max_body if cap is None else cap)
    if not raw.strip():
        if not empty_ok or required:
            fields = ", ".join(sorted(required or allowed or ())) or "the fields of this route"
            raise Malformed(f"The body is empty; send a JSON object with {fields}.", code="request.empty_body")
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Malformed(
            "The body is not valid JSON; send one JSON object (check quotes and escapes).", code="request.bad_json"
        ) from None
    if not isinstance(data, dict):
        raise Malformed("The body must be a JSON object.", code="request.bad_json")
    return data if allowed is None else check_fields(data, allowed, required)


def check_fields(
    data: dict[str, Any], allowed: set[str], required: set[str] | frozenset[str] = frozenset()
) -> dict[str, Any]:
    unknown = sorted(set(data) - allowed)
    if unknown:
        names = ", ".join(repr(u[:30]) for u in unknown[:3])
        raise Malformed(
            f"Unknown field {names}; this route takes {', '.join(sorted(allowed)) or 'no fields'}.",
            code="request.unknown_field",
        )
    missing = sorted(required - set(data))
    if missing:
        raise Malformed(f"Missing field {', '.join(missing)}; send it in the JSON body.", code="request.missing_field")
    return data


def query_object(request: Request, allowed: set[str], ints: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Query parameters as fields, with the same refusal of unknown names."""
    data: dict[str, Any] = {}
    for name, value in request.query_params.multi_items():
        if name in data:
            raise Malformed(f"The query names {name[:30]!r} twice; send it once.", code="request.duplicate_field")
        data[name] = value
    check_fields(data, allowed)
    for name in ints & set(data):
        data[name] = parse_int(name, data[name])
    return data


def parse_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise Invalid(f"{name} must be a whole number.", code="request.bad_value")
    if isinstance(value, int) and value >= 0:
        return value
    # isdigit() alone admits "²" and other digits int() refuses or reads.
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)
    raise Invalid(f"{name} must be a whole number.", code="request.bad_value")
