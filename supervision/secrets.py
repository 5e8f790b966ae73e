"""Secrets that cannot leak by accident.

A :class:`Secret` prints as ``***`` in ``str``, ``repr``, f-strings, logs and tracebacks;
only :meth:`Secret.reveal` gives the value, and only the code that hands it to a driver
calls it.

DSNs are read with psycopg's own parser (:func:`psycopg.conninfo.conninfo_to_dict`), so
what is masked is exactly what libpq would send: ``password = x``, ``password='a b'``,
``sslpassword``, URL query parameters. A DSN psycopg cannot parse is refused with a
message of ours — the driver's message quotes the offending token, which may be the
password. :class:`Scrubber` is the last line: every log line passes through it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import attrs

from supervision.tree_walk import walk

REDACTED = "***"
SENSITIVE_KEY_WORDS = ("password", "secret", "token")
# words of a key whose value is masked in any text (key=value, a query string): the above
# and the names API keys and signed URLs use
SCRUBBED_KEY_WORDS = (*SENSITIVE_KEY_WORDS, "key", "signature", "credential",
                      "authorization")
MIN_SCRUBBED_LENGTH = 4  # shorter values would mask ordinary words in every line


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


class InvalidDsn(ValueError):
    """A DSN psycopg cannot parse; the message never quotes the DSN."""


def is_sensitive_key(key: str) -> bool:
    """A connection parameter whose value is a credential (``password``, ``sslpassword``,
    anything naming a secret or a token)."""
    return any(word in key.lower() for word in SENSITIVE_KEY_WORDS)


def parse_dsn(dsn: str) -> dict[str, Any]:
    """*dsn* as libpq reads it; :class:`InvalidDsn` (with a safe message) if it cannot."""
    import psycopg  # here, not at import: the S3 worker process uses Secret, not psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # psycopg's message quotes the token it choked on: it may be the password
        if "percent-encoded" in str(exc):
            raise InvalidDsn("has a '%' not followed by two hex digits (in a URL, write a "
                             "literal '%' as %25)") from None
        raise InvalidDsn("is not a libpq connection string (key=value pairs with values "
                         "containing spaces in single quotes, or a postgresql:// URL)"
                         ) from None


def redact_dsn(dsn: str) -> str:
    """*dsn* as libpq parses it, in ``key=value`` form, credentials replaced by ``***``;
    just ``***`` if it does not parse."""
    try:
        params = parse_dsn(dsn)
    except InvalidDsn:
        return REDACTED
    from psycopg.conninfo import make_conninfo

    return make_conninfo("", **{key: REDACTED if is_sensitive_key(key) else value
                                for key, value in params.items()})


def dsn_secrets(dsn: str) -> set[str]:
    """Every form in which *dsn*'s credentials may show up in a message: the DSN itself,
    the parsed values, and a URL's password as written (percent-encoded or invalid)."""
    found = {dsn}
    with contextlib.suppress(InvalidDsn):
        found |= {str(v) for k, v in parse_dsn(dsn).items() if is_sensitive_key(k) and v}
    if "://" in dsn:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        if password:
            found.add(password)
    return found


def redact_url(url: str) -> str:
    """*url* with its userinfo and every query value replaced by ``***`` (the names are
    kept: ``https://otel/v1/traces?api_key=***``); the fragment is dropped. A URL that
    does not parse keeps only what precedes ``?`` and follows ``@``."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        netloc = f"{REDACTED}@{host}" if "@" in parts.netloc else host
        query = "&".join(f"{name}={REDACTED}" if value or "=" in pair else name
                         for pair in parts.query.split("&") if pair
                         for name, _, value in [pair.partition("=")])
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        head = url.split("?", 1)[0].split("#", 1)[0]
        scheme, sep, rest = head.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}" + ("?***" if "?" in url else "")


def url_secrets(url: str) -> set[str]:
    """What a URL setting carries that must not be shown: its userinfo and query values
    (as written and decoded)."""
    found: set[str] = set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    userinfo = parts.netloc.rpartition("@")[0]
    found |= {userinfo, *userinfo.split(":")} if userinfo else set()
    for pair in parts.query.split("&"):
        found.add(pair.partition("=")[2])
    found |= {value for _, value in parse_qsl(parts.query, keep_blank_values=True)}
    return {s for s in found if s}


def secrets_in(obj: Any) -> set[str]:
    """Every :class:`Secret` value in a configuration tree (DSNs in all their forms), and
    the userinfo and query values of every URL setting (:func:`url_secrets`); *obj* may
    also be one value. The tree is read through :func:`supervision.tree_walk.walk`."""
    if attrs.has(type(obj)):
        return set().union(*(secrets_in(value) for _, _, value in walk(obj)))
    if isinstance(obj, str):
        return url_secrets(obj) if "://" in obj else set()
    if isinstance(obj, Secret) and obj:
        return dsn_secrets(obj.reveal())
    return set()


# credentials whatever their value: key=value (libpq and query strings), URL userinfo,
# and psycopg's "invalid percent-encoded token" message, which quotes the password
_PATTERNS = (
    (re.compile(rf"(\b\w*(?:{'|'.join(SCRUBBED_KEY_WORDS)})"
                r"\w*\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"]+)", re.IGNORECASE),
     rf"\g<1>{REDACTED}"),
    # an HTTP header as a client library may quote it: "Authorization: Bearer abc"
    (re.compile(r"(\bauthorization['\"]?\s*:\s*['\"]?)(?:(?:bearer|basic|aws4-hmac-sha256)"
                r"\s+)?[^\s'\",}]+", re.IGNORECASE), rf"\g<1>{REDACTED}"),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^\s@]+@", re.IGNORECASE),
     rf"\g<1>{REDACTED}@"),
    (re.compile(r'(percent-encoded token: )"[^"]*"'), rf'\g<1>"{REDACTED}"'),
)


def _may_hold_credential(text: str) -> bool:
    """False when none of :data:`_PATTERNS` can match: each needs its literal ("=" after a
    key, "://" of a URL, psycopg's message). Substring tests are much cheaper than three
    regular-expression scans of every logged value."""
    return ("=" in text or "://" in text or "percent-encoded token" in text
            or "uthorization" in text or "UTHORIZATION" in text)


@attrs.define
class Scrubber:
    """Masks known secrets and anything shaped like a credential in log lines.

    Used as a structlog processor (after exceptions are formatted, before rendering) for
    structlog's own lines and for the standard library's (psycopg_pool, aiokafka)."""

    secrets: Iterable[str] = ()
    _known: list[str] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        # longest first: a DSN is masked whole before the password inside it
        self._known = sorted({s for s in self.secrets if len(s) >= MIN_SCRUBBED_LENGTH},
                             key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self._known:
            text = text.replace(secret, REDACTED)
        if _may_hold_credential(text):  # most values (ids, event names) cannot: skip
            for pattern, replacement in _PATTERNS:
                text = pattern.sub(replacement, text)
        return text

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
        # one look at all string values together first: a line (almost every one) in
        # which no known secret and none of the patterns' literals occurs is left as it
        # is. Whatever occurs in one value occurs in the joined text (no miss); a match
        # spanning two values only costs the value-by-value pass below.
        joined = "\0".join([v for v in event_dict.values() if isinstance(v, str)])
        if not _may_hold_credential(joined) and not any(
                secret in joined for secret in self._known):
            return event_dict
        for key, value in event_dict.items():
            if isinstance(value, str):
                event_dict[key] = self.scrub(value)
        return event_dict
