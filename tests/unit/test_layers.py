"""The package's layers, read from its import statements: core imports no
other layer and no web framework, crypto and storage never reach up into the
service or the web, the web edge never opens storage itself, and no module
imports itself back through others."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "stash"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of the package (and every outside top-level package) that
    ``name`` imports, wherever in the file the import stands."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target, *(f"{target}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            found.add(c if c in known else c.split(".")[0])
    return found - {name}


@functools.cache
def graph() -> dict[str, set[str]]:
    """Every module's imports: read on first use, not at collection, where every xdist worker would read them."""
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(name: str) -> str:
    return name.split(".")[1] if name.count(".") else ""


def test_core_is_pure() -> None:
    for name, deps in graph().items():
        if layer(name) == "core":
            assert not {d for d in deps if d.startswith("stash.") and layer(d) != "core"}, name
            assert not deps & {"starlette", "uvicorn", "sqlite3", "sqlcipher3", "httpx"}, name


def test_lower_layers_never_reach_up() -> None:
    # stash/package_data.py reads the package's own files (schema.sql for storage): a leaf, below every layer but
    # core, which does no I/O.
    assert not [d for d in graph()["stash.package_data"] if d.startswith("stash")]
    below = {"core": set(), "crypto": {"core", "crypto"}, "storage": {"core", "crypto", "storage", "package_data"}}
    for name, deps in graph().items():
        if layer(name) in below:
            allowed = below[layer(name)] | {layer(name)}
            assert {layer(d) for d in deps if d.startswith("stash.")} <= allowed, name
            assert "starlette" not in deps, name


def test_the_web_edge_never_opens_storage() -> None:
    for name, deps in graph().items():
        if layer(name) == "web":
            assert not [d for d in deps if layer(d) == "storage" and d.startswith("stash.")], name


def test_no_import_cycle() -> None:
    seen: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(name: str, path: list[str]) -> None:
        seen[name] = 1
        for dep in graph().get(name, ()):
            if dep not in graph() or dep == "stash":
                continue
            assert seen.get(dep) != 1, " -> ".join([*path, name, dep])
            if dep not in seen:
                visit(dep, [*path, name])
        seen[name] = 2

    for name in graph():
        if name not in seen:
            visit(name, [])


def test_what_an_option_is_needs_nothing_of_the_package() -> None:
    """stash/web/options.py is read by the command line before any server
    starts and by every worker: it imports no other module of the package
    and no web framework, so the declarations' machinery stands alone."""
    deps = graph()["stash.web.options"]
    assert not [d for d in deps if d.startswith("stash")], deps
    assert not deps & {"starlette", "uvicorn", "sqlite3", "sqlcipher3", "httpx"}, deps
    # The declarations themselves sit in the web layer (their checks are the
    # web edge's), which the command line imports, never the reverse.
    assert not [d for d in graph()["stash.web.settings"] if layer(d) in ("cli", "storage")]


