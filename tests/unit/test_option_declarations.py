"""Each `stash serve` option is declared once, on its Settings field
(stash/web/settings.py), and everything else is made from that declaration:
the parser, the checks, what a worker inherits and deploy/README.md's table.
These tests find a second copy: an option missing from the reference or the
parser, a setting a worker would not inherit, a range not enforced, or a
flag, variable or setting name written out anywhere else in the package."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from stash.cli import serve
from stash.web import refgen
from stash.web.options import ConfigError, Option
from stash.web.settings import OPTIONS, SETTINGS_ENV, Settings, from_env, settings_from, to_env

PACKAGE = Path(__file__).resolve().parents[2] / "stash"
DECLARATIONS = PACKAGE / "web" / "settings.py"


def _table_rows(text: str, name: str) -> list[list[str]]:
    body = re.search(rf"^<!-- generated: {re.escape(name)} -->\n(.*?)^<!-- end generated -->$", text, re.S | re.M)
    assert body is not None, f"deploy/README.md has no generated region {name!r}"
    return [re.split(r"(?<!\\)\|", line)[1:-1] for line in body.group(1).splitlines()[2:]]


def test_every_option_is_in_the_reference_with_its_variable_and_default() -> None:
    text = (PACKAGE.parent / refgen.DEPLOY_GUIDE).read_text(encoding="utf-8")
    assert refgen.stale(text, refgen.DEPLOY_GUIDE) == [], f"regenerate with: {refgen.REGENERATE}"
    rows = _table_rows(text, "stash serve options")
    flags = [row[0].strip().strip("`").split()[0] for row in rows]
    assert flags == [o.flag for o in OPTIONS]
    for o, row in zip(OPTIONS, rows):
        assert row[1].strip() == f"`{o.env_var}`", o.flag
        assert row[2].strip() == o.default_text(), o.flag
    synopsis = text.split("<!-- generated: stash serve synopsis -->", 1)[1].split(refgen.END, 1)[0]
    assert [w.split()[0] for w in re.findall(r"\[(--[^]]+)\]", synopsis)] == [o.flag for o in OPTIONS]


def test_the_parser_has_exactly_the_declared_options() -> None:
    parser = serve.parser()
    flags = [a.option_strings[-1] for a in parser._actions if a.dest != "help"]
    assert flags == [o.flag for o in OPTIONS]
    for o in OPTIONS:
        assert serve.env_name(o.dest) == o.env_var
    assert {o.env_var for o in OPTIONS} >= {"STASH_PUBLIC_URL", "STASH_DATA", "STASH_PORT"}
    assert "STASH_URL" not in {o.env_var for o in OPTIONS}


def test_every_setting_is_declared_by_an_option() -> None:
    declared = {o.field for o in OPTIONS}
    assert [f.name for f in dataclasses.fields(Settings) if f.name not in declared] == []


def _other(o: Option) -> object:
    """A value of ``o`` that is not its default, and that its checks accept."""
    if o.repeat:
        return ["10.0.0.0/8", "::1"] if o.field == "trusted_proxies" else ["3f", "a"]
    if o.secret:
        return f"TEST_{o.dest.upper()}"
    if o.choices:
        return next(c for c in o.choices if c != o.default)
    if isinstance(o.default, int | float):
        value = o.default + 1
        return value if o.high is None or value <= o.high else o.default - 1
    return {"data_dir": "/srv/elsewhere", "public_url": "https://stash.example"}.get(o.field, "192.0.2.7")


def test_a_worker_inherits_every_setting(monkeypatch) -> None:
    """Every option set to something else than its default, through the
    parser's own values, reaches a worker whole: a field to_env forgot, or
    from_env read back wrong, fails here."""
    values = {o.dest: _other(o) for o in OPTIONS}
    environ = {str(values[o.dest]): f"secret of {o.dest}" for o in OPTIONS if o.secret}
    values = {**values, "file_cipher": "none"}  # sqlcipher is the default where it imports
    sent = settings_from(values, environ)
    defaults = settings_from({o.dest: o.default for o in OPTIONS}, {})
    differ = [f.name for f in dataclasses.fields(Settings) if getattr(sent, f.name) == getattr(defaults, f.name)]
    assert differ == [], f"the test left these at their defaults: {differ}"
    monkeypatch.setenv(SETTINGS_ENV, to_env(sent, {o.dest: str(values[o.dest]) for o in OPTIONS if o.secret}))
    for name, secret in environ.items():
        monkeypatch.setenv(name, secret)
    assert from_env() == sent


@pytest.mark.parametrize("o", [o for o in OPTIONS if o.low is not None], ids=lambda o: o.flag)
def test_every_declared_range_is_enforced(o: Option) -> None:
    def setting(value: float) -> Settings:
        return serve.settings_from(serve.parse([o.flag, str(value)], {}), {})

    step = 1 if isinstance(o.default, int) else 0.05
    assert getattr(setting(o.low or 0), o.field) == o.low
    with pytest.raises(ConfigError, match=re.escape(o.flag)):
        setting((o.low or 0) - step)
    if o.high is not None:
        assert getattr(setting(o.high), o.field) == o.high
        with pytest.raises(ConfigError, match=re.escape(o.flag)):
            setting(o.high + step)


def _strings(path: Path, names: set[str]) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in names
    ]


def test_no_module_but_the_declarations_names_an_option() -> None:
    """A flag (``"--max-body"``) or a variable (``"STASH_MAX_BODY"``) as a
    string in any other module of the package, or a setting's name
    (``"max_body"``) in the command line's modules, is a second list of
    options that the declarations do not keep in step. The one-file client
    is its own program: its ``--url`` is its own flag. A one-word setting
    name (``init``, ``host``) is an ordinary word elsewhere, and the HTTP
    answers name their own fields (``file_cipher``), so setting names are
    looked for only where the parser and the workers' hand-off live."""
    flags = {o.flag for o in OPTIONS} | {o.env_var for o in OPTIONS}
    settings = {n for o in OPTIONS for n in (o.field, o.dest) if "_" in n}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path not in (DECLARATIONS, PACKAGE / "client.py"):
            found += _strings(path, flags | (settings if path.parent.name == "cli" else set()))
    assert found == []
