"""``requeue``, ``replay`` and ``release`` by a filter (issue #38 item 3): the options they
share and the run that previews, then acts page by page.

``safetynet requeue --incident INC-42 --since 2h --error http_503 --preview`` prints how many
rows the filter matches and a sample, and changes nothing; without ``--preview`` (and with
``--reason``) the ids matched at that moment are frozen, printed the same way, and acted on
a page of :data:`~supervision.app.incidents.PAGE_SIZE` at a time, each page one transaction
and one trail row naming the incident and the filter, each id re-checked under lock (a row
that moved on meanwhile is skipped and named; one that matches only later is not touched).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from supervision.app.terminal import printable
from supervision.app.verbs import fail, load_or_exit, operator_connection
from supervision.errors import describe

F = TypeVar("F", bound=Callable[..., Any])
PAGE_PAUSE_S = 0.2  # between two pages: the messenger's database is not hammered
_ALL = ("incident", "preview", "since", "until", "status", "error", "topic", "key_prefix")


def filter_options(verb: str) -> Callable[[F], F]:
    """The filter's options for *verb*, gathered into the command's ``by_filter`` dict."""
    def wrap(func: F) -> F:
        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            given = {k: kwargs.pop(k, None) for k in _ALL}
            return func(**kwargs, by_filter=given)

        options = [
            click.option("--incident", default=None, help="Act by a filter for this incident "
                         "(its name, recorded with every page) instead of by ids."),
            click.option("--preview", is_flag=True, help="With --incident: print how many "
                         "rows would change and a sample; change nothing."),
            click.option("--since", default=None, help="Filter: from then (a duration back, "
                         "2h, or an ISO date/time)."),
            click.option("--until", default=None, help="Filter: before then (likewise)."),
            click.option("--error", default=None, help="Filter: the error contains this "
                         "(case-insensitive; * matches anything)."),
        ]
        if verb == "requeue":
            options.append(click.option(
                "--status", default=None,
                help="Filter: Quarantined (the default; since: when quarantined) or "
                     "Pending (since: when due)."))
        if verb == "replay":
            options += [click.option("--topic", default=None, help="Filter: this topic."),
                        click.option("--key-prefix", "key_prefix", default=None,
                                     help="Filter: message keys starting with this.")]
        out: Any = command
        for option in reversed(options):
            out = option(out)
        return out  # type: ignore[no-any-return]

    return wrap


def wanted(given: dict[str, Any]) -> bool:
    """Whether the command was asked to act by a filter."""
    return any(v not in (None, False) for v in given.values())


def run_by_filter(verb: str, given: dict[str, Any], reason: str | None, actor: str | None,
                  config_files: tuple[Path, ...]) -> None:
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app import incidents
    from supervision.app.trail import Actor

    given = dict(given)
    only_preview, name = given.pop("preview"), given.pop("incident")
    if verb == "requeue" and given.get("status") is None:
        given["status"] = "Quarantined"  # the documented default of --status
    if not name:
        raise click.UsageError("--preview, --since, --until, --error, --topic and "
                               "--key-prefix go with --incident NAME")
    try:
        f = incidents.parse_filter(verb, given)
        incident = incidents.parse_incident(name)
    except incidents.BadFilter as exc:
        raise click.BadParameter(str(exc).partition(": ")[2], param_hint="--" + (
            exc.field.replace("_", "-"))) from None
    if not only_preview and not reason:
        raise click.UsageError("acting on an incident needs --reason TEXT (or --preview)")
    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            seen = incidents.preview(conn, f)
            _print_preview(seen, incident)
            if not only_preview and seen.count:
                _act(conn, Actor.from_os(actor), seen, incident, reason or "")
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)


def _print_preview(seen: Any, incident: str) -> None:
    from supervision.app import incidents

    f = seen.filter
    click.echo(printable(f"{f.verb} for {incident} ({f.describe() or 'no filter'}): "
                         f"{seen.count} row(s) would change"
                         + (f" (more match: the first {incidents.SNAPSHOT_MAX} are taken)"
                            if seen.capped else "")))
    if seen.window_cut:
        click.echo(f"the time range holds more than {incidents.EXAMINE_MAX} rows: only "
                   "its first ones were examined; narrow it", err=True)
    for row in seen.sample:
        click.echo(printable(f"  {row['id']} {row['subject']} {row['at']} "
                             f"{row['error'] or ''}"))
    if seen.count > len(seen.sample):
        click.echo(f"  … and {seen.count - len(seen.sample)} more")


def _act(conn: Any, who: Any, seen: Any, incident: str, reason: str) -> None:
    from supervision.app import incidents

    pages = seen.pages()
    changed = 0
    for number, ids in enumerate(pages, 1):
        if number > 1:
            time.sleep(PAGE_PAUSE_S)
        done = incidents.act_page(conn, who, seen.filter, ids, incident, reason,
                                  page=number, pages=len(pages), total=seen.count)
        changed += len(done.changed)
        click.echo(printable(
            f"page {number} of {len(pages)}: {len(done.changed)} changed (trail "
            f"#{done.trail_id})" + (f"; skipped, no longer as previewed: "
                                    f"{' '.join(done.skipped)}" if done.skipped else "")))
    click.echo(f"{changed} of {seen.count} row(s) changed")


def preview_acceptance(for_: str, config_files: tuple[Path, ...]) -> None:
    """``accept-missing --preview``: the location and the time it would cover, and the
    acceptance in force now (which it would replace); nothing written. An acceptance is
    not row-scoped: the rows it lets through are the withheld ones under the location
    (``safetynet plan --job recording-finalize`` lists them)."""
    import datetime as dt

    import psycopg

    from actors.finalize.queries import FINALIZE_QUERIES
    from supervision.app.acceptances import MAX_ACCEPT
    from supervision.durations import parse_duration

    try:
        seconds = parse_duration(for_)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    if not 0 < seconds <= MAX_ACCEPT:
        raise click.BadParameter(f"must be > 0 and <= {MAX_ACCEPT / 3600:g}h",
                                 param_hint="--for")
    cfg = load_or_exit(config_files)
    where = f"s3://{cfg.s3.bucket}/{cfg.s3.key_prefix}"
    try:
        with operator_connection(cfg) as conn:
            now = conn.execute(FINALIZE_QUERIES["missing_verdict_acceptances_active"], {
                "bucket": cfg.s3.bucket, "key_prefix": cfg.s3.key_prefix}).fetchone()
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    click.echo(printable(f"would accept Missing verdicts under {where} until about "
                         f"{until.isoformat(timespec='seconds')}"))
    click.echo(printable("replacing the acceptance in force until "
                         f"{now[0].isoformat(timespec='seconds')} by {now[1]}: {now[2]}"
                         if now else "no acceptance in force now"))
    click.echo("nothing changed (the withheld rows it would let through: "
               "safetynet plan --job recording-finalize)")
