"""The runbook's acting verbs, each recorded in the operator trail: ``requeue``,
``release``, ``dead-letters`` (``--purge``), ``replay``, ``pause``, ``resume`` and
``accept-missing``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from supervision.app.cli.group import EXIT_SLO, actor_options, config_option, job_option, main
from supervision.app.cli.incident import (
    filter_options,
    preview_acceptance,
    run_by_filter,
    wanted,
)
from supervision.app.terminal import printable
from supervision.app.verbs import fail, load_or_exit, operator_connection
from supervision.errors import describe
from supervision.jobs import Job


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--all-quarantined", is_flag=True, help="Re-enqueue every quarantined row.")
@click.option("--all-poisoned", is_flag=True,
              help="Release every poison conference (the next reaper cycle retries it).")
@filter_options("requeue")
@actor_options
@config_option
def requeue(ids: tuple[str, ...], all_quarantined: bool, all_poisoned: bool,
            reason: str | None, actor: str | None, config_files: tuple[Path, ...],
            by_filter: dict[str, Any]) -> None:
    """Runbook re-enqueue of finalize rows (by row id or recording id): Pending,
    attempts 0, due now; a poison conference id (see status) is released: the next reaper
    cycle claims it. Unknown ids: exit 2 and nothing changes. With --incident, the rows a
    filter matches instead (--preview first: the count and a sample)."""
    if wanted(by_filter):
        if ids or all_quarantined or all_poisoned:
            raise click.UsageError("give ids, --all-* or --incident with a filter (one)")
        run_by_filter("requeue", by_filter, reason, actor, config_files)
        return
    if bool(ids) == (all_quarantined or all_poisoned):
        raise click.UsageError("give finalize/conference ids or --all-quarantined/"
                               "--all-poisoned (not both)")
    _requeue(ids, all_quarantined, all_poisoned, reason, actor, config_files, "requeue")


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--all-poisoned", is_flag=True, help="Release every poison conference.")
@filter_options("release")
@actor_options
@config_option
def release(ids: tuple[str, ...], all_poisoned: bool, reason: str | None,
            actor: str | None, config_files: tuple[Path, ...],
            by_filter: dict[str, Any]) -> None:
    """Release poison conferences (by id, see status): the next reaper cycle claims them
    again. Unknown ids: exit 2 and nothing changes. With --incident, the poison
    conferences a filter matches instead (--preview first)."""
    if wanted(by_filter):
        if ids or all_poisoned:
            raise click.UsageError("give ids, --all-poisoned or --incident with a filter")
        run_by_filter("release", by_filter, reason, actor, config_files)
        return
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
@actor_options
@config_option
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
@click.argument("ids", nargs=-1)
@filter_options("replay")
@actor_options
@config_option
def replay(ids: tuple[str, ...], reason: str | None, actor: str | None,
           config_files: tuple[Path, ...], by_filter: dict[str, Any]) -> None:
    """Put dead-lettered outbox rows (by outbox id, see dead-letters) back on the relay's
    path: published again in id order, before the later rows of their key (a key it
    blocked is released). --reason is required. Unknown ids: exit 2 and nothing changes
    (the refusal is recorded). With --incident, the dead letters a filter matches instead
    (--preview first)."""
    if wanted(by_filter):
        if ids:
            raise click.UsageError("give outbox ids or --incident with a filter (not both)")
        run_by_filter("replay", by_filter, reason, actor, config_files)
        return
    if not ids:
        raise click.UsageError("give outbox ids (see dead-letters) or --incident NAME")
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
@job_option("The job to pause.")
@click.option("--for", "for_", default=None,
              help="End the pause by itself after this long (a duration, e.g. 2h).")
@actor_options
@config_option
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
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    since = f"since {done.pause.paused_at} by {done.pause.paused_by}"
    why = f": {done.pause.reason}" if done.pause.reason else ""
    click.echo(printable(f"paused {job} ({since}){why}" if done.new
                         else f"{job} was already paused ({since}){why}"))


@main.command()
@job_option("The job to resume.")
@actor_options
@config_option
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
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    if ended is None:
        click.echo(f"{job} was not paused")
        return
    click.echo(printable(f"resumed {job} (paused since {ended.paused_at} by "
                         f"{ended.paused_by})"))


@main.command("accept-missing")
@click.option("--for", "for_", default="1h", show_default=True,
              help="How long (a duration, at most 24h).")
@click.option("--revoke", is_flag=True, help="End the acceptance now.")
@click.option("--preview", is_flag=True, help="Print what would be accepted, until when, "
              "and the acceptance it would replace; change nothing.")
@actor_options
@config_option
def accept_missing(for_: str, revoke: bool, preview: bool, reason: str | None,
                   actor: str | None, config_files: tuple[Path, ...]) -> None:
    """Accept Missing verdicts (Failed/Timeout) under s3.bucket/s3.key_prefix without
    evidence, for a while: when the incident is genuine and nothing shows it (runbook
    RecordingFinalizeVerdictsWithheld). Recorded in the operator trail."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import actions
    from supervision.app.trail import Actor
    from supervision.durations import parse_duration

    if preview:
        if revoke:
            raise click.UsageError("--preview does not go with --revoke")
        preview_acceptance(for_, config_files)
        return
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
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    click.echo(printable(f"Missing verdicts under {where} accepted until "
                         f"{done.accepted_until} by {done.accepted_by}: {done.reason} "
                         f"(trail #{trail_id})"))
