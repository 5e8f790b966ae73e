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
* :func:`key_file_problem`: a private key file (``kafka.ssl_keyfile``) that its group or
  others may read or write is refused (chmod 600 or 400): the key is the client's identity.
* :func:`tracing_url`: the OTLP endpoint is an http(s) URL when set.
"""

from __future__ import annotations

import ipaddress
import os
import reprlib
import stat
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

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


def key_file_problem(value: Any) -> str | None:
    """Why a private key file's permissions are refused (group or others may read or
    write it), or None."""
    if not value:
        return None
    try:
        mode = os.stat(value).st_mode
    except (OSError, ValueError):
        return None  # the readable-file check names what is wrong with the path
    if stat.S_IMODE(mode) & 0o077:
        return (f"{bounded_repr(value)} is readable or writable by its group or others "
                f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    return None


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
