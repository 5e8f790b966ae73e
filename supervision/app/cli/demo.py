"""``safetynet dev``: the demo on the embedded stack."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from supervision.app.cli.group import main


@main.command()
@click.option("--dir", "base_dir", type=click.Path(path_type=Path), default=None,
              help="Where the servers keep their data (default: a fresh temp dir).")
@click.option("--recordings", default=2000, show_default=True,
              help="Lost-callback recordings to seed.")
@click.option("--conferences", default=300, show_default=True,
              help="Orphaned conferences to seed.")
@click.option("--no-outage", is_flag=True, help="Skip the simulated S3 outage.")
@click.option("--exit-when-done", is_flag=True,
              help="Stop once every seeded row is terminal (non-interactive runs); exit 1 "
                   "when the summary differs from the seeded truth.")
@click.option("--deadline", default=300.0, show_default=True,
              help="With --exit-when-done: seconds after seeding before giving up (exit 1).")
def dev(base_dir: Path | None, recordings: int, conferences: int, no_outage: bool,
        exit_when_done: bool, deadline: float) -> None:
    """Demo: PostgreSQL, Tansu and SeaweedFS locally, a seeded incident, the daemon healing
    it live; Ctrl-C stops everything."""
    from supervision.app.devrun import Scenario, run_dev

    scenario = Scenario(recordings, conferences, not no_outage, exit_when_done, deadline)
    sys.exit(run_dev(base_dir, scenario))
