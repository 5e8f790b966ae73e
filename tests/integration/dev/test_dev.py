"""`safetynet dev` end to end, run as a user would: from an installed wheel, in a directory
outside the checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from supervision.app.devrun import mismatches
from tests.stack_fixtures import server_tempdir
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel and installed (without its dependencies, which this
    interpreter has) into a folder of its own: no checkout on the import path."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: setuptools' build/ folder would keep stale modules
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(out / "dist"), str(source)],
                   check=True, capture_output=True, cwd=out)
    (wheel,) = (out / "dist").glob("safetynet-*.whl")
    site = out / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    return site


def run_dev(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``safetynet dev`` run in *cwd*, its stack outside pytest's root (see own_stack_dir)."""
    env = {"PATH": os.environ.get("PATH", ""), "COLUMNS": "120", "PYTHONPATH": str(site)}
    with server_tempdir("safetynet-dev-test-") as stack:
        return subprocess.run(
            [sys.executable, "-m", "supervision.app", "dev", "--exit-when-done",
             "--dir", str(stack), *args],
            capture_output=True, text=True, cwd=cwd, timeout=240, check=False, env=env)


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    (line,) = lines
    summary: dict[str, int] = json.loads(line.removeprefix("SUMMARY "))
    return summary


def test_installed_wheel_runs_the_code_and_settings_it_ships(wheel_site: Path,
                                                             tmp_path: Path) -> None:
    """From the wheel, outside the checkout, the package and its demo settings come from
    the install, not from the repository."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(wheel_site)}
    probe = subprocess.run(
        [sys.executable, "-c", "import supervision, importlib.resources as r; "
         "print(supervision.__file__); "
         "print(r.files('supervision.dev').joinpath('demo.toml').is_file())"],
        capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    where, shipped = probe.stdout.split()
    assert Path(where).is_relative_to(wheel_site)
    assert shipped == "True"


def test_dev_heals_the_seeded_incident_and_reports_the_truth(wheel_site: Path,
                                                             tmp_path: Path) -> None:
    """200 recordings and 30 conferences through an S3 outage, from an installed wheel in a
    directory outside the checkout: the final summary equals the seeded truth, nothing is
    quarantined or restarted, every server is stopped."""
    proc = run_dev(wheel_site, tmp_path, "--recordings", "200", "--conferences", "30")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = summary_of(proc)
    assert summary == {
        "reconciled": 140, "failed": 40, "republished": 20, "quarantined": 0,
        "transient": summary["transient"], "published": 180, "empty_timeout": 10,
        "provision_failed": 10, "stale_timeout": 10, "restarts": 0,
    }
    assert "stopped every server" in proc.stdout
    assert re.search(r"console   http://127\.0\.0\.1:\d+/  \(user dev, password \S+;",
                     proc.stdout)


def test_dev_serves_the_console_beside_the_demo(wheel_site: Path, tmp_path: Path,
                                                own_stack_dir: Path) -> None:
    """While the demo runs, the address it prints answers the console's overview with the
    printed login (and 401 without it); Ctrl-C stops both."""
    env = {"PATH": os.environ.get("PATH", ""), "COLUMNS": "200", "PYTHONPATH": str(wheel_site)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervision.app", "dev", "--dir", str(own_stack_dir),
         "--recordings", "20", "--conferences", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path, env=env)
    try:
        assert proc.stdout is not None
        match = None
        for line in proc.stdout:
            match = re.search(r"console   (http://\S+)  \(user (\S+), password (\S+);", line)
            if match:
                break
        assert match, "no console address printed"
        url, user, password = match.groups()
        wait_until(lambda: _answers(url), 30.0, "the console to listen")
        assert httpx.get(url, timeout=10).status_code == 401
        overview = httpx.get(url, auth=(user, password), timeout=10)
        assert overview.status_code == 200 and "SLO verdicts" in overview.text
        # the daemon leads a job (it handles Ctrl-C from then on): the console shows it
        wait_until(lambda: "none yet" not in httpx.get(url, auth=(user, password),
                                                       timeout=10).text,
                   60.0, "a lease holder on the console's overview", step_s=0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return True


def test_dev_past_its_deadline_exits_1_with_the_summary_and_what_was_missed(
        wheel_site: Path, tmp_path: Path) -> None:
    """--exit-when-done never waits forever: past --deadline it stops, prints the summary
    and each figure not reached, and exits 1 (the servers are still stopped)."""
    # the S3 outage of the first 6 s keeps the seeded truth out of reach by the deadline
    proc = run_dev(wheel_site, tmp_path, "--recordings", "20", "--conferences", "3",
                   "--deadline", "3")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary_of(proc)
    assert "deadline of 3s passed" in proc.stdout
    assert "not reached: " in proc.stdout
    assert "stopped every server" in proc.stdout


def test_mismatches_names_each_figure_that_differs_from_the_truth() -> None:
    """Figures equal to the truth are not reported; extra figures are ignored."""
    truth = {"reconciled": 3, "failed": 1, "published": 4}
    seen = {"reconciled": 3, "failed": 0, "published": 5, "transient": 9}
    assert mismatches(seen, truth) == ["failed: seen 0, seeded 1",
                                       "published: seen 5, seeded 4"]
    assert mismatches(truth, truth) == []
