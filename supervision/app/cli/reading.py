"""The reading verbs: ``status`` (backlogs and SLO verdicts), ``audit`` (the invariants
from live data) and ``plan`` (a dry run of a job's next cycle)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from supervision.app.cli.group import EXIT_SLO, config_option, job_option, main
from supervision.app.terminal import cell, printable
from supervision.app.verbs import fail, load_or_exit, operator_connection
from supervision.errors import describe
from supervision.jobs import Job
from supervision.secrets import secrets_in


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@config_option
def status(as_json: bool, config_files: tuple[Path, ...]) -> None:
    """Backlogs, oldest ages, quarantine and SLO verdicts; exit 2 when an SLO is violated."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app.runbook import status as read_status

    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            current = read_status(conn, cfg)
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    if as_json:
        click.echo(json.dumps(current.as_json(), default=str))
    else:
        print_status(current)
    sys.exit(EXIT_SLO if current.violated else 0)


def print_status(current: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="safetynet status", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for section, values in ((Job.RECORDING_FINALIZE, current.finalize),
                            (Job.CONFERENCE_REAPER, current.conferences),
                            ("outbox", current.outbox)):
        for key, value in values.items():
            table.add_row(f"{section} {key}", cell(value))
    console.print(table)
    if current.paused:
        paused = Table(title="paused jobs (no replica runs them until `safetynet resume`)")
        for column in ("job", "paused_at", "paused_by", "paused_for_seconds", "reason"):
            paused.add_column(column)
        for row in current.paused:
            paused.add_row(*(cell(row[c] if row[c] is not None else "") for c in (
                "job", "paused_at", "paused_by", "paused_for_seconds", "reason")))
        console.print(paused)
    if current.quarantined:
        quarantine = Table(title="quarantined finalize rows (oldest first)")
        for column in ("recording_id", "attempts", "last_error", "updated_at"):
            quarantine.add_column(column)
        for row in current.quarantined:
            quarantine.add_row(cell(row["recording_id"]), cell(row["attempts"]),
                               cell(row["last_error"] or ""), cell(row["updated_at"]))
        console.print(quarantine)
    if current.poisoned:
        from rich.markup import escape

        poison = Table(title="poison conferences held out of the reaper's claim")
        for column in ("conference_id", "phase", "failures", "reason", "next_attempt_at"):
            poison.add_column(column)
        for row in current.poisoned:
            poison.add_row(*(escape(row[c] or "") for c in (
                "conference_id", "phase", "failures", "reason", "next_attempt_at")))
        console.print(poison)
    slos = Table(title="SLO verdicts")
    slos.add_column("SLO")
    slos.add_column("verdict")
    slos.add_column("value", justify="right")
    for verdict in current.verdicts:
        slos.add_row(verdict.slo, "[green]ok[/]" if verdict.ok else "[red]VIOLATED[/]",
                     cell(verdict.value))
    console.print(slos)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object: violations, counts.")
@click.option("--since", default=None,
              help="How far back to judge (a duration, e.g. 24h; default audit.window).")
@click.option("--kafka", is_flag=True, help="Also read the topics over the window (bounded).")
@config_option
def audit(as_json: bool, since: str | None, kafka: bool, config_files: tuple[Path, ...]
          ) -> None:
    """Judge every invariant from live data, read-only: one line per violation; exit 0
    clean, 2 on a violation, 1 when some part could not be judged."""
    from supervision.app.audit import run_audit
    from supervision.durations import parse_duration

    cfg = load_or_exit(config_files)
    try:
        window = cfg.audit.window if since is None else parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    report = run_audit(cfg, window, kafka)
    if as_json:
        click.echo(json.dumps(report.as_json()))
    else:
        for violation in report.violations:
            click.echo(printable(str(violation)))
        for problem in report.unjudged:
            click.echo(f"could not judge: {printable(problem)}", err=True)
        click.echo("ok" if report.exit_code == 0 else
                   f"{len(report.violations)} violation(s)", err=report.exit_code != 0)
    sys.exit(report.exit_code)


@main.command()
@job_option("The job to plan.")
@click.option("--limit", default=100, show_default=True, help="Rows to show at most.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@config_option
def plan(job: Job, limit: int, as_json: bool, config_files: tuple[Path, ...]) -> None:
    """Dry run: what the next cycle of JOB would do per row, and why. Changes nothing."""
    cfg = load_or_exit(config_files)
    import psycopg  # after the configuration, as for run
    import trio

    from supervision.app.plan import plan as make_plan
    from supervision.logs import configure_logging

    # what the replayed cycle logs (evidence_list_refused, ...) goes to stderr: stdout is
    # the plan (--json: one object per line, nothing else)
    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    try:
        items = trio.run(make_plan, cfg, job, limit)
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    if as_json:
        for item in items:
            click.echo(json.dumps({"id": item.id, "phase": item.phase,
                                   "decision": item.decision, "why": item.why}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"next {job} cycle (dry run, nothing changed)")
    for column in ("id", "phase", "decision", "why"):
        table.add_column(column)
    for item in items:
        table.add_row(cell(item.id), cell(item.phase), cell(item.decision), cell(item.why))
    Console().print(table)
    click.echo(f"{len(items)} item(s)")
