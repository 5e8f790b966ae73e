"""``make audit``: known vulnerabilities of every locked package, or a clear failure.

    python tools/audit_locks.py [--service pypi|osv] LOCK...

Runs ``pip-audit --strict`` over each lock file (hashes required, pip not used: the
locks pin everything). First it asks the vulnerability source whether it answers at all —
a package's PyPI JSON (``pypi``) or an OSV query (``osv``) — because where it does not
(an index mirror that serves only ``/simple``, no network) nothing can be audited: that
is said in one line and the exit is 2, never a "No known vulnerabilities found". Exit 0:
no known vulnerability; 1: pip-audit found some or could not audit a package.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

PROBES = {  # a request the source must answer with JSON
    "pypi": ("https://pypi.org/pypi/pip/24.0/json", None),
    "osv": ("https://api.osv.dev/v1/query",
            {"package": {"name": "pip", "ecosystem": "PyPI"}, "version": "24.0"}),
}
EXIT_NO_SOURCE = 2


def source_problem(service: str, timeout: float = 15.0) -> str | None:
    """Why *service* cannot be used as the vulnerability source, or None."""
    url, body = PROBES[service]
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return f"{url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} is unreachable ({getattr(exc, 'reason', exc)})"
    except ValueError:
        return f"{url} did not answer JSON"
    if service == "pypi" and "vulnerabilities" not in answer:
        return f"{url} answered without a vulnerabilities list"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--service", choices=sorted(PROBES), default="pypi")
    parser.add_argument("locks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    problem = source_problem(args.service)
    if problem is not None:
        print(f"audit: no vulnerability source reachable ({args.service}: {problem}); "
              "nothing was audited", file=sys.stderr)
        return EXIT_NO_SOURCE
    worst = 0
    for lock in args.locks:
        print(f"audit: {lock}", flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip_audit", "--strict", "--require-hashes", "--disable-pip",
             "--progress-spinner", "off", "--vulnerability-service", args.service,
             "-r", str(lock)], check=False)
        worst = max(worst, done.returncode)
    return worst


if __name__ == "__main__":
    sys.exit(main())
