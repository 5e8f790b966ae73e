"""Who may use the console, and what a request must carry (issue #27, item 5).

* Authentication: HTTP basic against ``console.password_hash`` (scrypt,
  :mod:`~supervision.passwords`), or ``console.proxy_header`` set by an
  authenticating proxy, believed only from ``console.trusted_proxies``.
* Failed logins: logged (``console_login_failed``, the client and the user name, never the
  password) and rate-limited per client address: :data:`MAX_FAILURES` in
  :data:`FAILURE_WINDOW_S`, then 429 without checking anything.
* Cross-site requests: a POST whose ``Sec-Fetch-Site`` is neither ``same-origin`` nor
  ``none``, or whose ``Origin`` is not the console's, is refused; a POST must also carry the
  per-session token (an HMAC of the session cookie and the user under a key made at start).
* Every response: a strict Content-Security-Policy (no script at all), ``frame-ancestors
  'none'``, nosniff, no referrer to other sites (``no-referrer`` would make
  browsers send ``Origin: null`` on the console's own forms), no caching.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import ipaddress
import secrets
import threading
import time

import attrs
import structlog

from supervision.config import ConsoleConfig
from supervision.passwords import verify_password

MAX_FAILURES = 5
FAILURE_WINDOW_S = 60.0
MAX_TRACKED_CLIENTS = 10_000
VERIFIED_TTL_S = 300.0
SESSION_COOKIE = "safetynet_console_session"
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"content-security-policy": CSP, "x-frame-options": "DENY",
           "x-content-type-options": "nosniff", "referrer-policy": "same-origin",
           "cache-control": "no-store", "cross-origin-opener-policy": "same-origin"}

log = structlog.get_logger("safetynet.console")


@attrs.frozen
class Login:
    user: str


@attrs.frozen
class Refusal:
    status: int
    message: str
    headers: dict[str, str] = attrs.field(factory=dict)


@attrs.define
class Gate:
    """The console's authentication state: failures per client, logins verified lately."""

    cfg: ConsoleConfig
    key: bytes = attrs.field(factory=lambda: secrets.token_bytes(32))
    failures: collections.OrderedDict[str, list[float]] = attrs.field(
        factory=collections.OrderedDict)
    verified: dict[bytes, float] = attrs.field(factory=dict)
    clock: object = time.monotonic
    # authenticate runs in worker threads (a login may cost one scrypt): one at a time
    # touches the counters
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def now(self) -> float:
        return self.clock()  # type: ignore[operator,no-any-return]

    def limited(self, client: str) -> bool:
        now = self.now()
        recent = [t for t in self.failures.get(client, []) if now - t < FAILURE_WINDOW_S]
        self.failures[client] = recent
        return len(recent) >= MAX_FAILURES

    def failed(self, client: str, user: str, why: str) -> None:
        self.failures.setdefault(client, []).append(self.now())
        self.failures.move_to_end(client)
        while len(self.failures) > MAX_TRACKED_CLIENTS:
            self.failures.popitem(last=False)
        log.warning("console_login_failed", client=client, user=user[:64], why=why,
                    failures=len(self.failures[client]))

    def authenticate(self, client: str, headers: dict[str, str]) -> Login | Refusal:
        """The login of a request (a worker thread: a basic login may cost one scrypt)."""
        with self.lock:
            return self._authenticate(client, headers)

    def _authenticate(self, client: str, headers: dict[str, str]) -> Login | Refusal:
        if self.cfg.auth == "proxy_header":
            return self._proxy(client, headers)
        if self.limited(client):
            return Refusal(429, "too many failed logins; try again later",
                           {"retry-after": str(int(FAILURE_WINDOW_S))})
        challenge = {"www-authenticate": 'Basic realm="safetynet console", charset="UTF-8"'}
        header = headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return Refusal(401, "authentication required", challenge)
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, sep, password = "", "", ""
        if not sep:
            self.failed(client, "", "malformed credentials")
            return Refusal(401, "authentication required", challenge)
        digest = hashlib.sha256(self.key + header.encode()).digest()
        if self.verified.get(digest, 0.0) > self.now():
            return Login(user)
        if not (hmac.compare_digest(user.encode(), self.cfg.user.encode())
                and verify_password(password, self.cfg.password_hash.reveal())):
            self.failed(client, user, "wrong user or password")
            return Refusal(401, "wrong user or password", challenge)
        if len(self.verified) > 1000:
            self.verified.clear()
        self.verified[digest] = self.now() + VERIFIED_TTL_S
        return Login(user)

    def _proxy(self, client: str, headers: dict[str, str]) -> Login | Refusal:
        if not trusted(client, self.cfg.trusted_proxies):
            log.warning("console_login_failed", client=client, why="not a trusted proxy")
            return Refusal(403, "requests are accepted only through the authenticating proxy")
        user = headers.get(self.cfg.proxy_header.lower(), "").strip()
        if not user:
            log.warning("console_login_failed", client=client, why="no proxy header")
            return Refusal(401, f"the proxy sent no {self.cfg.proxy_header} header")
        return Login(user[:256])

    def token(self, session: str, user: str) -> str:
        """The per-session token every form carries."""
        return hmac.new(self.key, f"{session}\n{user}".encode(), hashlib.sha256).hexdigest()

    def token_ok(self, session: str, user: str, token: str) -> bool:
        return bool(session) and hmac.compare_digest(self.token(session, user), token)


def new_session() -> str:
    return secrets.token_urlsafe(32)


def trusted(client: str, networks: tuple[str, ...]) -> bool:
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in networks)


def cross_site(headers: dict[str, str], host: str, scheme: str) -> str | None:
    """Why a state-changing request looks cross-site (None: it does not)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {site}"
    origin = headers.get("origin")
    if origin is not None and origin != f"{scheme}://{host}":
        return "Origin is not this console"
    return None
