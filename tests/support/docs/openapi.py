"""Values checked against the server's own OpenAPI document with jsonschema.

OpenAPI 3.1 schemas are JSON Schema 2020-12, and every ``$ref`` in the
document points into ``#/components``; a sub-schema checked on its own gets the
document's ``components`` beside it, so those references resolve unchanged.

Also here: an answer checked against its operation (``check_answer``) and
the error codes the package can raise, read from its source."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

import stash
from stash.core import errors
from tests.support.api import assert_error


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


def operation(doc: dict, method: str, path: str) -> dict:
    return doc["paths"][path][method.lower()]


def check_answer(doc: dict, method: str, path: str, resp, status: int | None = None) -> dict:
    """``resp`` is one of the responses the document gives this operation, and
    its body satisfies that response's schema."""
    op = operation(doc, method, path)
    documented = op["responses"].get(str(resp.status_code))
    assert documented is not None, (method, path, resp.status_code, resp.text[:300])
    if status is not None:
        assert resp.status_code == status, resp.text[:300]
    media = resp.headers["content-type"].split(";")[0]
    assert media in documented["content"], (method, path, media)
    content = documented["content"][media]
    if media != "application/json":
        return {}
    body = resp.json()
    schema = content["schema"]
    assert problems(doc, schema, body) == [], (method, path, body)
    if resp.status_code < 400:
        target = resolve(doc, schema["$ref"]) if "$ref" in schema else schema
        if target.get("properties"):
            # Every listed field is sent, except one the document marks optional (not required) and
            # describes as present only on some hosts (replicas_until).
            optional = set(target["properties"]) - set(target["required"])
            assert set(target["properties"]) - optional <= set(body) <= set(target["properties"]), (method, path)
    else:
        assert_error(resp, resp.status_code)
        assert body["error"] in documented["x-error-codes"], (method, path, body["error"])
    return body


def raised_codes() -> dict[str, set[int]]:
    """Every error code the package can raise, with the statuses it is raised
    with, read from its source: the ``code=`` of each raise of an error class,
    or the class's default, and the code of each ``Refusal`` a route's field
    declares (raised as 422 Invalid by fields.Fields.read)."""
    found: dict[str, set[int]] = {}
    for file in Path(stash.__file__).parent.rglob("*.py"):
        _raised_in(ast.parse(file.read_text(encoding="utf-8")), found)
    return found


def codes_raised_by(function: Any) -> set[str]:
    """The codes ``function``'s own body raises, and those raised by the
    body of each function of the package it calls by name (``admit(...)``
    or ``module.admit(...)``): a handler's codes, whether it raises them
    itself or hands its fields to one service function that does."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found: dict[str, set[int]] = {}
    _raised_in(tree, found)
    for callee in _callees(tree, function.__globals__):
        _raised_in(ast.parse(textwrap.dedent(inspect.getsource(callee))), found)
    return set(found)


def _callees(tree: ast.AST, names: dict[str, Any]) -> list[Any]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = None
        if isinstance(node.func, ast.Name):
            target = names.get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            target = getattr(names.get(node.func.value.id), node.func.attr, None)
        if inspect.isfunction(target) and target.__module__.startswith("stash."):
            out.append(target)
    return out


def _raised_in(tree: ast.AST, found: dict[str, set[int]]) -> None:
    classes = {
        name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, errors.StashError)
    }
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if (
            node.func.id == "Refusal"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.setdefault(node.args[0].value, set()).add(errors.Invalid.status)
            continue
        if node.func.id not in classes:
            continue
        cls = classes[node.func.id]
        given = [k.value for k in node.keywords if k.arg == "code"]
        if not given:
            found.setdefault(cls.code, set()).add(cls.status)
        elif isinstance(given[0], ast.Constant) and isinstance(given[0].value, str):
            found.setdefault(given[0].value, set()).add(cls.status)