def test_no_module_rewires_another_when_imported() -> None:
    """A module's top level assigns nothing into what it imported (a closer
    set on another module's object, a function swapped in): what one module
    needs of another is passed to it, as the kept-open pool is passed to
    each file it keeps (storage/sqlite/pool.py)."""
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            (a.asname or a.name).split(".")[0]
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            for a in node.names
        }
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else ([node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            )
            for target in targets:
                base = target
                while isinstance(base, ast.Attribute | ast.Subscript):
                    base = base.value
                if base is not target and isinstance(base, ast.Name):
                    assert base.id not in imported, f"{name}:{node.lineno} assigns into {base.id}"


def test_the_service_layer_never_imports_the_web_framework() -> None:
    for name, deps in graph().items():
        if layer(name) == "service":
            assert not deps & {"starlette", "uvicorn", "httpx"}, name
            assert not [d for d in deps if layer(d) in ("web", "cli") and d.startswith("stash.")], name


# What a route declares, and service/operation.py alone runs: a session of a scope, an Idempotency-Key
# record, an audit event, a quota check. A handler or any other module of the edge that did one of
# these itself would be a second path beside the declaration.
DECLARED_WORK = {"session", "key_record", "replay", "remember", "record", "identity_room"}


def called_names(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            out.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return out


def test_what_a_route_declares_is_run_in_one_place() -> None:
    found = {name: called_names(path) & DECLARED_WORK for name, path in modules().items() if layer(name) == "web"}
    assert {name: calls for name, calls in found.items() if calls} == {}
    # the reading sees such calls where they are made
    assert {"session", "key_record", "replay", "remember", "record", "identity_room"} <= called_names(
        PACKAGE / "service" / "operation.py"
    )


def test_the_memory_file_parts_stand_alone() -> None:
    """Each part of the memory file (stash/storage/memfile/) never imports the
    handle that composes the parts, nor anything above storage; the format
    registry imports neither file it describes (they dispatch from it, never
    the reverse)."""
    parts = {n: p for n, p in modules().items() if n.startswith("stash.storage.memfile.")}
    assert {
        "stash.storage.memfile.rows",
        "stash.storage.memfile.log",
        "stash.storage.memfile.tree",
        "stash.storage.memfile.state",
        "stash.storage.memfile.reseal",
    } <= set(parts)
    for name in parts:
        assert "stash.storage.memfile.handle" not in graph()[name], name
        assert {layer(d) for d in graph()[name] if d.startswith("stash.")} <= {"core", "crypto", "storage"}, name
    assert not [
        d for d in graph()["stash.storage.formats"] if d.startswith(("stash.storage.memfile", "stash.storage.keyring"))
    ]


TRIPWIRE_LINES = 1_500
"""Not a cap to split a class by, but a tripwire: a module past it has almost
certainly come to hold more than the one purpose the code map gives it."""
ONE_FILE_BY_DESIGN = frozenset({"stash.client"})
"""The client is served as one file (``GET /client``) and runs with the
standard library alone, so it cannot be split into modules."""


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_trips_the_wire() -> None:
    long = {
        name: lines_of(path)
        for name, path in modules().items()
        if name not in ONE_FILE_BY_DESIGN and lines_of(path) > TRIPWIRE_LINES
    }
    assert long == {}


CODE_MAP = PACKAGE.parent / "docs" / "DESIGN.md"
MAP_SECTION = "### Every module and its one purpose"


def mapped_modules() -> dict[str, str]:
    """DESIGN's list of every module: its path, and the purpose given it."""
    text = CODE_MAP.read_text(encoding="utf-8")
    section = text[text.index(MAP_SECTION) + len(MAP_SECTION) :]
    section = section.split("\n#", 1)[0]
    out: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("- `stash/"):
            path, _, purpose = line[3:].partition("`: ")
            assert path not in out, f"{path} is listed twice"
            out[path] = purpose.strip()
    return out


def test_the_code_map_lists_every_module_with_its_purpose() -> None:
    on_disk = {
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*.py")
        if not (p.name == "__init__.py" and not p.read_text(encoding="utf-8").strip())
    }
    listed = mapped_modules()
    assert sorted(on_disk - set(listed)) == [], "add each module to DESIGN's code map with its one purpose"
    assert sorted(set(listed) - on_disk) == [], "gone from the tree: take it off DESIGN's code map"
    assert not [path for path, purpose in listed.items() if len(purpose.split()) < 3]


def test_the_key_ring_is_composed_of_parts() -> None:
    """The key ring is its file and the parts it holds, not a chain of mixins:
    each part is a class of its own (no base but ``object``), given the ring
    file it works on, and reached as an attribute of the façade."""
    import tempfile

    from stash.storage.keyring import Keyring, RingFile
    from stash.storage.keyring.epochs import Epochs
    from stash.storage.keyring.grants import GrantKeys
    from stash.storage.keyring.owner import OwnerData
    from stash.storage.keyring.state_copies import HeadCopies

    assert Keyring.__bases__ == (RingFile,)
    assert RingFile.__bases__ == (object,)
    parts = {"owner": OwnerData, "grant_keys": GrantKeys, "epochs": Epochs, "head_copies": HeadCopies}
    for part in parts.values():
        assert part.__bases__ == (object,), part.__name__
    with tempfile.TemporaryDirectory() as folder:
        ring = Keyring.create(Path(folder) / "keyring.db", "u" * 16, "none")
        try:
            assert {name: type(getattr(ring, name)) for name in parts} == parts
            assert all(getattr(ring, name).ring is ring for name in parts)
        finally:
            ring.close()


def test_the_memory_file_is_composed_of_parts() -> None:
    """The memory file is its open file and the parts it holds, not a chain
    of mixins calling each other through stub declarations: each part is a
    class of its own (no base but ``object``), given the file it works on,
    and reached as an attribute of the façade."""
    import os
    import tempfile

    from stash.storage.memfile import MemoryFile
    from stash.storage.memfile.base import FileBase
    from stash.storage.memfile.bound import RowDigests
    from stash.storage.memfile.budget import ImportBudget
    from stash.storage.memfile.erasure import Erasure
    from stash.storage.memfile.head import LogChain
    from stash.storage.memfile.log import Log
    from stash.storage.memfile.reseal import Epochs
    from stash.storage.memfile.rows import RowCodec
    from stash.storage.memfile.state import State
    from stash.storage.memfile.tree import SummaryTree

    assert MemoryFile.__bases__ == (FileBase,)
    assert FileBase.__bases__ == (object,)
    parts = {
        "codec": RowCodec,
        "digests": RowDigests,
        "state": State,
        "log": Log,
        "chain": LogChain,
        "tree": SummaryTree,
        "erasure": Erasure,
        "epochs": Epochs,
        "budget": ImportBudget,
    }
    for part in parts.values():
        assert part.__bases__ == (object,), part.__name__
    with tempfile.TemporaryDirectory() as folder:
        mf = MemoryFile(Path(folder) / "memory.db", "u" * 16, os.urandom(32), "none", create=True)
        try:
            assert {name: type(getattr(mf, name)) for name in parts} == parts
            assert all(getattr(mf, name).file is mf for name in parts)
        finally:
            mf.close()


def test_the_fleet_sits_between_the_service_and_the_edges() -> None:
    """stash/fleet/ reads the placement and acts on a host's data folder: it
    may use the service and storage, and is used by the command line and the
    web edge; the service never imports it (the web edge hands the vault what
    it needs of the placement), and the placement file's own module is pure."""
    for name, deps in graph().items():
        if layer(name) in ("core", "crypto", "storage", "service"):
            assert not [d for d in deps if layer(d) == "fleet" and d.startswith("stash.")], name
        if layer(name) == "fleet":
            assert not [d for d in deps if layer(d) in ("web", "cli") and d.startswith("stash.")], name
    assert not [d for d in graph()["stash.fleet.placement"] if d.startswith("stash")]
