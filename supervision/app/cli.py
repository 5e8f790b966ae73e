"""The ``safetynet`` command line (SPEC §7).

Exit codes: 0 success; 1 infrastructure failure or a child beyond its restart intensity;
2 usage errors, a violated SLO (``status``) or an unknown id (``requeue``); 78 bad
configuration. No verb ends in a traceback: expected failures print one clear line each.
What comes from data (ids, ``last_error``, a plan's reasons) is printed through
:mod:`supervision.terminal`: no control sequence or rich markup of theirs takes effect.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import click
import tomli_w

from supervision.app.settings import load_config
from supervision.app.verbs import fail, load_or_exit, operator_connection
from supervision.config import EXIT_CONFIG, config_paths, redacted
from supervision.errors import ConfigError, SafetynetError, describe
from supervision.jobs import Job
from supervision.secrets import secrets_in
from supervision.terminal import cell, printable

JOBS = tuple(job.value for job in Job)  # click matches an Enum by name: offer the values
EXIT_SLO = 2  # status: an SLO is violated; requeue: an unknown id

_F = TypeVar("_F", bound=Callable[..., Any])


def _job_option(help_text: str) -> Callable[[_F], _F]:
    """``--job``: one of :class:`~supervision.jobs.Job`'s names, passed on as the member."""
    return click.option("--job", required=True, type=click.Choice(JOBS), help=help_text,
                        callback=lambda _ctx, _param, value: Job(value))


def _config_option(func: _F) -> _F:
    return click.option(
        "-c", "--config", "config_files", multiple=True, type=click.Path(path_type=Path),
        help="TOML config file; repeat to layer files (later wins). "
        "Default: $SAFETYNET_CONFIG.",
    )(func)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="safetynet")
def main() -> None:
    """safetynet: drives stuck messenger recordings and conferences to a terminal state."""


@main.command("check-config")
@_config_option
def check_config(config_files: tuple[Path, ...]) -> None:
    """Validate the configuration and print the effective values, secrets redacted."""
    cfg = load_or_exit(config_files)
    click.echo(tomli_w.dumps(redacted(cfg)), nl=False)


@main.command()
@_config_option
@click.option("--print-sql", is_flag=True,
              help="Print what would run against this database now, and run nothing.")
@click.option("--safetynet-only", is_flag=True,
              help="Only the safetynet schema: no index or trigger on a messenger table.")
@click.option("--messenger-fixture", is_flag=True,
              help="Demo/test databases only: first create the messenger's tables from the "
              "fixture the project ships (refused when any exists).")
@click.option("--grant-to", metavar="ROLE",
              help="Then grant the existing ROLE exactly what the runtime needs.")
def migrate(config_files: tuple[Path, ...], print_sql: bool, safetynet_only: bool,
            messenger_fixture: bool, grant_to: str | None) -> None:
    """Create or update the safetynet schema and its indexes on the messenger's tables
    (online: CONCURRENTLY, short lock_timeout, retried); never a messenger table."""
    cfg = load_or_exit(config_files)
    from supervision import migrate as m
    from supervision.logs import configure_logging  # structlog: only the verbs that log
    from supervision.pgconn import conninfo

    # stderr: a lock_timeout retry (stamina's retry_scheduled) is logged, stdout stays the
    # list of steps (or the --print-sql script)
    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    dsn = conninfo(cfg.postgres, m.APPLICATION_NAME)
    options = m.Options(safetynet_only=safetynet_only,
                        notify_trigger=cfg.outbox_relay.wakeup == "notify")
    try:
        if print_sql:
            click.echo(m.print_sql(dsn, options), nl=False)
            return
        if messenger_fixture:
            m.apply_messenger_fixture(dsn)
            click.echo("created the messenger fixture's tables")
        applied = m.migrate(dsn, options)
        granted = m.grant(dsn, grant_to) if grant_to else []
    except SafetynetError as exc:
        fail(str(exc), cfg=cfg)
    for step in applied:
        click.echo(f"applied {step.label}")
    if not applied:
        click.echo("schema is up to date")
    for statement in granted:
        click.echo(statement)


@main.command("check-schema")
@_config_option
def check_schema(config_files: tuple[Path, ...]) -> None:
    """Compare the messenger's tables with the contract safetynet relies on: one line per
    problem with the DDL that fixes it; exit 0 compatible, 2 not (warnings alone: 0)."""
    from supervision import migrate as m
    from supervision.pgconn import conninfo

    cfg = load_or_exit(config_files)
    try:
        report = m.schema_report(conninfo(cfg.postgres, m.APPLICATION_NAME))
    except SafetynetError as exc:
        fail(str(exc), cfg=cfg)
    for line in report.lines():
        click.echo(printable(line))
    if report.blocking:
        sys.exit(EXIT_SLO)
    click.echo("schema is compatible" + (" (with warnings)" if report.lines() else ""))


