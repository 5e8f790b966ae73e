"""Loading: TOML files merged in order, ``SAFETYNET__SECTION__KEY`` overrides, cattrs.

>>> cfg = load_config(Config, [Path("config/production.example.toml")],
...                   env={"SAFETYNET__POSTGRES__DSN": "postgresql://x"})
>>> cfg.jobs.recording_finalize.batch_size
100

Generic over the root: any attrs class whose fields are sections (the app's
:class:`supervision.app.settings.Config` binds it). The merged mapping is structured by
one cattrs :class:`~cattrs.Converter` (``forbid_extra_keys``, detailed validation): a
hook per value type (integers, numbers, booleans, strings, secrets, enums, arrays of
strings) refuses what TOML or the environment gives in the wrong shape, a duration
setting is parsed from ``"90s"``, and each setting's checks run on the structured value.
cattrs collects every problem of every section before failing; :func:`_problems` turns
its exception tree (``ClassValidationError``, ``ForbiddenExtraKeysError``, each error
noted with its attribute) into today's lines, one per problem, naming the full dotted
key; a key a section once had and lost is named in its ``removed_keys`` class variable
with what replaced it, and refused with that hint instead of "unknown key". The
cross-checks (:mod:`supervision.config.checks`) run once every setting is valid.

A value from the environment is a string: ``"5"`` may be the integer 5, ``"false"`` a
boolean and ``"a,b"`` an array (:class:`FromEnv` marks it, so a TOML string ``"5"``
where an integer belongs is still refused).
"""

from __future__ import annotations

import datetime as dt
import difflib
import enum
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from supervision.config.checks import cross_checks
from supervision.config.fields import is_duration
from supervision.config.files import UnreadableFile, deep_nesting_key, read_config_text
from supervision.config.secret_files import read_secret_files
from supervision.config.values import bounded_repr, guarded_problem
from supervision.durations import parse_duration
from supervision.errors import ConfigError
from supervision.secrets import Secret

ENV_PREFIX = "SAFETYNET__"
ENV_CONFIG_FILE = "SAFETYNET_CONFIG"
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h

Hook = Callable[[Any, Any], Any]
Root = TypeVar("Root")


class FromEnv(str):
    """A string that came from the environment, so ``"5"`` may mean the integer 5."""


def config_paths(cli_paths: Sequence[str | Path], env: Mapping[str, str]) -> list[Path]:
    """The files to load: ``-c`` options in order, else ``$SAFETYNET_CONFIG``, else none."""
    if cli_paths:
        return [Path(p) for p in cli_paths]
    if env.get(ENV_CONFIG_FILE):
        return [Path(env[ENV_CONFIG_FILE])]
    return []


def load_config(root: type[Root], paths: Sequence[Path],
                env: Mapping[str, str] | None = None) -> Root:
    """Merge *paths* in order, apply env overrides, validate as a *root*; raise
    :class:`ConfigError`."""
    env = os.environ if env is None else env
    problems: list[str] = []
    raw: dict[str, Any] = {}
    for path in paths:
        try:
            text = read_config_text(path)
        except UnreadableFile as exc:
            problems.append(f"{path}: cannot read config file: {exc}")
            continue
        try:
            _deep_merge(raw, tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"{path}: invalid TOML: {exc}")
        except RecursionError:
            key, line = deep_nesting_key(text)
            problems.append(f"{key}: arrays or tables nested too deeply ({path}, line {line})")
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            keys = [k.lower() for k in name[len(ENV_PREFIX):].split("__")]
            if all(keys):
                _set_path(raw, keys, FromEnv(value), problems, name)
            else:
                problems.append(f"{name}: malformed variable name")
    if problems:
        raise ConfigError(problems)
    return config_from_dict(root, raw)


def config_from_dict(root: type[Root], raw: Mapping[str, Any]) -> Root:
    """Validate already-merged settings (a TOML-shaped mapping) as a *root*; raise
    :class:`ConfigError`. A secret setting may be given as a file (``<key>_file``,
    :mod:`supervision.config.secret_files`)."""
    try:
        if isinstance(raw, Mapping):
            raw, problems = read_secret_files(root, raw)
            if problems:
                raise ConfigError(problems)
        cfg = _CONVERTER.structure(raw, root)
    except ClassValidationError as exc:
        raise ConfigError(list(_problems(exc, "", raw))) from None
    except RecursionError:  # a table nested past the recursion limit (from the env)
        raise ConfigError(["configuration: tables nested too deeply"]) from None
    except ValueError as exc:  # the whole mapping is not a table
        raise ConfigError([f"configuration: {exc}"]) from None
    try:
        problems = list(cross_checks(cfg))
    except Exception as exc:
        problems = [guarded_problem("configuration", exc)]
    if problems:
        raise ConfigError(problems)
    return cfg


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _set_path(
    raw: dict[str, Any], keys: list[str], value: str, problems: list[str], var: str
) -> None:
    node = raw
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            problems.append(f"{var}: {key} is not a section")
            return
        node = child
    node[keys[-1]] = value


# --------------------------------------------------------------------------- problems


