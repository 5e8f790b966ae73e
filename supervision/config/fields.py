"""One setting: an attrs field whose metadata carries its documentation and its checks.

>>> timeout: float = setting(5.0, "Timeout of one S3 request.", duration=True,
...                          checks=[positive], maximum=5 * MINUTE)

The metadata is read by the loader (a duration is parsed from ``"90s"``, each check runs
on the structured value, the first failing one is the problem line), by the reference
(docs/configuration.md: type, default, maximum, doc) and by redaction (a duration is
printed spelled out). A check takes the value and returns what is wrong with it, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from supervision.config.values import bounded_repr
from supervision.durations import format_duration

Check = Callable[[Any], str | None]
REQUIRED = attrs.NOTHING
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
MAX_BATCH = 10_000  # rows per claim: beyond it one transaction holds too many locks


def setting(
    default: Any = REQUIRED,
    doc: str = "",
    *,
    duration: bool = False,
    checks: Sequence[Check] = (),
    maximum: float | None = None,
) -> Any:
    """One setting; a numeric one names its *maximum* (checked after *checks*)."""
    bound = () if maximum is None else (at_most(maximum, duration),)
    meta = {"doc": doc, "duration": duration, "checks": (*checks, *bound), "maximum": maximum}
    return attrs.field(default=default, metadata=meta)


def is_duration(field: attrs.Attribute[Any]) -> bool:
    return bool(field.metadata.get("duration", False))


def show(value: Any) -> str:
    """A number as a problem line quotes it: a duration spelled out, else its repr."""
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return format_duration(value)
    return repr(value)


def at_most(limit: float, duration: bool) -> Check:
    def shown(value: Any) -> str:
        return show(value) if duration else repr(value)

    def check(value: Any) -> str | None:
        # not `value > limit`: NaN is past every limit too
        return None if value <= limit else f"must be <= {shown(limit)}, got {shown(value)}"

    return check


def positive(value: Any) -> str | None:
    return None if value > 0 else f"must be > 0, got {show(value)}"


def non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {show(value)}"


def fraction(value: Any) -> str | None:
    return None if 0 <= value < 1 else f"must be >= 0 and < 1, got {show(value)}"


def at_least_one(value: Any) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {show(value)}"


def one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        if value in choices:
            return None
        return f"must be one of {', '.join(choices)}; got {bounded_repr(value)}"

    return check
