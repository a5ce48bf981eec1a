"""docs/DESIGN.md's code map follows `POST /note` and `GET /wake` from the
socket to the disk, each step naming its module and, in parentheses, its
function. These tests keep those names true: a module renamed, a function
moved or a step reordered in service/operation.py fails here, not in a
newcomer's first reading."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
PATHS = (
    "### The path of `POST /note`, from the socket to the disk",
    "### The path of `GET /wake`, from the socket to the disk",
)
# A module in backticks, then in parentheses the functions of it a step names (`name`, `Class.method`).
NAMED = re.compile(r"`(stash/[\w/]+\.py)`\s*\(((?:`[\w.]+`[,\s]*)+)\)")


def section(heading: str) -> str:
    text = DESIGN.read_text(encoding="utf-8")
    assert heading in text, heading
    rest = text.split(heading, 1)[1]
    return rest.split("\n#", 1)[0]


def named(text: str) -> list[tuple[str, str]]:
    return [(module, name) for module, names in NAMED.findall(text) for name in re.findall(r"`([\w.]+)`", names)]


def defines(module: Path, name: str) -> bool:
    """``module`` defines ``name``: a top-level function or class, or
    ``Class.method``: a method in that top-level class's body."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    outer, _, inner = name.partition(".")
    if outer not in top:
        return False
    if not inner:
        return True
    cls = top[outer]
    return isinstance(cls, ast.ClassDef) and any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == inner for n in cls.body
    )


def test_every_step_of_each_path_names_a_module_and_its_function() -> None:
    for heading in PATHS:
        steps = re.split(r"\n\d+\. ", "\n" + section(heading).strip())[1:]
        assert len(steps) >= 4, heading
        for k, step in enumerate(steps, 1):
            assert named(step), f"{heading}: step {k} names no module (function)"


def test_every_module_and_function_the_map_names_exists() -> None:
    missing = []
    for heading in PATHS:
        for module, name in named(section(heading)):
            path = ROOT / module
            if not path.is_file() or not defines(path, name):
                missing.append(f"{module} ({name})")
    assert missing == []


def test_the_write_path_reads_in_the_order_the_map_gives() -> None:
    """operation._run makes its steps in the order the map numbers them:
    transaction, the key's lookup, quota, handler, record."""
    order = ["_transaction", "replay", "_check_quota", "handler", "remember"]
    tree = ast.parse((ROOT / "stash" / "service" / "operation.py").read_text(encoding="utf-8"))
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_run")
    first: dict[str, int] = {}
    for node in ast.walk(run):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in order:
                first[name] = min(first.get(name, node.lineno), node.lineno)
    assert sorted(first, key=first.__getitem__) == order
    mapped = [name.rsplit(".", 1)[-1] for _, name in named(section(PATHS[0]))]
    at = [mapped.index(step) for step in ("_transaction", "replay", "_check_quota", "note", "remember")]
    assert at == sorted(at)
