"""`safetynet dev` end to end: the seeded incident is healed exactly as seeded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dev_heals_the_seeded_incident_and_reports_the_truth(tmp_path: Path) -> None:
    """200 recordings and 30 conferences through an S3 outage: the final summary equals
    the seeded truth, nothing is quarantined or restarted, every server is stopped."""
    proc = subprocess.run(
        [sys.executable, "-m", "supervision", "dev", "--recordings", "200",
         "--conferences", "30", "--exit-when-done", "--dir", str(tmp_path / "stack")],
        capture_output=True, text=True, cwd=ROOT, timeout=240, check=False,
        env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")]
    summary = json.loads(line.removeprefix("SUMMARY "))
    assert summary == {
        "reconciled": 140, "failed": 40, "republished": 20, "quarantined": 0,
        "transient": summary["transient"], "published": 180, "empty_timeout": 10,
        "provision_failed": 10, "stale_timeout": 10, "restarts": 0,
    }
    assert "stopped every server" in proc.stdout
