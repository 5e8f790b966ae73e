"""The one walk of an attrs tree of settings: every leaf as (dotted key, field, value),
and every section as (dotted key, section).

    >>> from supervision.app.settings import Config, config_from_dict
    >>> cfg = config_from_dict({"postgres": {"dsn": "postgresql:///messenger"}})
    >>> [key for key, _, _ in walk(cfg)][:2] == [key for key, _, _ in walk(Config)][:2]
    True
    >>> [key for key, _ in sections(cfg)][:2]
    ['postgres', 'kafka']

The configuration's reference and redaction (:mod:`supervision.config.reference`), the
reload's comparison of old and new leaves (:mod:`supervision.app.reload`) and the secret
finder (:func:`supervision.secrets.secrets_in`) all read the tree through it; the
cross-key checks (:mod:`supervision.config.checks`) find the sections they judge with
:func:`sections`. It knows
attrs only, not the configuration, so the config package and the secrets module (which the
config package imports) can both use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs


def walk(tree: Any, prefix: str = "") -> Iterator[tuple[str, attrs.Attribute[Any], Any]]:
    """Every setting of *tree* as (dotted key, attrs field, value), in declaration order.
    *tree* is an attrs instance (the values) or an attrs class (the defaults:
    ``attrs.NOTHING`` for a required setting)."""
    cls = tree if isinstance(tree, type) else type(tree)
    for field in attrs.fields(attrs.resolve_types(cls)):
        key = f"{prefix}{field.name}"
        value = field.default if isinstance(tree, type) else getattr(tree, field.name)
        if attrs.has(field.type):
            yield from walk(field.type if isinstance(tree, type) else value, f"{key}.")
        else:
            yield key, field, value


def sections(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every section (attrs instance) below *tree*, at any depth, as (dotted key, section),
    each before the sections it holds, in declaration order."""
    for field in attrs.fields(attrs.resolve_types(type(tree))):
        if attrs.has(field.type):
            key = f"{prefix}{field.name}"
            section = getattr(tree, field.name)
            yield key, section
            yield from sections(section, f"{key}.")