@main.command()
@_config_option
def run(config_files: tuple[Path, ...]) -> None:
    """Run the daemon: the whole supervised tree until SIGTERM/SIGINT; SIGHUP re-reads the
    configuration files."""
    cfg = load_or_exit(config_files)
    # the daemon's modules load once the configuration is known good: an invalid file
    # exits 78 without paying their import (a deploy hook's, a crash loop's)
    import trio

    from supervision.app.daemon import run_daemon
    from supervision.logs import configure_logging

    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    paths = config_paths(config_files, os.environ)
    # what is imported and loaded by now lives as long as the process: out of the
    # collector's sight, a full collection no longer walks it (~60 ms with the GIL held,
    # a stall of every actor and of the relay's commit-to-ack latency)
    gc.freeze()
    problems: list[str] = []
    code = EXIT_CONFIG
    try:
        code = trio.run(run_daemon, cfg, partial(load_config, paths, dict(os.environ)))
    except* ConfigError as group:  # a file the config names (a CA bundle) cannot be loaded
        problems = _problems(group)
    _exit_if_misconfigured(problems)
    sys.exit(code)


@main.command("run-once")
@_job_option("The job to run once.")
@_config_option
def run_once(job: Job, config_files: tuple[Path, ...]) -> None:
    """Run one full cycle of JOB, print its counts as one JSON line, exit."""
    cfg = load_or_exit(config_files)
    import psycopg  # after the configuration, as for run
    import trio

    from supervision.app.daemon import run_once as run_one_cycle
    from supervision.logs import configure_logging

    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    failure: str | None = None
    counts: dict[str, object] = {}
    problems: list[str] = []
    try:
        counts = trio.run(run_one_cycle, cfg, job)
    except* ConfigError as group:
        problems = _problems(group)
    except* (SafetynetError, psycopg.Error, OSError, RuntimeError) as group:
        failure = _first_error(group)
    _exit_if_misconfigured(problems)
    if failure is not None:
        fail(failure, cfg=cfg)
    click.echo(json.dumps(counts, sort_keys=False))


def _problems(group: BaseExceptionGroup[ConfigError]) -> list[str]:
    return [p for exc in _leaves(group) if isinstance(exc, ConfigError) for p in exc.problems]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _exit_if_misconfigured(problems: list[str]) -> None:
    """Exit 78 with one line per problem, as for an invalid config file."""
    if problems:
        for problem in problems:
            click.echo(f"config error: {problem}", err=True)
        sys.exit(EXIT_CONFIG)


def _first_error(group: BaseExceptionGroup[BaseException]) -> str:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_config_option
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
        _print_status(current)
    sys.exit(EXIT_SLO if current.violated else 0)


def _print_status(current: Any) -> None:
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
@_config_option
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


def _actor_options(func: _F) -> _F:
    """``--reason`` and ``--actor``: recorded in the operator trail (``safetynet history``)."""
    func = click.option("--actor", default=None,
                        help="Who acts, for the trail (default: the OS user).")(func)
    return click.option("--reason", default=None,
                        help="Why: recorded in the trail (and shown by status).")(func)


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--all-quarantined", is_flag=True, help="Re-enqueue every quarantined row.")
@click.option("--all-poisoned", is_flag=True,
              help="Release every poison conference (the next reaper cycle retries it).")
@_actor_options
@_config_option
def requeue(ids: tuple[str, ...], all_quarantined: bool, all_poisoned: bool,
            reason: str | None, actor: str | None, config_files: tuple[Path, ...]) -> None:
    """Runbook re-enqueue of finalize rows (by row id or recording id): Pending,
    attempts 0, due now; a poison conference id (see status) is released: the next reaper
    cycle claims it. Unknown ids: exit 2 and nothing changes."""
    if bool(ids) == (all_quarantined or all_poisoned):
        raise click.UsageError("give finalize/conference ids or --all-quarantined/"
                               "--all-poisoned (not both)")
    _requeue(ids, all_quarantined, all_poisoned, reason, actor, config_files, "requeue")


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--all-poisoned", is_flag=True, help="Release every poison conference.")
@_actor_options
@_config_option
def release(ids: tuple[str, ...], all_poisoned: bool, reason: str | None,
            actor: str | None, config_files: tuple[Path, ...]) -> None:
    """Release poison conferences (by id, see status): the next reaper cycle claims them
    again. Unknown ids: exit 2 and nothing changes."""
    if bool(ids) == all_poisoned:
        raise click.UsageError("give conference ids or --all-poisoned (not both)")
    _requeue(ids, False, all_poisoned, reason, actor, config_files, "release")


