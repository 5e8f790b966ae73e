"""Checks of single settings that guard against hostile or careless values.

>>> dsn_transport_problem({"host": "db.internal", "sslmode": "require"})[:52]
'must use sslmode=verify-full for the remote host db.'

* :func:`bounded_repr`: a value quoted in a problem line is at most a line long, however
  long or deeply nested it is.
* :func:`guarded_problem`: whatever a value or a check raises (a ``ValueError`` of
  :mod:`urllib.parse`, a ``RecursionError``) becomes a problem line naming the key, never
  a traceback.
* :func:`dsn_transport_problem`: a PostgreSQL server that is not on this host is reached
  with ``sslmode=verify-full`` only, as Kafka and the media stack are over verified TLS.
  Loopback addresses and Unix sockets (no host, or a path) are exempt; there is no
  setting to opt out: a DSN without verification names a host anybody on the path may
  impersonate, and the DSN carries the password.
* :func:`tracing_url`: the OTLP endpoint is an http(s) URL when set.
* :func:`http_url`, :func:`host_port`, :func:`bootstrap`, :func:`dsn`: the shapes of the
  URL, listen address, broker list and DSN settings.
"""

from __future__ import annotations

import ipaddress
import reprlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from supervision.secrets import InvalidDsn, parse_dsn, redact_url

MAX_QUOTED = 120  # characters of a value quoted in a problem line

_repr = reprlib.Repr()
_repr.maxstring = MAX_QUOTED
_repr.maxother = MAX_QUOTED
_repr.maxlevel = 3
_repr.maxlist = _repr.maxdict = _repr.maxtuple = 6


def bounded_repr(value: Any) -> str:
    """``repr(value)``, shortened to about a line (nested containers summarised)."""
    try:
        text = _repr.repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply>"
    return text if len(text) <= MAX_QUOTED * 2 else text[: MAX_QUOTED * 2] + "..."


def guarded_problem(key: str, exc: BaseException) -> str:
    """One problem line for an unexpected exception raised while reading *key*."""
    if isinstance(exc, RecursionError):
        words = "nested too deeply"
    else:
        words = f"invalid value ({type(exc).__name__}: {bounded_repr(str(exc))[1:-1]})"
    return f"{key}: {words}" if key else words


def _is_local(host: str) -> bool:
    host = host.strip().strip("[]")
    if not host or host.startswith("/") or host.startswith("@") or host == "localhost":
        return True  # no host or a Unix socket directory (or an abstract socket)
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dsn_transport_problem(params: Mapping[str, Any]) -> str | None:
    """Why a DSN (parsed by libpq's rules) may not be used: a remote host without
    ``sslmode=verify-full``; None when every host is local or it verifies."""
    hosts = [h for h in str(params.get("host") or "").split(",")]
    addrs = [a for a in str(params.get("hostaddr") or "").split(",") if a.strip()]
    remote = [h.strip() for h in hosts if not _is_local(h)]
    if addrs:  # hostaddr is what libpq connects to; host then only names the certificate
        remote = [a.strip() for a in addrs if not _is_local(a)]
    if not remote:
        return None
    mode = str(params.get("sslmode") or "prefer")
    if mode == "verify-full":
        return None
    return (f"must use sslmode=verify-full for the remote host {remote[0]} (the server's "
            f"certificate and name verified), got sslmode={mode}")


def tracing_url(value: Any) -> str | None:
    """An OTLP endpoint: empty, or an http(s) URL (a query string is allowed, and masked)."""
    if not value:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        return f"must be an http(s) URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL"
    return None


def http_url(value: Any) -> str | None:
    """An http(s) URL with a host and no credentials."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:  # "http://[::1": an unclosed IPv6 bracket
        return f"must be an http(s) URL, got {bounded_repr(redact_url(value))} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http(s) URL, got {bounded_repr(redact_url(value))}"
    if parts.username or parts.password:
        return "must not carry credentials in the URL (use the key/token settings)"
    return None


def host_port(value: Any) -> str | None:
    """HOST:PORT to listen on, the host an IP address or ``localhost``."""
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or \
            host.startswith("[") != host.endswith("]"):
        return f"must be HOST:PORT, got {bounded_repr(value)}"
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if host != "localhost":
            return f"host must be an IP address or localhost, got {host!r}"
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bootstrap(value: Any) -> str | None:
    """A comma-separated list of Kafka brokers' HOST:PORT."""
    servers = [s.strip() for s in str(value).split(",") if s.strip()]
    if not servers:
        return "must list at least one HOST:PORT"
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit():
            return f"must be a comma-separated list of HOST:PORT, got {bounded_repr(value)}"
    return None


def dsn(value: Any) -> str | None:
    """A libpq connection string libpq can read, verified when its host is remote."""
    text = value.reveal()
    if not text.strip():
        return "must be set (a libpq connection string, e.g. postgresql://user@host/db)"
    if "://" in text and not text.startswith(("postgresql://", "postgres://")):
        return "must be a postgresql:// URL or a key=value connection string"
    try:
        params = parse_dsn(text)  # libpq's own reading; the message never quotes the DSN
    except InvalidDsn as exc:
        return str(exc)
    return dsn_transport_problem(params)
