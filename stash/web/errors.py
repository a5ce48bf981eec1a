"""The one renderer of a refusal: a :class:`StashError` becomes the error of
(docs/DESIGN.md, "HTTP surface")
JSON body with its status, and ``Retry-After`` when it carries a wait."""

from __future__ import annotations

from ..core.errors import StashError
from .jsonio import JSON


def error_response(err: StashError) -> JSON:
    headers = {}
    retry = getattr(err, "retry_after", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return JSON(err.body(), status_code=err.status, headers=headers)
