"""``safetynet dev``: a realistic incident on the embedded stack, healed live.

Starts PostgreSQL, Tansu and SeaweedFS on free loopback ports, migrates, and seeds:
``--recordings N`` lost callbacks (70% with the binary uploaded with its metadata, 20%
without, 10% Available but never published) and ``--conferences M`` orphaned conferences
(a third per reaper phase, with participants). Unless ``--no-outage``, object storage is
unreachable for the first seconds (a proxy refuses connections), so the outage breaker and
recovery are visible. Then the daemon runs in-process with short intervals while a live
table shows each job's progress, and the operator console (``safetynet console``, actions
allowed, a fresh password printed with its address) serves beside it; Ctrl-C (or, with
``--exit-when-done``, the end of the work) stops it, prints a summary and stops every
server.

The demo's settings (``supervision/dev/demo.toml``) ship inside the package, so the demo
behaves the same from any directory and from an installed wheel. With
``--exit-when-done`` the run has a deadline (``--deadline``, after seeding): it exits 0
only when every figure equals the seeded truth, and 1 with the summary and the
mismatches otherwise.
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
from functools import partial
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

import attrs
import click
import psycopg
import tomli_w
import trio
from prometheus_client import REGISTRY
from psycopg import sql
from psycopg.rows import dict_row
from rich.console import Console
from rich.live import Live
from rich.table import Table

from supervision.app.console.commands import serve_console
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config, load_config
from supervision.db.migrate import install_demo, migrate
from supervision.dev.ports import free_ports
from supervision.dev.proxy import OutageProxy
from supervision.dev.stack import DevStack, open_dev_stack
from supervision.dev.uploads import Upload, object_headers
from supervision.jobs import Job
from supervision.logs import configure_logging
from supervision.secrets import redact_dsn

DATABASE = "messenger"
BUCKET = "call-recordings"
OUTAGE_SECONDS = 6.0
CONSOLE_USER = "dev"

COUNTERS = {
    "reconciled": "messenger_recording_finalize_reconciled_total",
    "failed": "messenger_recording_finalize_failed_total",
    "republished": "messenger_recording_finalize_republished_total",
    "quarantined": "messenger_recording_finalize_quarantined_total",
    "transient": "safetynet_recording_finalize_transient_total",
    "published": "safetynet_outbox_published_total",
}
REAPED = ("empty_timeout", "provision_failed", "stale_timeout")


@attrs.frozen
class Scenario:
    recordings: int = 2000
    conferences: int = 300
    outage: bool = True
    exit_when_done: bool = False
    deadline: float = 300.0  # seconds after seeding, with exit_when_done


def _counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def snapshot() -> dict[str, float]:
    """The demo's figures, read from the daemon's own metrics (same process)."""
    values = {key: _counter(name) for key, name in COUNTERS.items()}
    for outcome in REAPED:
        values[outcome] = _counter("messenger_conf_reaper_items_total", outcome=outcome)
    values["restarts"] = sum(
        s.value for m in REGISTRY.collect() if m.name == "safetynet_actor_restarts"
        for s in m.samples if s.name.endswith("_total"))
    return values


def prepare(stack: DevStack) -> None:
    """Create the database (with the messenger fixture's tables) and the bucket, then
    migrate."""
    assert stack.postgres is not None and stack.s3 is not None
    with psycopg.connect(stack.postgres.dsn, autocommit=True) as conn:
        created = not conn.execute(ALL_QUERIES["database_exists"], {"name": DATABASE}).fetchone()
        if created:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    dsn = stack.postgres.dsn_for(DATABASE)
    if created:
        install_demo(dsn)
    else:
        migrate(dsn)
    stack.s3.create_bucket(BUCKET)


async def seed(stack: DevStack, scenario: Scenario) -> dict[str, int]:
    """Write the incident; returns what the daemon should end up doing."""
    assert stack.postgres is not None and stack.s3 is not None
    available = scenario.recordings // 10
    with_binary = round(scenario.recordings * 0.7)

    def write() -> list[dict[str, Any]]:
        assert stack.postgres is not None
        with psycopg.connect(stack.postgres.dsn_for(DATABASE), autocommit=True) as conn, \
                conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(ALL_QUERIES["dev_seed_recordings"], {
                "n": scenario.recordings, "available": available}).fetchall()
            if scenario.conferences:
                cur.execute(ALL_QUERIES["dev_seed_conferences"], {"n": scenario.conferences})
            return rows

    started = trio.current_time()
    rows = await trio.to_thread.run_sync(write)
    # Available recordings have their binary too: the positive canary HEADs them
    to_upload = ([str(r["id"]) for r in rows if r["status"] != "Available"][:with_binary]
                 + [str(r["id"]) for r in rows if r["status"] == "Available"])
    body = b"\x1aE\xdf\xa3" * 1024  # a WebM-looking 4 KiB blob
    headers = object_headers("video/webm", {"duration-seconds": "60"})
    uploads = [Upload(f"call-recordings/{rid}", body, headers) for rid in to_upload]
    await trio.to_thread.run_sync(partial(stack.s3.put_objects, BUCKET, uploads))
    click.echo(f"seeded in {trio.current_time() - started:.1f}s "
               f"({len(to_upload)} binaries uploaded)")
    thirds = [len(range(k, scenario.conferences + 1, 3)) for k in (3, 1, 2)]
    truth = {"reconciled": with_binary,
             "failed": scenario.recordings - available - with_binary,
             "republished": available, "quarantined": 0, "empty_timeout": thirds[0],
             "provision_failed": thirds[1], "stale_timeout": thirds[2]}
    # every Available recording and every Ended conference publishes one event
    truth["published"] = (truth["reconciled"] + truth["republished"]
                          + truth["empty_timeout"] + truth["stale_timeout"])
    return truth


def write_layer(stack: DevStack, base_dir: Path, s3_url: str, console_password: str = ""
                ) -> Path:
    """The stack's addresses as a config layer over the demo settings (and, with
    *console_password*, the console's login: user ``dev``, actions allowed)."""
    from supervision.passwords import MIN_N, hash_password

    endpoints = stack.endpoints()
    assert stack.postgres is not None
    http_port, console_port = free_ports(2)
    layer: dict[str, Any] = {
        "http": {"listen": f"127.0.0.1:{http_port}"},
        "postgres": {"dsn": stack.postgres.dsn_for(DATABASE)},
        "kafka": {"bootstrap_servers": endpoints.kafka_bootstrap},
        "s3": {"endpoint_url": s3_url, "region": endpoints.s3.region, "bucket": BUCKET,
               "access_key_id": endpoints.s3.access_key_id,
               "secret_access_key": endpoints.s3.secret_access_key, "timeout": "2s"},
    }
    if console_password:
        layer["console"] = {"listen": f"127.0.0.1:{console_port}", "allow_actions": True,
                            "user": CONSOLE_USER, "refresh": 2,
                            # the cheapest cost accepted: a random password on loopback,
                            # gone with the demo
                            "password_hash": hash_password(console_password, n=MIN_N)}
    path = base_dir / "safetynet-dev.toml"
    path.write_text(tomli_w.dumps(layer), encoding="utf-8")
    path.chmod(0o600)  # it holds the demo's credentials
    return path


def load_dev_config(layer: Path) -> Config:
    """The demo settings shipped with the package, then *layer* (the stack's addresses)."""
    with as_file(files("supervision.dev") / "demo.toml") as demo:
        return load_config([demo, layer], env={})


def mismatches(summary: dict[str, int], truth: dict[str, int]) -> list[str]:
    """Each seeded figure the run did not reach, as ``key: seen X, seeded Y``."""
    return [f"{key}: seen {summary.get(key, 0)}, seeded {want}"
            for key, want in sorted(truth.items()) if summary.get(key, 0) != want]


def progress(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn, \
            conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(ALL_QUERIES["dev_progress"]).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


def view(base: dict[str, float], remaining: dict[str, int], note: str) -> Table:
    now = snapshot()
    delta = {k: int(now[k] - base.get(k, 0.0)) for k in now}
    table = Table(title=f"safetynet dev — {note}")
    table.add_column("job")
    table.add_column("progress")
    table.add_row(Job.RECORDING_FINALIZE,
                  f"backlog {remaining.get('finalize_pending', '?')}  reconciled "
                  f"{delta['reconciled']}  failed {delta['failed']}  republished "
                  f"{delta['republished']}  quarantined {delta['quarantined']}  transient "
                  f"{delta['transient']}")
    table.add_row(Job.CONFERENCE_REAPER,
                  f"active {remaining.get('conferences_active', '?')}  "
                  + "  ".join(f"{k} {delta[k]}" for k in REAPED))
    table.add_row(Job.OUTBOX_RELAY, f"published {delta['published']}  waiting "
                                  f"{remaining.get('outbox_unpublished', '?')}")
    table.add_row("supervision", f"actor restarts {delta['restarts']}")
    return table


@attrs.define
class _Daemon:
    """The demo's daemon, run as a task: its exit code once it returns."""

    cfg: Config
    done: trio.Event = attrs.field(factory=trio.Event)
    exit_code: int = 0

    async def run(self) -> None:
        from supervision.app.daemon import run_daemon

        self.exit_code = await run_daemon(self.cfg)
        self.done.set()


async def demo(stack: DevStack, base_dir: Path, scenario: Scenario) -> int:
    assert stack.s3 is not None
    host, port = stack.s3.endpoint_url.removeprefix("http://").split(":")
    proxy = OutageProxy(host, int(port))
    console = Console(stderr=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        password = secrets.token_urlsafe(12)  # this demo's only; printed below, loopback
        layer = write_layer(stack, base_dir, proxy.url, password)
        cfg = load_dev_config(layer)
        nursery.start_soon(partial(serve_console, cfg, signals=False))
        _print_addresses(console, stack, proxy, cfg, layer, password)
        truth = await seed(stack, scenario)
        console.print(f"seeded {scenario.recordings} recordings and {scenario.conferences} "
                      f"conferences; expecting {truth}")
        base = snapshot()
        proxy.down = scenario.outage
        daemon = _Daemon(cfg)
        nursery.start_soon(daemon.run)
        deadline_passed = await _watch(console, proxy, cfg, base, daemon, scenario)
        nursery.cancel_scope.cancel()
    missed = _summarize(console, cfg, base, truth, scenario, deadline_passed)
    if not scenario.exit_when_done:
        return daemon.exit_code
    return daemon.exit_code or (1 if missed or deadline_passed else 0)


def _print_addresses(console: Console, stack: DevStack, proxy: OutageProxy, cfg: Config,
                     layer: Path, password: str) -> None:
    assert stack.s3 is not None
    console.print(f"  postgres  {redact_dsn(cfg.postgres.dsn.reveal())}\n  kafka     "
                  f"{stack.endpoints().kafka_bootstrap}\n  s3        "
                  f"{stack.s3.endpoint_url} (bucket {BUCKET}, via outage proxy {proxy.url})"
                  f"\n  metrics   http://{cfg.http.listen}/metrics\n  config    {layer}"
                  f"\n  console   http://{cfg.console.listen}/  (user {CONSOLE_USER}, "
                  f"password {password}; actions allowed)", markup=False)


async def _watch(console: Console, proxy: OutageProxy, cfg: Config, base: dict[str, float],
                 daemon: _Daemon, scenario: Scenario) -> bool:
    """The live table until the daemon stops (or, with ``exit_when_done``, every seeded row
    is terminal, or the deadline passed: then True). The outage ends after
    ``OUTAGE_SECONDS``."""
    dsn = cfg.postgres.dsn.reveal()
    started = trio.current_time()
    remaining: dict[str, int] = {}
    with Live(view(base, remaining, "starting"), console=console,
              refresh_per_second=4, transient=False,
              auto_refresh=console.is_terminal) as live:
        while not daemon.done.is_set():
            elapsed = trio.current_time() - started
            if proxy.down and elapsed > OUTAGE_SECONDS:
                proxy.down = False
            note = (f"S3 outage ({elapsed:.0f}s)" if proxy.down else f"{elapsed:.0f}s")
            remaining = await trio.to_thread.run_sync(progress, dsn)
            live.update(view(base, remaining, note))
            if scenario.exit_when_done and not any(remaining.values()) and elapsed > 1.0:
                return False
            if scenario.exit_when_done and elapsed > scenario.deadline:
                return True
            with trio.move_on_after(0.5):
                await daemon.done.wait()
    return False


def _summarize(console: Console, cfg: Config, base: dict[str, float], truth: dict[str, int],
               scenario: Scenario, deadline_passed: bool) -> list[str]:
    """The summary beside the seeded truth; what was not reached (``exit_when_done``)."""
    final = snapshot()
    summary = {k: int(final[k] - base.get(k, 0.0)) for k in final}
    table = Table(title="summary")
    table.add_column("figure")
    table.add_column("seen", justify="right")
    table.add_column("seeded truth", justify="right")
    for key, value in summary.items():
        table.add_row(key, str(value), str(truth.get(key, "")))
    console.print(table)
    click.echo("SUMMARY " + json.dumps(summary, sort_keys=True))
    console.print(f"metrics were served on http://{cfg.http.listen}/metrics, the console on "
                  f"http://{cfg.console.listen}/")
    if not scenario.exit_when_done:
        return []
    missed = mismatches(summary, truth)
    if deadline_passed:
        click.echo(f"deadline of {scenario.deadline:.0f}s passed before every seeded row "
                   "was terminal")
    for line in missed:
        click.echo(f"not reached: {line}")
    return missed


def run_dev(base_dir: Path | None, scenario: Scenario | None = None) -> int:
    """Run the demo; return the process exit code."""
    scenario = scenario or Scenario()
    with tempfile.TemporaryDirectory(prefix="safetynet-dev-") as tmp:
        root = base_dir or Path(tmp)
        click.echo(f"starting PostgreSQL, Tansu and SeaweedFS under {root} ...")
        with open_dev_stack(root) as stack:
            prepare(stack)
            configure_logging("error", "console", stream=sys.stderr)
            code = trio.run(demo, stack, root, scenario)
        click.echo("stopped every server")
        return code