def _requeue(ids: tuple[str, ...], all_quarantined: bool, all_poisoned: bool,
             reason: str | None, actor: str | None, config_files: tuple[Path, ...],
             verb: str) -> None:
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.runbook import Released, UnknownIds
    from supervision.app.trail import Actor, Verb

    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            done = actions.requeue(conn, Actor.from_os(actor), list(ids), reason,
                                   all_quarantined=all_quarantined,
                                   all_poisoned=all_poisoned, verb=Verb(verb))
    except UnknownIds as exc:
        fail(f"unknown id(s), nothing changed: {printable(exc)}", EXIT_SLO)
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    for row in done.changed:
        if isinstance(row, Released):
            click.echo(printable(
                f"released poison conference {row.conference_id} ({row.phase}, "
                f"{row.failures} failure(s)): claimed again next cycle"))
            continue
        click.echo(printable(
            f"requeued {row.attempt_id} (recording {row.recording_id}): "
            f"{row.previous_status}, attempts {row.previous_attempts} -> Pending, 0"
            + (f"; last_error was {row.last_error}" if row.last_error else "")))
    click.echo(f"{len(done.changed)} row(s) {'released' if verb == 'release' else 'requeued'}"
               f" (trail #{done.trail_id})")


@main.command("dead-letters")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: total, newest.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(0, 10_000),
              help="Dead letters to show at most (newest first).")
@click.option("--purge", is_flag=True,
              help="Delete the dead letters older than --older-than with their outbox rows "
                   "(not those still blocking later rows of their key); needs --reason.")
@click.option("--older-than", default=None,
              help="With --purge: a duration (default outbox_relay.dead_letter_retention).")
@click.option("--keys", is_flag=True,
              help="The keys held back instead (behind a dead letter or a row in retry): "
                   "how many events wait, since when, and what releases each.")
@_actor_options
@_config_option
def dead_letters(as_json: bool, limit: int, purge: bool, older_than: str | None,
                 keys: bool, reason: str | None, actor: str | None,
                 config_files: tuple[Path, ...]) -> None:
    """The outbox's dead letters, newest first (whether each still blocks its key); with
    --purge, delete the old ones (recorded in the trail). `safetynet replay ID` puts one
    back on the relay's path."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.runbook import dead_letters as list_dead_letters
    from supervision.app.trail import Actor
    from supervision.durations import parse_duration

    if not purge and (older_than is not None or reason is not None or actor is not None):
        raise click.UsageError("--older-than, --reason and --actor go with --purge")
    if purge and not reason:
        raise click.UsageError("--purge needs --reason TEXT")
    if purge and keys:
        raise click.UsageError("--keys does not go with --purge")
    cfg = load_or_exit(config_files)
    if keys:
        from supervision.app.frozen_keys import frozen_keys, report

        try:
            with operator_connection(cfg) as conn:
                held = frozen_keys(conn, limit)
        except psycopg.Error as exc:
            fail(f"postgres: {describe(exc)}", cfg=cfg)
        for line in report(held, as_json):
            click.echo(printable(line))
        return
    try:
        age = (cfg.outbox_relay.dead_letter_retention if older_than is None
               else parse_duration(older_than))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    try:
        with operator_connection(cfg) as conn:
            done = (actions.purge_dead_letters(conn, Actor.from_os(actor), age, reason)
                    if purge else None)
            found = list_dead_letters(conn, limit)
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    if as_json:
        click.echo(json.dumps({**found.as_json(), "purged": done.purged if done else None},
                              default=str))
        return
    if done is not None:
        click.echo(printable(
            f"purged {done.purged} dead letter(s) older than {age:g}s with their outbox rows"
            f" (reason: {reason}; trail #{', #'.join(map(str, done.trail_ids))})"))
    for row in found.newest:
        click.echo(printable(
            f"{row['outbox_id']} {row['topic']}/{row['message_key']} at {row['created_at']}"
            f"{' BLOCKS its key' if row['blocking'] else ''}"
            f"{' (row gone)' if row['row_gone'] else ''}: {row['reason']}"))
    click.echo(f"{found.total} dead letter(s)")


@main.command()
@click.argument("ids", nargs=-1, required=True)
@_actor_options
@_config_option
def replay(ids: tuple[str, ...], reason: str | None, actor: str | None,
           config_files: tuple[Path, ...]) -> None:
    """Put dead-lettered outbox rows (by outbox id, see dead-letters) back on the relay's
    path: published again in id order, before the later rows of their key (a key it
    blocked is released). --reason is required. Unknown ids: exit 2 and nothing changes
    (the refusal is recorded)."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.runbook import UnknownIds
    from supervision.app.trail import Actor

    if not reason:
        raise click.UsageError("replay needs --reason TEXT")
    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            done = actions.replay(conn, Actor.from_os(actor), list(ids), reason)
    except UnknownIds as exc:
        fail(f"not dead letters, nothing changed: {printable(exc)}", EXIT_SLO)
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    for row in done.changed:
        click.echo(printable(
            f"replayed {row.outbox_id} (dead-lettered for {row.reason})"
            + (": its outbox row is gone, only the dead letter was removed" if row.row_gone
               else ": back on the relay's path")))
    click.echo(printable(f"{len(done.changed)} dead letter(s) replayed (reason: {reason};"
                         f" trail #{done.trail_id})"))


