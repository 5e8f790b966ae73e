"""Durations as operators write them: ``"90s"``, ``"2m"``, ``"1h30m"``, ``"250ms"`` or seconds.

>>> parse_duration("1h30m")
5400.0
>>> format_duration(5400)
'1h30m'
"""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+$")


def parse_duration(value: str | int | float) -> float:
    """Return *value* in seconds; raise :class:`ValueError` with a readable reason."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like \"90s\" or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif _WHOLE.match(text):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
        else:
            raise ValueError(
                f"malformed duration {value!r} (use e.g. \"90s\", \"2m\", \"1h30m\", \"250ms\")"
            )
    if seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest readable spelling of *seconds* that parses back to the same value."""
    if seconds != int(seconds):
        ms = round(seconds * 1000)
        return f"{ms}ms" if ms < 1000 else f"{seconds:g}s"
    rest = int(seconds)
    if rest == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
