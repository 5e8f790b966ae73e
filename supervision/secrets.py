"""Secrets that cannot leak by accident.

A :class:`Secret` prints as ``***`` in ``str``, ``repr``, f-strings, logs and tracebacks;
only :meth:`Secret.reveal` gives the value, and only the code that hands it to a driver
calls it.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"


class Secret:
    """A string that never shows itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def reveal(self) -> str:
        """The secret itself: pass it to a driver, never to a log."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __str__(self) -> str:
        return REDACTED if self._value else ""

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"


def redact_dsn(dsn: str) -> str:
    """*dsn* with its password replaced by ``***`` (URL or ``key=value`` form)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password is None:
            netloc = parts.netloc
        else:
            host = parts.netloc.rsplit("@", 1)[1]
            netloc = f"{parts.username or ''}:{REDACTED}@{host}"
        query = "&".join(
            f"{k}={REDACTED}" if k.lower() == "password" else f"{k}={v}"
            for k, _, v in (item.partition("=") for item in parts.query.split("&") if item)
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    words = []
    for word in dsn.split():
        key, sep, _ = word.partition("=")
        words.append(f"{key}={REDACTED}" if sep and key.lower() == "password" else word)
    return " ".join(words)
