"""The operator CLI as its users run it: `python -m supervision.app VERB ... -c FILE` in a
child process with a bare environment and a wide terminal, against a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]


def postgres_only_config(tmp_path: Path, dsn: str) -> Path:
    """A config file that names only the database (every other setting at its default)."""
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({"postgres": {"dsn": dsn}}))
    return path


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervision.app", *args, "-c", str(config)],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "200"})
