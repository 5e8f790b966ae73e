"""Who may use the console, and what a request must carry (issue #27 item 5, issue #38 item 4).

* Host: a request whose ``Host`` is not one the console answers to (its ``listen`` address,
  ``localhost`` on a loopback listen, the host of ``console.public_origin``) is refused
  before anything else (a DNS-rebinding page names its own host).
* Authentication: HTTP basic against ``console.password_hash`` (scrypt,
  :mod:`~supervision.passwords`), or ``console.proxy_header`` set by an authenticating
  proxy, believed only from ``console.trusted_proxies`` and only with the shared
  ``console.proxy_secret`` in ``console.proxy_secret_header`` (compared in constant time);
  a repeated identity header is refused.
* Basic logins: scrypt runs on every attempt checked, an unknown user against a dummy hash
  of the same cost (the time taken does not tell a valid user name), in a worker thread,
  at most :data:`MAX_SCRYPT_AT_ONCE` at a time (no lock: pages of verified logins never
  wait behind a stream of bad ones).
* Failed logins: logged (``console_login_failed``, the client and the user name, never the
  password) and limited per user name (:data:`MAX_FAILURES`) and per client address
  (:data:`MAX_ADDRESS_FAILURES`) in :data:`FAILURE_WINDOW_S`, then 429 without running
  scrypt; each table keeps at most :data:`MAX_TRACKED` keys.
* Cross-site requests: a POST whose ``Sec-Fetch-Site`` is neither ``same-origin`` nor
  ``none``, or whose ``Origin`` is neither ``console.public_origin`` nor the console's own
  ``scheme://Host``, is refused; a POST must also carry the per-session token (an HMAC of
  the session cookie and the user under a key made at start).
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
import time
from collections.abc import Collection, Sequence
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import attrs
import structlog

from supervision.config import ConsoleConfig
from supervision.config.console import listen_host
from supervision.passwords import BadHash, parse_hash, verify_password

MAX_FAILURES = 5  # per user name, from any address
MAX_ADDRESS_FAILURES = 20  # per client address, whatever the user name (a proxy's address)
FAILURE_WINDOW_S = 60.0
MAX_TRACKED = 10_000  # keys per failure table: the oldest is forgotten first
MAX_SCRYPT_AT_ONCE = 2  # scrypt at N = 2^17 holds 128 MiB while it runs
VERIFIED_TTL_S = 300.0
SESSION_COOKIE = "safetynet_console_session"
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"content-security-policy": CSP, "x-frame-options": "DENY",
           "x-content-type-options": "nosniff", "referrer-policy": "same-origin",
           "cache-control": "no-store", "cross-origin-opener-policy": "same-origin"}
CHALLENGE = {"www-authenticate": 'Basic realm="safetynet console", charset="UTF-8"'}
Headers = Sequence[tuple[str, str]]  # every (lower-case name, value), repeats included

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
class FailureLimit:
    """Failures per key (a user name, a client address) in a sliding window: at most
    *limit* times kept per key, at most :data:`MAX_TRACKED` keys."""

    limit: int
    seen: collections.OrderedDict[str, collections.deque[float]] = attrs.field(
        factory=collections.OrderedDict)

    def blocked(self, key: str, now: float) -> bool:
        times = self.seen.get(key)
        if times is None:
            return False
        while times and now - times[0] >= FAILURE_WINDOW_S:
            times.popleft()
        if not times:
            del self.seen[key]
        return len(times) >= self.limit

    def add(self, key: str, now: float) -> int:
        times = self.seen.pop(key, None) or collections.deque(maxlen=self.limit)
        times.append(now)
        self.seen[key] = times  # the most recent last
        while len(self.seen) > MAX_TRACKED:
            self.seen.popitem(last=False)
        return len(times)


def values(headers: Headers, name: str) -> list[str]:
    return [value for key, value in headers if key == name]


@attrs.define
class Gate:
    """The console's authentication state: failures per user and per client, logins
    verified lately. Touched only from the event loop (scrypt alone runs in a thread)."""

    cfg: ConsoleConfig
    key: bytes = attrs.field(factory=lambda: secrets.token_bytes(32))
    by_user: FailureLimit = attrs.field(factory=lambda: FailureLimit(MAX_FAILURES))
    by_client: FailureLimit = attrs.field(factory=lambda: FailureLimit(MAX_ADDRESS_FAILURES))
    verified: dict[bytes, float] = attrs.field(factory=dict)
    clock: object = time.monotonic
    scrypt_slots: anyio.CapacityLimiter = attrs.field(
        factory=lambda: anyio.CapacityLimiter(MAX_SCRYPT_AT_ONCE))
    dummy_hash: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.dummy_hash = dummy_hash(self.cfg.password_hash.reveal())

    def now(self) -> float:
        return self.clock()  # type: ignore[operator,no-any-return]

    async def authenticate(self, client: str, headers: Headers) -> Login | Refusal:
        """The login of a request (a basic login may cost one scrypt, in a thread)."""
        if self.cfg.auth == "proxy_header":
            return self._proxy(client, headers)
        return await self._basic(client, headers)

    def failed(self, client: str, user: str, why: str) -> None:
        now = self.now()
        self.by_user.add(user[:64], now)
        failures = self.by_client.add(client, now)
        log.warning("console_login_failed", client=client, user=user[:64], why=why,
                    failures=failures)

    async def _basic(self, client: str, headers: Headers) -> Login | Refusal:
        sent = values(headers, "authorization")
        if len(sent) > 1:
            return Refusal(400, "more than one Authorization header")
        header = sent[0] if sent else ""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return Refusal(401, "authentication required", CHALLENGE)
        digest = hashlib.sha256(self.key + header.encode()).digest()
        credentials = _credentials(encoded)
        if credentials is not None and self.verified.get(digest, 0.0) > self.now():
            return Login(credentials[0])
        user = credentials[0] if credentials else ""
        if self.by_client.blocked(client, self.now()) or \
                self.by_user.blocked(user[:64], self.now()):
            return Refusal(429, "too many failed logins; try again later",
                           {"retry-after": str(int(FAILURE_WINDOW_S))})
        if credentials is None:
            self.failed(client, "", "malformed credentials")
            return Refusal(401, "authentication required", CHALLENGE)
        if not await anyio.to_thread.run_sync(self._check, *credentials,
                                              limiter=self.scrypt_slots):
            self.failed(client, user, "wrong user or password")
            return Refusal(401, "wrong user or password", CHALLENGE)
        if len(self.verified) > 1000:
            self.verified.clear()
        self.verified[digest] = self.now() + VERIFIED_TTL_S
        return Login(user)

    def _check(self, user: str, password: str) -> bool:
        """One scrypt whatever the user name: an unknown one against the dummy hash."""
        known = hmac.compare_digest(hashlib.sha256(user.encode()).digest(),
                                    hashlib.sha256(self.cfg.user.encode()).digest())
        stored = self.cfg.password_hash.reveal() if known else self.dummy_hash
        return verify_password(password, stored) and known

    def _proxy(self, client: str, headers: Headers) -> Login | Refusal:
        if not trusted(client, self.cfg.trusted_proxies):
            log.warning("console_login_failed", client=client, why="not a trusted proxy")
            return Refusal(403, "requests are accepted only through the authenticating proxy")
        proofs = values(headers, self.cfg.proxy_secret_header.lower())
        secret = self.cfg.proxy_secret.reveal().encode()
        if not secret or len(proofs) != 1 or not hmac.compare_digest(
                proofs[0].encode(), secret):
            log.warning("console_login_failed", client=client,
                        why=f"no or wrong {self.cfg.proxy_secret_header}")
            return Refusal(403, "requests are accepted only through the authenticating proxy")
        users = values(headers, self.cfg.proxy_header.lower())
        if len(users) > 1 or any("," in user for user in users):
            log.warning("console_login_failed", client=client,
                        why=f"repeated {self.cfg.proxy_header}")
            return Refusal(400, f"more than one {self.cfg.proxy_header} header")
        user = users[0].strip() if users else ""
        if not user:
            log.warning("console_login_failed", client=client, why="no proxy header")
            return Refusal(401, f"the proxy sent no {self.cfg.proxy_header} header")
        return Login(user[:256])

    def token(self, session: str, user: str) -> str:
        """The per-session token every form carries."""
        return hmac.new(self.key, f"{session}\n{user}".encode(), hashlib.sha256).hexdigest()

    def token_ok(self, session: str, user: str, token: str) -> bool:
        return bool(session) and hmac.compare_digest(self.token(session, user).encode(),
                                                     token.encode())


def _credentials(encoded: str) -> tuple[str, str] | None:
    try:
        user, sep, password = base64.b64decode(encoded, validate=True).decode(
            "utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def dummy_hash(stored: str) -> str:
    """A hash no password matches, of the same cost as *stored* (when it parses)."""
    try:
        n, r, p, salt, key = parse_hash(stored)
    except BadHash:
        n, r, p, salt, key = 2**14, 8, 1, b"\0" * 16, b"\0" * 32
    return "$".join(("scrypt", str(n), str(r), str(p),
                     base64.b64encode(secrets.token_bytes(len(salt))).decode(),
                     base64.b64encode(secrets.token_bytes(len(key))).decode()))


def new_session() -> str:
    return secrets.token_urlsafe(32)


def trusted(client: str, networks: tuple[str, ...]) -> bool:
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in networks)


@attrs.frozen
class Site:
    """The Host values the console answers to and the origin a TLS terminator shows."""

    hosts: frozenset[str]
    any_ip_port: str | None  # a wildcard listen: any IP address on this port
    public_origin: str

    @classmethod
    def of(cls, cfg: ConsoleConfig) -> Site:
        host = listen_host(cfg.listen).lower()
        port = cfg.listen.rpartition(":")[2]
        names = {f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
        wildcard = host in ("0.0.0.0", "::")
        if wildcard or host == "localhost":
            hosts = set(names)
        else:
            hosts = {f"[{host}]:{port}" if ":" in host else f"{host}:{port}"}
            if ipaddress.ip_address(host).is_loopback:
                hosts.add(f"localhost:{port}")
        public = cfg.public_origin.rstrip("/").lower()
        if public:
            parts = urlsplit(public)
            hosts.add(parts.netloc)
            if parts.port in (None, 443 if parts.scheme == "https" else 80):
                hosts.add(parts.hostname or "")
        return cls(frozenset(hosts), port if wildcard else None, public)

    def host_ok(self, host: str) -> bool:
        host = host.lower()
        if host in self.hosts:
            return True
        if self.any_ip_port is None:
            return False
        name, sep, port = host.rpartition(":")
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False
        return bool(sep) and port == self.any_ip_port

    def origins(self, scheme: str, host: str) -> Collection[str]:
        return {f"{scheme}://{host.lower()}", *((self.public_origin,) if self.public_origin
                                                else ())}


def cross_site(headers: dict[str, str], origins: Collection[str]) -> str | None:
    """Why a state-changing request looks cross-site (None: it does not)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {site}"
    origin = headers.get("origin")
    if origin is not None and origin.lower() not in origins:
        return "Origin is not this console"
    return None
