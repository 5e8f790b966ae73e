"""The log scanner behind the suite-wide "no secrets in logs" check: known secrets, and
credentials whatever their value (URL userinfo, libpq ``password = ...``, psycopg's
percent-encoding message)."""

from __future__ import annotations

import re
from collections.abc import Iterable

KNOWN_SECRETS: set[str] = set()  # passwords and keys of the servers started so far
CREDENTIALS_IN_URL = re.compile(
    r"[a-z][a-z0-9+.-]*://[^/\s:@\"']+:(?!\*\*\*@)[^/\s@\"']+@", re.I)
# libpq key=value credentials (password, sslpassword, ... with or without spaces) not masked
CREDENTIALS_IN_CONNINFO = re.compile(
    r"\b(\w*password)\s*=\s*(?!\*\*\*)(?:'[^']*'|[^\s'\"\\,}&]+)", re.I)
# psycopg's message for a bad '%' in a URL quotes the token, i.e. the password
PERCENT_TOKEN = re.compile(r'percent-encoded token: \\?"(?!\*\*\*)')


def leaks(text: str, secrets: Iterable[str]) -> list[str]:
    """What in *text* must not be there: a known secret, or a URL carrying credentials.
    Returned as descriptions that do not repeat the secret."""
    found = [f"secret #{n}" for n, secret in enumerate(sorted(secrets)) if secret
             and secret in text]
    found += [f"URL with credentials ({m[0].split(':', 1)[0]}://...)"
              for m in CREDENTIALS_IN_URL.finditer(text)]
    found += [f"connection string with {m[1]}=..." for m in CREDENTIALS_IN_CONNINFO.finditer(text)]
    found += ["psycopg's percent-encoding message" for _ in PERCENT_TOKEN.finditer(text)]
    return found
