"""The ``[console]`` section (issue #27), a section of :class:`~supervision.app.settings.Config`.

Kept apart from the daemon's sections: only ``safetynet console`` reads it, and what it
requires (a user and a password hash, or a proxy header and the proxies' addresses) is
checked when the console starts (:func:`console_problems`), so a daemon's configuration
without a console stays valid.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

import attrs

from supervision.config.fields import non_negative, one_of, setting
from supervision.config.values import bounded_repr, host_port, is_loopback
from supervision.secrets import Secret

MIN_PROXY_SECRET = 16


def _password_hash(value: Any) -> str | None:
    from supervision.passwords import MIN_N, BadHash, parse_hash

    if not value:
        return None
    try:
        n, *_ = parse_hash(value.reveal())
    except BadHash as exc:
        return str(exc)
    if n < MIN_N:
        return (f"scrypt N = {n} is too cheap (at least {MIN_N}): make a new hash with "
                "`safetynet console --hash-password`")
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


def _origin(value: Any) -> str | None:
    """scheme://host[:port] as a browser sends it in Origin: no path, no credentials."""
    if not value:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return f"must be an origin like https://console.example.com, got {bounded_repr(value)}"
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or \
            parts.password or parts.path not in ("", "/") or parts.query or parts.fragment:
        return ("must be an origin (scheme://host[:port], no path or credentials), got "
                f"{bounded_repr(value)}")
    return None


def _long_secret(value: Any) -> str | None:
    if value and len(value.reveal()) < MIN_PROXY_SECRET:
        return f"must be at least {MIN_PROXY_SECRET} characters"
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
    proxy_secret: Secret = setting(
        Secret(""), "auth = proxy_header (required): a shared secret of at least 16 "
        "characters the proxy sends in proxy_secret_header, proving a request came through "
        "it (compared in constant time).", checks=[_long_secret])
    proxy_secret_header: str = setting(
        "X-Safetynet-Proxy-Secret", "auth = proxy_header: the header carrying proxy_secret.",
        checks=[_header])
    public_origin: str = setting(
        "", "The console's origin as the browser sees it behind a TLS terminator "
        "(`https://console.example.com`): POSTs may come from it and its host is accepted "
        "in Host. Required for auth = basic on a non-loopback listen.", checks=[_origin])
    refresh: int = setting(
        10, "Seconds between a page's automatic refreshes (0 = never).",
        checks=[non_negative], maximum=3600)


def console_problems(console: ConsoleConfig) -> list[str]:
    """What ``safetynet console`` needs beyond the section's own checks."""
    if console.auth == "basic":
        problems = [f"console.{key}: required when console.auth = basic"
                    for key, value in (("user", console.user),
                                       ("password_hash", console.password_hash)) if not value]
        if not console.public_origin and not is_loopback(listen_host(console.listen)):
            problems.append(
                "console.public_origin: required when console.auth = basic and console.listen "
                f"is not loopback ({console.listen}): basic auth only behind a TLS terminator, "
                "whose https:// origin this names")
        return problems
    return [f"console.{key}: required when console.auth = proxy_header"
            for key, value in (("proxy_header", console.proxy_header),
                               ("trusted_proxies", console.trusted_proxies),
                               ("proxy_secret", console.proxy_secret),
                               ("proxy_secret_header", console.proxy_secret_header))
            if not value]


def console_warnings(console: ConsoleConfig) -> list[str]:
    """What ``safetynet console`` warns of at start: trusted networks wider than one host
    (every process on any of their addresses may claim to be the proxy; the shared secret
    is then the only proof)."""
    if console.auth != "proxy_header":
        return []
    wide = [net for net in console.trusted_proxies
            if ipaddress.ip_network(net, strict=False).num_addresses > 1]
    return [f"console.trusted_proxies: {net} is wider than one host: every host in it may "
            "reach the console; list the proxy's own address" for net in wide]


def listen_host(listen: str) -> str:
    return listen.rpartition(":")[0].strip("[]")
