"""Values checked against the server's own OpenAPI document with jsonschema.

OpenAPI 3.1 schemas are JSON Schema 2020-12, and every ``$ref`` in the
document points into ``#/components``; a sub-schema checked on its own gets the
document's ``components`` beside it, so those references resolve unchanged."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator


def problems(doc: dict, schema: Any, value: Any) -> list[str]:
    """Why ``value`` does not satisfy ``schema`` (empty when it does)."""
    if isinstance(schema, dict):
        schema = {**schema, "components": doc.get("components", {})}
    validator = Draft202012Validator(schema)
    return [f"$/{'/'.join(map(str, err.absolute_path))}: {err.message}" for err in validator.iter_errors(value)]


def resolve(doc: dict, ref: str) -> Any:
    """The node a local ``$ref`` (``#/a/b``) names; KeyError when it dangles."""
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node
