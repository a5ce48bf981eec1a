"""The files the package reads at run time are declared once
(stash/package_data.py), read only through it, and carried by the install
under test: an installed server never reaches for a file the wheel left out
(as skill/AGENTS-append.md once was). The wheel built from exactly what the
container image copies is checked against the same declaration in
tests/deploy/test_deploy_files.py."""

from __future__ import annotations

import ast
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from stash import package_data
from tests.support.installed import CHECKOUT, DISTRIBUTION, installed_folder, is_editable

SOURCE = CHECKOUT / "stash"


def test_the_install_under_test_carries_every_declared_file_as_the_checkout_has_it() -> None:
    folder = installed_folder()
    for name in sorted(package_data.FILES):
        assert (folder / name).is_file(), name
        assert (folder / name).read_bytes() == (SOURCE / name).read_bytes(), name
        assert package_data.read_text(name) == (SOURCE / name).read_text(encoding="utf-8"), name
    if not is_editable():
        # The wheel pip built and installed, by its own manifest.
        record = {str(f) for f in metadata.distribution(DISTRIBUTION).files or ()}
        assert sorted(f"stash/{name}" for name in package_data.FILES if f"stash/{name}" not in record) == []


def test_the_package_folder_holds_every_declared_file() -> None:
    """In the checkout, through its links to the top-level copies: what the
    build packs, and what an editable install reads."""
    assert [name for name in sorted(package_data.FILES) if not (SOURCE / name).is_file()] == []
    assert (SOURCE / "skill").resolve() == CHECKOUT / "skill"


def test_the_build_packs_the_package_folder_and_names_no_file_of_its_own() -> None:
    """One declaration: pyproject.toml packs the package folder whole, with no
    second list of files (a force-include) that could leave one out."""
    wheel = tomllib.loads((CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["hatch"]["build"][
        "targets"
    ]["wheel"]
    assert wheel == {"packages": ["stash"]}


def test_an_undeclared_name_is_refused() -> None:
    with pytest.raises(KeyError, match="declared"):
        package_data.read_text("CLIENT.md")  # in the folder, but nothing reads it at run time


def reads_its_own_files(path: Path) -> list[str]:
    """Where a module finds files by its own location (``__file__``) or reads
    package resources (importlib.resources, pkgutil.get_data)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id == "__file__":
            out.append(f"{node.lineno}: __file__")
        elif isinstance(node, ast.ImportFrom) and node.module in ("importlib", "importlib.resources", "pkgutil"):
            out += [
                f"{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if node.module != "importlib" or a.name == "resources"
            ]
        elif isinstance(node, ast.Import):
            out += [
                f"{node.lineno}: import {a.name}" for a in node.names if a.name in ("importlib.resources", "pkgutil")
            ]
    return out


def test_no_module_but_the_declaration_reads_a_file_of_the_package() -> None:
    found = {
        str(p.relative_to(CHECKOUT)): hits
        for p in SOURCE.rglob("*.py")
        if p.name != "package_data.py" and (hits := reads_its_own_files(p))
    }
    assert found == {}
    # the reading sees what it looks for
    assert [h.split(": ", 1)[1] for h in reads_its_own_files(SOURCE / "package_data.py")] == [
        "from importlib import resources"
    ]
