"""The ``[console]`` section (issue #27), a section of :class:`~supervision.app.settings.Config`.

Kept apart from the daemon's sections: only ``safetynet console`` reads it, and what it
requires (a user and a password hash, or a proxy header and the proxies' addresses) is
checked when the console starts (:func:`console_problems`), so a daemon's configuration
without a console stays valid.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import attrs

from supervision.config.fields import non_negative, one_of, setting
from supervision.config.values import host_port
from supervision.secrets import Secret


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
    listen: str = setting(
        "127.0.0.1:9470", "HOST:PORT of `safetynet console` (loopback by default).",
        checks=[host_port])
    allow_actions: bool = setting(
        False, "Let the console act (requeue, release, pause, resume, audit); read-only when "
        "false.")
    auth: str = setting(
        "basic", "basic (user + password_hash) or proxy_header (an authenticating proxy's "
        "header, accepted only from trusted_proxies).",
        checks=[one_of("basic", "proxy_header")])
    user: str = setting("", "auth = basic: the login.")
    password_hash: Secret = setting(
        Secret(""), "auth = basic: `safetynet console --hash-password` output (scrypt; never "
        "a clear-text password).", checks=[_password_hash])
    proxy_header: str = setting(
        "X-Forwarded-User", "auth = proxy_header: the header naming the authenticated user.",
        checks=[_header])
    trusted_proxies: tuple[str, ...] = setting(
        (), "auth = proxy_header: addresses or networks the header is accepted from.",
        checks=[_networks])
    refresh: int = setting(
        10, "Seconds between a page's automatic refreshes (0 = never).",
        checks=[non_negative], maximum=3600)


def console_problems(console: ConsoleConfig) -> list[str]:
    """What ``safetynet console`` needs beyond the section's own checks."""
    if console.auth == "basic":
        return [f"console.{key}: required when console.auth = basic"
                for key, value in (("user", console.user),
                                   ("password_hash", console.password_hash)) if not value]
    return [f"console.{key}: required when console.auth = proxy_header"
            for key, value in (("proxy_header", console.proxy_header),
                               ("trusted_proxies", console.trusted_proxies)) if not value]