def _problems(group: ClassValidationError, prefix: str, data: Any) -> Iterator[str]:
    """One line per problem in cattrs' error tree of the section at *prefix* (*data*:
    what it was structured from): unknown keys first, in the order they were written,
    then each setting in declaration order."""
    data = data if isinstance(data, Mapping) else {}
    for exc in group.exceptions:
        if isinstance(exc, ForbiddenExtraKeysError):
            yield from _unknown_keys(exc, prefix, [k for k in data if k in exc.extra_fields])
    for exc in group.exceptions:
        if isinstance(exc, ForbiddenExtraKeysError):
            continue
        name = _attribute(exc)
        key = f"{prefix}{name}"
        if isinstance(exc, ClassValidationError):
            yield from _problems(exc, f"{key}.", data.get(name))
        elif isinstance(exc, KeyError) and name is not None:
            yield f"{key}: required, not set"
        elif isinstance(exc, ValueError):
            yield f"{key}: {exc}"
        else:
            yield guarded_problem(key, exc)


def _attribute(exc: BaseException) -> str | None:
    """The attribute cattrs noted on *exc* (None: an error of the section itself)."""
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, cattrs.AttributeValidationNote):
            return note.name
    return None


def _unknown_keys(exc: ForbiddenExtraKeysError, prefix: str, keys: list[str]
                  ) -> Iterator[str]:
    names = [field.name for field in attrs.fields(exc.cl)]
    removed: Mapping[str, str] = getattr(exc.cl, "removed_keys", {})
    for key in keys:
        if key in removed:
            yield f"{prefix}{key}: {removed[key]}"
            continue
        hint = difflib.get_close_matches(key, names, n=1)
        suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
        yield f"{prefix}{key}: unknown key{suggestion}"


# --------------------------------------------------------------------------- structuring


def _type_name(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", dict: "table",
             list: "array", dt.datetime: "TOML datetime", dt.date: "TOML date",
             dt.time: "TOML time"}
    return names.get(type(value), type(value).__name__)


def _got(value: Any) -> str:
    return f"{_type_name(value)} {bounded_repr(value)}"


def _structure_duration(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a duration like \"90s\" or a number of seconds, "
                         f"got {_got(value)}")
    return parse_duration(str(value) if isinstance(value, FromEnv) else value)


def _number(kind: type[int] | type[float], words: str) -> Hook:
    """An integer or a number: a TOML one of the right kind, or the environment's digits."""
    accepted = int if kind is int else int | float

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, FromEnv):
            try:
                return kind(value)
            except ValueError:
                raise ValueError(f"expected {words}, got {str(value)!r}") from None
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ValueError(f"expected {words}, got {_got(value)}")
        return kind(value)

    return structure


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, FromEnv):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {str(value)!r}")
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_got(value)}")
    return value


def _structure_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_got(value)}")
    return str(value)


def _structure_secret(value: Any, _: Any) -> Secret:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_type_name(value)}")
    return Secret(str(value))


def _structure_strings(value: Any, _: Any) -> tuple[str, ...]:
    """An array of strings (a string: comma-separated, as the environment gives it)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"expected an array of strings, got {_type_name(value)}")
    return tuple(i.strip() for i in items if i.strip())


def _structure_enum(value: Any, cls: type[enum.Enum]) -> enum.Enum:
    choices = ", ".join(member.value for member in cls)
    if not isinstance(value, str):
        raise ValueError(f"expected one of {choices}, got {_got(value)}")
    try:
        return cls(value.strip().upper())
    except ValueError:
        raise ValueError(f"must be one of {choices}; got {str(value)!r}") from None


def _checked(convert: Hook, field: attrs.Attribute[Any]) -> Hook:
    """*convert*, then the setting's checks: the first that fails is its problem."""
    checks = field.metadata.get("checks", ())

    def structure(value: Any, cls: Any) -> Any:
        structured = convert(value, cls)
        for check in checks:
            try:
                message = check(structured)
            except Exception as exc:
                message = guarded_problem("", exc)
            if message:
                raise ValueError(message)
        return structured

    return structure


def _section_hook(converter: cattrs.Converter, cls: Any) -> Hook:
    """The structure hook of one section: a table, its sub-sections present even when
    the file leaves them out (so their required settings are named), every setting
    converted and checked."""
    fields = attrs.fields(attrs.resolve_types(cls))
    overrides: dict[str, Any] = {
        f.name: override(struct_hook=_checked(
            _structure_duration if is_duration(f) else converter.get_structure_hook(f.type),
            f))
        for f in fields if not attrs.has(f.type)}
    structure = make_dict_structure_fn(cls, converter, **overrides)
    sections = [f.name for f in fields if attrs.has(f.type)]

    def hook(data: Any, _: Any) -> Any:
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a table, got {_type_name(data)}")
        missing: dict[str, Any] = {name: {} for name in sections if name not in data}
        return structure({**data, **missing} if missing else data, cls)

    return hook


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    # dispatched on the class's MRO: bool before int, a StrEnum before str
    for cls, hook in ((int, _number(int, "an integer")), (float, _number(float, "a number")),
                      (bool, _structure_bool), (str, _structure_str),
                      (Secret, _structure_secret), (enum.Enum, _structure_enum),
                      (enum.StrEnum, _structure_enum)):
        converter.register_structure_hook(cls, hook)
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _structure_strings)
    converter.register_structure_hook_factory(
        attrs.has, lambda cls: _section_hook(converter, cls))
    return converter


_CONVERTER = _converter()
