"""Password hashes for the console's basic authentication: scrypt, from :mod:`hashlib`.

>>> stored = hash_password("correct horse")   # what `safetynet console --hash-password` prints
>>> stored.split("$")[:4]
['scrypt', '131072', '8', '1']
>>> verify_password("correct horse", stored)
True

The format is ``scrypt$N$r$p$<salt, base64>$<key, base64>`` (N, r, p the scrypt cost
parameters, a 16-byte random salt, a 32-byte key), so the parameters can be raised later
without breaking the hashes already in configuration files. New hashes use N = 2^17
(OWASP's recommendation for scrypt): verifying costs ~0.3 s of CPU and 128 MiB on purpose;
failed logins are rate-limited before it is reached, and the console runs at most a few at
once. A configured hash below :data:`MIN_N` is refused (``console.password_hash``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

N, R, P = 2**17, 8, 1
MIN_N = 2**14  # a configured hash cheaper than this is refused
SALT_BYTES, KEY_BYTES = 16, 32
MAX_N = 2**20  # a hash from config asking for more is refused (memory: 128 * N * r)


class BadHash(ValueError):
    """Not a ``scrypt$N$r$p$salt$key`` value; the message never quotes it."""


def _maxmem(n: int, r: int) -> int:
    return 128 * n * r * 2 + 1024 * 1024


def hash_password(password: str, *, n: int = N, r: int = R, p: int = P) -> str:
    """A new hash of *password* (the cost parameters: tests and the dev demo pass a
    smaller *n*, never below :data:`MIN_N`)."""
    salt = secrets.token_bytes(SALT_BYTES)
    key = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=KEY_BYTES,
                         maxmem=_maxmem(n, r))
    return "$".join(("scrypt", str(n), str(r), str(p), _b64(salt), _b64(key)))


def parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise BadHash("must be scrypt$N$r$p$salt$key (from `safetynet console --hash-password`)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, key = base64.b64decode(parts[4], validate=True), base64.b64decode(
            parts[5], validate=True)
    except ValueError:
        raise BadHash("scrypt parameters or base64 fields are malformed") from None
    if n < 2 or n & (n - 1) or n > MAX_N or not 1 <= r <= 32 or not 1 <= p <= 16:
        raise BadHash(f"scrypt cost out of range (N a power of 2 up to {MAX_N}, r 1-32, "
                      "p 1-16)")
    if len(salt) < 8 or len(key) < 16:
        raise BadHash("salt or key too short")
    return n, r, p, salt, key


def verify_password(password: str, stored: str) -> bool:
    """Whether *password* matches *stored* (constant-time comparison of the keys)."""
    n, r, p, salt, key = parse_hash(stored)
    candidate = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(key),
                               maxmem=_maxmem(n, r))
    return hmac.compare_digest(candidate, key)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
