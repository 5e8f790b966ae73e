"""What is made from the one walk of the configuration tree: the reference, the redacted print.

>>> [key for key, _, _ in walk(cfg)][:2]
['postgres.dsn', 'postgres.statement_timeout']

:func:`walk` yields every setting of an attrs tree — a loaded configuration, or a root
class for its defaults — as (dotted key, field, value). With
:func:`~supervision.tree_walk.sections` it is the only code that descends the tree by
hand (the loader lets cattrs descend it): the reference in docs/configuration.md
(:func:`settings_reference`), ``check-config``'s redacted print (:func:`redacted`), a
reload's changed keys (:func:`supervision.app.reload.reconcile`) and the secrets every log
line masks (:func:`supervision.secrets.secrets_in`) all read the tree through it.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from supervision.config.fields import REQUIRED, is_duration
from supervision.durations import format_duration
from supervision.secrets import REDACTED, Secret, redact_dsn, redact_url
from supervision.tree_walk import walk


def redacted(cfg: Any) -> dict[str, Any]:
    """*cfg* as plain data for printing: durations spelled out, secrets masked."""
    out: dict[str, Any] = {}
    for key, field, value in walk(cfg):
        *sections, name = key.split(".")
        table = out
        for section in sections:
            table = table.setdefault(section, {})
        table[name] = _shown(field, value)
    return out


def _shown(field: attrs.Attribute[Any], value: Any) -> Any:
    if isinstance(value, Secret):
        if field.name == "dsn":
            return redact_dsn(value.reveal())
        return REDACTED if value else ""
    if isinstance(value, enum.Enum):
        return value.value
    if is_duration(field):
        return format_duration(value)
    if isinstance(value, str) and "://" in value:  # every URL setting
        return redact_url(value)
    return value


@attrs.frozen
class SettingDoc:
    key: str
    type: str
    default: str
    doc: str
    maximum: str = ""  # numeric settings: the largest value accepted


def settings_reference(root: type[Any]) -> list[SettingDoc]:
    """Every setting of the *root* class with its type, default and doc:
    docs/configuration.md is made from it."""
    return [_doc(key, field, default) for key, field, default in walk(root)]


def _doc(key: str, field: attrs.Attribute[Any], default: Any) -> SettingDoc:
    ftype: Any = field.type
    duration = is_duration(field)
    kind = "duration" if duration else getattr(ftype, "__name__", str(ftype))
    kind = "secret string" if ftype is Secret else kind
    kind = "array of strings" if ftype == tuple[str, ...] else kind
    if isinstance(ftype, type) and issubclass(ftype, enum.Enum):
        kind = "one of " + ", ".join(member.value for member in ftype)
    if default is REQUIRED:
        shown = "(required)"
    elif duration:
        shown = f'"{format_duration(default)}"'
    elif isinstance(default, tuple):
        shown = "[" + ", ".join(f'"{d}"' for d in default) + "]"
    elif isinstance(default, Secret | str):
        shown = f'"{default}"'
    else:
        shown = str(default).lower() if isinstance(default, bool) else str(default)
    maximum = field.metadata.get("maximum")
    limit = "" if maximum is None else (
        f'"{format_duration(maximum)}"' if duration
        else str(maximum) if isinstance(maximum, int) else f"{maximum:g}")
    return SettingDoc(key, kind, shown, field.metadata.get("doc", ""), limit)


def reference_markdown(root: type[Any]) -> str:
    """The reference table of the *root* class, as it stands in docs/configuration.md."""
    lines = ["| key | type | default | max | meaning |", "|---|---|---|---|---|"]
    for row in settings_reference(root):
        limit = f"`{row.maximum}`" if row.maximum else ""
        lines.append(f"| `{row.key}` | {row.type} | `{row.default}` | {limit} | {row.doc} |")
        if row.type == "secret string":  # supervision.config.secret_files
            lines.append(
                f"| `{row.key}_file` | path | `\"\"` | | A file holding `{row.key}` instead "
                "(a Kubernetes Secret volume, systemd `LoadCredential=`, a Docker secret): "
                "read at start and at every SIGHUP, one trailing newline dropped; not "
                f"together with `{row.key}`. |")
    return "\n".join(lines)
