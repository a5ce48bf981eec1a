"""What a ``stash serve`` option is, and the one walk over their declarations.

An option is declared once, on the field of :class:`stash.web.settings.Settings`
it sets (``max_body: int = option("--max-body", BODY_CAP, ...)``). Everything
else is made from that declaration: the parser and its variables
(:mod:`stash.cli.serve`), the checks (:meth:`Option.setting`), the settings a
worker inherits (:func:`encode`, :func:`decode`) and the reference table
(:mod:`stash.web.refgen`). Nothing here knows any option by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, get_origin, get_type_hints

ENV_PREFIX = "STASH_"
_KEY = "stash.option"  # where a field's declarations sit in its dataclass metadata

T = TypeVar("T")


class ConfigError(Exception):
    """A setting that cannot be served; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One option. ``default`` is the value the parser holds when neither the
    flag nor its variable is given, and its type is the option's: an int or a
    float is parsed as one, a tuple makes the option repeatable (each flag
    adds one value; the variable is a comma- or space-separated list), and
    anything else is a string. ``convert`` turns a parsed value into the
    setting, raising :class:`ValueError` with the rest of a sentence that
    starts with the flag. A ``secret`` option's value names the environment
    variable that holds the secret, so the secret is never on a command line
    or in the settings a worker inherits; with ``when=(field, value)`` the
    secret is read only when that setting has that value, and is then
    required. ``part`` makes the option one attribute of a field whose
    value is a dataclass (the argon2id cost's passes and memory)."""

    flag: str
    default: Any
    help: str
    doc: str = ""  # the reference's description, Markdown; the help when empty
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    convert: Callable[[Any], Any] | None = None
    env: str | None = None  # the variable, when it is not STASH_<OPTION>
    secret: bool = False
    when: tuple[str, str] | None = None
    shown_default: str | None = None  # the reference's default, Markdown, when the value alone would mislead
    part: str | None = None
    field: str = ""  # the Settings field, filled in by declared()

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env_var(self) -> str:
        return self.env or ENV_PREFIX + self.dest.upper()

    @property
    def repeat(self) -> bool:
        return isinstance(self.default, tuple)

    @property
    def kind(self) -> Callable[[str], Any]:
        """What parses one value of this option from text."""
        if isinstance(self.default, bool) or not isinstance(self.default, int | float):
            return str
        return type(self.default)

    @property
    def shown(self) -> str:
        """The flag as a reader types it: ``--max-body BYTES``, ``--init open|invite|off``."""
        word = "|".join(self.choices) if self.choices else (self.metavar or self.dest.upper())
        return f"{self.flag} {word}"

    def default_text(self) -> str:
        """The default in the reference's words (Markdown)."""
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None or self.default == ():
            return "none"
        if isinstance(self.default, str):
            return f"`{self.default}`"
        return number(self.default)

    def allowed_text(self) -> str:
        """The values the option takes, in the reference's words (Markdown)."""
        if self.choices:
            return ", ".join(f"`{c}`" for c in self.choices)
        if self.low is not None and self.high is not None:
            return f"{number(self.low)} to {number(self.high)}"
        if self.low is not None:
            return f"at least {number(self.low)}"
        return ""

    def setting(self, value: Any) -> Any:
        """The setting a parsed ``value`` makes: in range, converted, a
        repeatable option's values once each in the order given; otherwise
        :class:`ConfigError`."""
        if self.repeat:
            return tuple(dict.fromkeys(self._converted(v, f"{self.flag} {str(v)[:40]!r}") for v in value or ()))
        if value is None:
            return None
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            if self.high is None:
                raise ConfigError(f"{self.flag} must be at least {number(self.low or 0)}.")
            raise ConfigError(f"{self.flag} must be from {number(self.low or 0)} to {number(self.high)}.")
        return self._converted(value, self.flag)

    def _converted(self, value: Any, said: str) -> Any:
        if self.convert is None:
            return value
        try:
            return self.convert(value)
        except ValueError as err:
            raise ConfigError(f"{said} {err}") from None


def number(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else str(n)


def option(flag: str, default: Any, help: str, *, required: bool = False, **more: Any) -> Any:
    """A dataclass field declared by one option (see :class:`Option`); its
    default is the setting the option's default makes. ``required``: the
    field has no default of its own (a Settings built in code must say it)."""
    declared = Option(flag, default, help, **more)
    meta = {_KEY: (declared,)}
    if declared.secret:
        return dataclasses.field(default=None, metadata=meta, repr=False)
    if required:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=declared.setting(default), metadata=meta)


def parts(default: Any, *options: Option) -> Any:
    """A dataclass field whose value is the dataclass ``default`` with each
    option setting one of its attributes (``Option(..., part="time_cost")``)."""
    filled = tuple(dataclasses.replace(o, default=getattr(default, o.part or "")) for o in options)
    return dataclasses.field(default=default, metadata={_KEY: filled})


def declared(cls: type) -> list[Option]:
    """Every option of the dataclass ``cls``, in the order its fields declare them."""
    return [dataclasses.replace(o, field=f.name) for f in dataclasses.fields(cls) for o in f.metadata.get(_KEY, ())]


def build(cls: type[T], parsed: Mapping[str, Any], environ: Mapping[str, str]) -> T:
    """An instance of ``cls`` from each option's parsed value (by its
    ``dest``) and the secrets' variables in ``environ``; :class:`ConfigError`
    names the first setting that cannot be served."""
    values: dict[str, Any] = {}
    secrets: list[Option] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        options = [dataclasses.replace(o, field=f.name) for o in f.metadata.get(_KEY, ())]
        if options and options[0].part:
            whole: Any = f.default
            values[f.name] = dataclasses.replace(whole, **{o.part or "": o.setting(parsed[o.dest]) for o in options})
        elif options and options[0].secret:
            secrets.append(options[0])
        elif options:
            values[f.name] = options[0].setting(parsed[options[0].dest])
    flags = {o.field: o.flag for o in declared(cls)}
    for o in secrets:
        variable = parsed[o.dest]
        if o.when is not None and values[o.when[0]] != o.when[1]:
            values[o.field] = None
            continue
        values[o.field] = environ.get(variable) or None
        if o.when is not None and values[o.field] is None:
            raise ConfigError(f"{flags[o.when[0]]} {o.when[1]} needs the secret in ${variable}.")
    return cls(**values)


def encode(settings: Any, secret_envs: Mapping[str, str]) -> dict[str, Any]:
    """The dataclass ``settings`` as JSON-ready values by field name, but a
    secret: in its place, under its option's ``dest``, the name of the
    variable holding it (from ``secret_envs`` by ``dest``, else the
    option's default), or null where the secret is unset."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        secret = next((o for o in f.metadata.get(_KEY, ()) if o.secret), None)
        if secret is not None:
            out[secret.dest] = secret_envs.get(secret.dest, secret.default) if value else None
        elif isinstance(value, Path):
            out[f.name] = str(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[f.name] = list(dataclasses.astuple(value))
        else:
            out[f.name] = value
    return out


def decode(cls: type[T], raw: Mapping[str, Any], environ: Mapping[str, str]) -> T:
    """What :func:`encode` made, back as a ``cls``, each secret read from the
    variable it names."""
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        secret = next((o for o in f.metadata.get(_KEY, ()) if o.secret), None)
        hint = hints[f.name]
        if secret is not None:
            name = raw[secret.dest]
            values[f.name] = (environ.get(name) or None) if name else None
        elif hint is Path:
            values[f.name] = Path(raw[f.name])
        elif get_origin(hint) is tuple:
            values[f.name] = tuple(raw[f.name])
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            values[f.name] = hint(*raw[f.name])
        else:
            values[f.name] = raw[f.name]
    return cls(**values)