@main.command()
@_job_option("The job to pause.")
@click.option("--for", "for_", default=None,
              help="End the pause by itself after this long (a duration, e.g. 2h).")
@_actor_options
@_config_option
def pause(job: Job, for_: str | None, reason: str | None, actor: str | None,
          config_files: tuple[Path, ...]) -> None:
    """Pause JOB on every replica: from its next cycle start no replica takes its lease or
    runs it (a cycle already running finishes), until `safetynet resume` (or --for)."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.trail import Actor
    from supervision.durations import parse_duration

    try:
        seconds = None if for_ is None else parse_duration(for_)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            done, _ = actions.pause(conn, Actor.from_os(actor), job, reason, seconds)
    except psycopg.Error as exc:
        fail(f"postgres: {type(exc).__name__}")
    since = f"since {done.pause.paused_at} by {done.pause.paused_by}"
    why = f": {done.pause.reason}" if done.pause.reason else ""
    click.echo(printable(f"paused {job} ({since}){why}" if done.new
                         else f"{job} was already paused ({since}){why}"))


@main.command()
@_job_option("The job to resume.")
@_actor_options
@_config_option
def resume(job: Job, reason: str | None, actor: str | None,
           config_files: tuple[Path, ...]) -> None:
    """Resume a paused JOB: every replica runs it again from its next tick."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.trail import Actor

    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            ended, _ = actions.resume(conn, Actor.from_os(actor), job, reason)
    except psycopg.Error as exc:
        fail(f"postgres: {type(exc).__name__}")
    if ended is None:
        click.echo(f"{job} was not paused")
        return
    click.echo(printable(f"resumed {job} (paused since {ended.paused_at} by "
                         f"{ended.paused_by})"))


@main.command("accept-missing")
@click.option("--for", "for_", default="1h", show_default=True,
              help="How long (a duration, at most 24h).")
@click.option("--revoke", is_flag=True, help="End the acceptance now.")
@_actor_options
@_config_option
def accept_missing(for_: str, revoke: bool, reason: str | None, actor: str | None,
                   config_files: tuple[Path, ...]) -> None:
    """Accept Missing verdicts (Failed/Timeout) under s3.bucket/s3.key_prefix without
    evidence, for a while: when the incident is genuine and nothing shows it (runbook
    RecordingFinalizeVerdictsWithheld). Recorded in the operator trail."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.trail import Actor
    from supervision.durations import parse_duration

    if not revoke and not reason:
        raise click.UsageError("--reason is required (the incident, for the record)")
    cfg = load_or_exit(config_files)
    where = f"s3://{cfg.s3.bucket}/{cfg.s3.key_prefix}"
    who = Actor.from_os(actor)
    try:
        with operator_connection(cfg) as conn:
            if revoke:
                ended, trail_id = actions.revoke_acceptance(
                    conn, who, cfg.s3.bucket, cfg.s3.key_prefix, reason)
                click.echo(printable((f"revoked the acceptance for {where}" if ended
                                      else f"no acceptance in force for {where}")
                                     + f" (trail #{trail_id})"))
                return
            done, trail_id = actions.accept_missing(
                conn, who, cfg.s3.bucket, cfg.s3.key_prefix, parse_duration(for_),
                reason or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    except psycopg.Error as exc:
        fail(f"postgres: {type(exc).__name__}")
    click.echo(printable(f"Missing verdicts under {where} accepted until "
                         f"{done.accepted_until} by {done.accepted_by}: {done.reason} "
                         f"(trail #{trail_id})"))


@main.command()
@_job_option("The job to plan.")
@click.option("--limit", default=100, show_default=True, help="Rows to show at most.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@_config_option
def plan(job: Job, limit: int, as_json: bool, config_files: tuple[Path, ...]) -> None:
    """Dry run: what the next cycle of JOB would do per row, and why. Changes nothing."""
    cfg = load_or_exit(config_files)
    import psycopg  # after the configuration, as for run
    import trio

    from supervision.app.plan import plan as make_plan

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


def _register_console() -> None:
    from supervision.app.console.commands import console, history

    main.add_command(console)
    main.add_command(history)


_register_console()
