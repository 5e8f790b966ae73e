"""The log scanner behind the suite-wide "no secrets in logs" check."""

from __future__ import annotations

import re
from collections.abc import Iterable

KNOWN_SECRETS: set[str] = set()  # passwords and keys of the servers started so far
CREDENTIALS_IN_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@\"']+:[^/\s@\"']+@", re.I)


def leaks(text: str, secrets: Iterable[str]) -> list[str]:
    """What in *text* must not be there: a known secret, or a URL carrying credentials.
    Returned as descriptions that do not repeat the secret."""
    found = [f"secret #{n}" for n, secret in enumerate(sorted(secrets)) if secret
             and secret in text]
    found += [f"URL with credentials ({m[0].split(':', 1)[0]}://...)"
              for m in CREDENTIALS_IN_URL.finditer(text)]
    return found
