"""``make audit`` without a vulnerability source says so and fails; it never reports a
clean audit it did not make (issue #26)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def audit_locks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("audit_locks", ROOT / "tools" / "audit_locks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("service", ["pypi", "osv"])
def test_an_unreachable_source_fails_with_one_line_and_audits_nothing(
        service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The source refuses the connection: exit 2, one line naming it, pip-audit not run."""
    module = audit_locks()
    url = f"http://127.0.0.1:{closed_port()}/probe"
    monkeypatch.setitem(module.PROBES, service, (url, None))
    ran: list[object] = []
    monkeypatch.setattr(module.subprocess, "run", lambda *a, **k: ran.append(a))
    assert module.main(["--service", service, str(ROOT / "requirements" / "runtime.lock")]) == 2
    err = capsys.readouterr()
    assert err.err.startswith(f"audit: no vulnerability source reachable ({service}: {url}")
    assert "No known vulnerabilities" not in err.out + err.err
    assert ran == []


def test_make_audit_runs_pip_audit_strict_over_both_locks() -> None:
    """The Makefile's audit target names both locks; the tool passes --strict."""
    makefile = (ROOT / "Makefile").read_text()
    assert "tools/audit_locks.py --service $(AUDIT_SERVICE) $(LOCK) $(RUNTIME_LOCK)" in makefile
    assert '"--strict"' in (ROOT / "tools" / "audit_locks.py").read_text()
