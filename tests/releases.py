"""An earlier release of safetynet, built from this clone's history into a wheel and
installed with ``--no-deps`` into a directory of its own (its dependencies are this
venv's): the upgrade tests run its CLI beside today's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def release_site(commit: str, base: Path) -> Path:
    """*commit* built and installed under *base*; the directory to put on PYTHONPATH.
    Skips when git is missing or the clone is shallow (the commit is not in it)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                      capture_output=True, check=False).returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone (a shallow checkout)")
    src, wheels, site = base / "src", base / "wheel", base / "site"
    src.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(src)], check=True)
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True)
    return site
