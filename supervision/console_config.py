"""The ``[console]`` section (issue #27), registered in :mod:`supervision.config`.

Kept apart from the daemon's sections: only ``safetynet console`` reads it, and what it
requires (a user and a password hash, or a proxy header and the proxies' addresses) is
checked when the console starts (:func:`console_problems`), so a daemon's configuration
without a console stays valid.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import attrs

from supervision.secrets import Secret


def _setting(default: Any, doc: str, checks: tuple[Any, ...] = (),
             maximum: float | None = None) -> Any:
    # the metadata shape of supervision.config._setting
    bound = () if maximum is None else (_at_most(maximum),)
    return attrs.field(default=default, metadata={
        "doc": doc, "duration": False, "checks": (*checks, *bound), "maximum": maximum})


def _at_most(limit: float) -> Any:
    def check(value: Any) -> str | None:
        return None if value <= limit else f"must be <= {limit:g}, got {value!r}"

    return check


def _listen(value: Any) -> str | None:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"must be HOST:PORT, got {value!r}"
    if host != "localhost":
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return f"host must be an IP address or localhost, got {host!r}"
    return None


def _auth(value: Any) -> str | None:
    return None if value in ("basic", "proxy_header") else (
        f"must be one of basic, proxy_header; got {value!r}")


def _password_hash(value: Any) -> str | None:
    from supervision.passwords import BadHash, parse_hash

    if not value:
        return None
    try:
        parse_hash(value.reveal())
    except BadHash as exc:
        return str(exc)
    return None


def _networks(value: Any) -> str | None:
    for item in value:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            return f"must list IP addresses or networks (CIDR), got {item!r}"
    return None


def _header(value: Any) -> str | None:
    if value and not all(c.isalnum() or c == "-" for c in value):
        return f"must be an HTTP header name, got {value!r}"
    return None


@attrs.frozen
class ConsoleConfig:
    listen: str = _setting(
        "127.0.0.1:9470", "HOST:PORT of `safetynet console` (loopback by default).",
        (_listen,))
    allow_actions: bool = _setting(
        False, "Let the console act (requeue, release, pause, resume, audit); read-only when "
        "false.")
    auth: str = _setting(
        "basic", "basic (user + password_hash) or proxy_header (an authenticating proxy's "
        "header, accepted only from trusted_proxies).", (_auth,))
    user: str = _setting("", "auth = basic: the login.")
    password_hash: Secret = _setting(
        Secret(""), "auth = basic: `safetynet console --hash-password` output (scrypt; never "
        "a clear-text password).", (_password_hash,))
    proxy_header: str = _setting(
        "X-Forwarded-User", "auth = proxy_header: the header naming the authenticated user.",
        (_header,))
    trusted_proxies: tuple[str, ...] = _setting(
        (), "auth = proxy_header: addresses or networks the header is accepted from.",
        (_networks,))
    refresh: int = _setting(
        10, "Seconds between a page's automatic refreshes (0 = never).",
        (lambda v: None if v >= 0 else f"must be >= 0, got {v!r}",), maximum=3600)


def console_problems(console: ConsoleConfig) -> list[str]:
    """What ``safetynet console`` needs beyond the section's own checks."""
    if console.auth == "basic":
        return [f"console.{key}: required when console.auth = basic"
                for key, value in (("user", console.user),
                                   ("password_hash", console.password_hash)) if not value]
    return [f"console.{key}: required when console.auth = proxy_header"
            for key, value in (("proxy_header", console.proxy_header),
                               ("trusted_proxies", console.trusted_proxies)) if not value]
