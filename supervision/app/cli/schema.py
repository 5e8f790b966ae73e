"""The schema's verbs: ``migrate`` (online, versioned), ``check-schema`` (the messenger's
tables against the contract) and ``uninstall`` (exactly what safetynet created, online)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import click

from supervision.app.cli.group import EXIT_SLO, config_option, main
from supervision.app.terminal import printable
from supervision.app.verbs import fail, load_or_exit
from supervision.errors import SafetynetError
from supervision.secrets import secrets_in

if TYPE_CHECKING:
    from supervision.app.settings import Config
    from supervision.db.migrate import SchemaReport


@main.command()
@config_option
@click.option("--print-sql", is_flag=True,
              help="Print what would run against this database now, and run nothing.")
@click.option("--safetynet-only", is_flag=True,
              help="Only the safetynet schema: no index or trigger on a messenger table.")
@click.option("--messenger-fixture", is_flag=True,
              help="Demo/test databases only: first create the messenger's tables from the "
              "fixture the project ships (refused when any exists).")
@click.option("--grant-to", metavar="ROLE",
              help="Then grant the existing ROLE exactly what the runtime needs (recorded: "
              "every later migrate grants it again).")
@click.option("--grant-read-to", metavar="ROLE",
              help="Then grant the existing ROLE SELECT only, on what the jobs read "
              "(recorded, as --grant-to).")
def migrate(config_files: tuple[Path, ...], print_sql: bool, safetynet_only: bool,
            messenger_fixture: bool, grant_to: str | None,
            grant_read_to: str | None) -> None:
    """Create or update the safetynet schema and its indexes on the messenger's tables
    (online: CONCURRENTLY, short lock_timeout, retried); never a messenger table."""
    cfg = load_or_exit(config_files)
    from supervision.db import migrate as m
    from supervision.db.pgconn import conninfo
    from supervision.logs import configure_logging  # structlog: only the verbs that log

    # stderr: a lock_timeout retry (stamina's retry_scheduled) is logged, stdout stays the
    # list of steps (or the --print-sql script)
    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    dsn = conninfo(cfg.postgres, m.APPLICATION_NAME)
    options = m.Options(safetynet_only=safetynet_only,
                        notify_trigger=cfg.outbox_relay.wakeup == "notify",
                        grant_to=grant_to, grant_read_to=grant_read_to)
    logical = cfg.outbox_relay.source == "logical" and not safetynet_only
    try:
        if print_sql:
            click.echo(m.print_sql(dsn, options), nl=False)
            if logical:
                click.echo(_logical_script(dsn, cfg), nl=False)
            return
        if messenger_fixture:
            m.apply_messenger_fixture(dsn)
            click.echo("created the messenger fixture's tables")
        applied = [step.label for step in m.migrate(dsn, options)]
        if logical:
            applied += _migrate_logical(dsn, cfg)
    except SafetynetError as exc:
        fail(str(exc), cfg=cfg)
    for label in applied:
        click.echo(f"applied {label}")
    if not applied:
        click.echo("schema is up to date")


def _logical_script(dsn: str, cfg: Config) -> str:
    from actors.outbox.logical import source_of
    from actors.outbox.logical_check import logical_script

    return logical_script(dsn, source_of(cfg.outbox_relay))


def _migrate_logical(dsn: str, cfg: Config) -> list[str]:
    """The logical source's publication and slot, last; refused: the statements a DBA
    must run on stdout, and exit 1 naming what is missing."""
    from actors.outbox.logical import source_of
    from actors.outbox.logical_check import migrate_logical
    from actors.outbox.logical_setup import LogicalSetupRefused

    try:
        return migrate_logical(dsn, source_of(cfg.outbox_relay))
    except LogicalSetupRefused as exc:
        for statement in exc.statements:
            click.echo(statement)
        fail(f"the outbox relay's logical source (publication {cfg.outbox_relay.publication},"
             f" slot {cfg.outbox_relay.slot}) is not set up: {exc.reason}; a DBA must run "
             "the statements above (safetynet migrate --print-sql prints them too)", cfg=cfg)


@main.command("check-schema")
@config_option
def check_schema(config_files: tuple[Path, ...]) -> None:
    """Compare the messenger's tables with the contract safetynet relies on: one line per
    problem with the DDL that fixes it; exit 0 compatible, 2 not (warnings alone: 0)."""
    from supervision.db import migrate as m
    from supervision.db.pgconn import conninfo

    cfg = load_or_exit(config_files)
    dsn = conninfo(cfg.postgres, m.APPLICATION_NAME)
    try:
        report = m.schema_report(dsn)
        if cfg.outbox_relay.source == "logical":
            report = _with_logical(report, dsn, cfg)
    except SafetynetError as exc:
        fail(str(exc), cfg=cfg)
    for line in report.lines():
        click.echo(printable(line))
    if report.blocking:
        sys.exit(EXIT_SLO)
    warned = " (with warnings)" if report.problems else ""
    if not report.versions.installed:
        click.echo("the messenger's tables are compatible" + warned)
        return
    click.echo("schema is compatible" + (" (with warnings)" if report.lines() else ""))


def _with_logical(report: SchemaReport, dsn: str, cfg: Config) -> SchemaReport:
    """*report* with the logical source's findings (wal_level, publication, slot)."""
    from actors.outbox.logical import source_of
    from actors.outbox.logical_check import logical_report

    found = logical_report(dsn, source_of(cfg.outbox_relay))
    return attrs.evolve(report, problems=[*report.problems, *found])


@main.command()
@config_option
@click.option("--print-sql", is_flag=True,
              help="Print what would run against this database now, and run nothing.")
@click.option("--yes", is_flag=True, help="Really remove safetynet (stop every replica first).")
def uninstall(config_files: tuple[Path, ...], print_sql: bool, yes: bool) -> None:
    """Remove exactly what safetynet created (recorded when it created it): its indexes on
    the messenger's tables (CONCURRENTLY), the NOTIFY trigger, its grants there, then the
    safetynet schema; online (short lock_timeout, retried). Never a messenger object."""
    from supervision.db import uninstall as u
    from supervision.db.migrate import APPLICATION_NAME
    from supervision.db.pgconn import conninfo
    from supervision.logs import configure_logging

    cfg = load_or_exit(config_files)
    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    dsn = conninfo(cfg.postgres, APPLICATION_NAME)
    if not print_sql and not yes:
        raise click.UsageError("uninstall removes safetynet's schema and data: add --yes "
                               "(or --print-sql to review the plan)")
    try:
        if print_sql:
            click.echo(u.planned(dsn).script(), nl=False)
            return
        done = u.uninstall(dsn)
    except SafetynetError as exc:
        fail(str(exc), cfg=cfg)
    for step in done:
        click.echo(f"applied {step.label}")
    if not done:
        click.echo("safetynet is not installed")
