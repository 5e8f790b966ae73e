"""The process tree, as data. Read this file to know what runs in ``safetynet run``.

    safetynet                               one_for_one
    ├── metrics-exporter                    permanent   /metrics /healthz /readyz
    ├── (schema-gate)                       transient   only when PostgreSQL did not answer
    │                                                   the check at start: tries again; the
    │                                                   jobs below wait for its verdict
    ├── scan-leader:database-scans          permanent   sticky lease; while held, runs:
    │   └── scans                           one_for_one (one replica at a time)
    │       ├── gauge-refresher             permanent   backlog gauges from cheap queries
    │       └── auditor                     permanent   SQL invariants every audit.interval
    ├── outbox                              rest_for_one
    │   ├── outbox-listener                 permanent   LISTEN → wake the relay (wakeup=notify)
    │   └── lock-keeper:outbox-relay        permanent   cycles: claim → Kafka waves → mark
    └── jobs                                one_for_one
        ├── lock-keeper:recording-finalize  permanent   cycles: claimer → S3 pool → committers
        └── lock-keeper:conference-reaper   permanent   cycles: 3 phases → recorder signals

Resources shared by the actors (the asyncio bridge, the PostgreSQL pool, the S3 client,
the Kafka producer, the relay's wake-up) are opened by :mod:`supervision.app.daemon` before the
tree and closed after it; actors get them as arguments, never as globals.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import httpx
import psycopg

from actors.audit.auditor import serve_auditor
from actors.finalize.cycle import FinalizeJob, run_finalize_cycle
from actors.finalize.gauges import refresh_finalize, refresh_recording_slo
from actors.gauge_refresher import Refresh, serve_gauge_refresher
from actors.kafka.producer import KafkaProducer
from actors.leases.lock_keeper import LockedJob, serve_lock_keeper
from actors.leases.scan_leader import scan_lease, serve_scan_leader, stand_by
from actors.metrics_exporter import Readiness, serve_metrics_exporter
from actors.outbox.gauges import refresh_notification_queue, refresh_outbox, refresh_slot
from actors.outbox.listener import APPLICATION_NAME, serve_outbox_listener
from actors.outbox.logical import source_of
from actors.outbox.relay import RelayCounts, RelayJob, relay_idle, run_relay_cycle
from actors.reaper.cycle import ReaperJob, run_reaper_cycle
from actors.reaper.gauges import refresh_reaper_backlog
from actors.rollup import record_backlogs, record_tick
from actors.s3.objectstore import ObjectStore
from supervision.app.audit import audit_thresholds
from supervision.app.schema_gate import PendingGate, after_gate, serve_schema_gate
from supervision.app.settings import Config
from supervision.db.database import Database
from supervision.db.pgconn import client_deadline, conninfo
from supervision.db.queries import QUERIES
from supervision.jobs import Job
from supervision.tree.spec import ChildSpec, Intensity, Restart, Starter, Strategy, SupervisorSpec
from supervision.tree.supervisor import serve_supervisor
from supervision.tree.wakeup import Wakeup


@attrs.frozen
class Resources:
    cfg: Config
    db: Database
    store: ObjectStore
    producer: KafkaProducer
    media_http: httpx.AsyncClient
    wakeup: Wakeup  # the outbox relay's: committers and the listener wake it


def finalize_job(res: Resources) -> FinalizeJob:
    rf = res.cfg.jobs.recording_finalize
    return FinalizeJob(rf, res.cfg.s3.concurrency, res.db, res.store, res.wakeup.wake,
                       bucket=res.cfg.s3.bucket, key_prefix=res.cfg.s3.key_prefix)


def reaper_job(res: Resources) -> ReaperJob:
    return ReaperJob(res.cfg.jobs.conference_reaper, res.cfg.media, res.db, res.media_http,
                     res.wakeup.wake)


def relay_job(res: Resources) -> RelayJob:
    """The relay, with the DSN of its logical source's stream (the slot's changes as the
    walsender sends them) when it reads a slot."""
    relay = res.cfg.outbox_relay
    stream_dsn = (conninfo(res.cfg.postgres, "safetynet-outbox-stream")
                  if relay.source == "logical" else None)
    return RelayJob(relay, res.db, res.producer, max_run_duration=relay.lock_ttl / 2,
                    stream_dsn=stream_dsn)


def locked_jobs(res: Resources, include_disabled: bool = False,
                excluded: frozenset[str] = frozenset()) -> list[LockedJob[Any]]:
    """The enabled periodic jobs, each with its interval, lock TTL and cycle; *excluded*
    (jobs whose messenger contract is broken, :mod:`supervision.app.schema_gate`) left out."""
    jobs = _locked_jobs(res, include_disabled)
    return [job for job in jobs if job.name not in excluded]


def _locked_jobs(res: Resources, include_disabled: bool) -> list[LockedJob[Any]]:
    jobs: list[LockedJob[Any]] = []
    rf = res.cfg.jobs.recording_finalize
    if rf.enabled or include_disabled:
        jobs.append(LockedJob(Job.RECORDING_FINALIZE, rf.polling_interval, rf.lock_ttl,
                              partial(run_finalize_cycle, finalize_job(res)),
                              record=partial(record_tick, res.db)))
    cr = res.cfg.jobs.conference_reaper
    if cr.enabled or include_disabled:
        jobs.append(LockedJob(Job.CONFERENCE_REAPER, cr.polling_interval, cr.lock_ttl,
                              partial(run_reaper_cycle, reaper_job(res)),
                              record=partial(record_tick, res.db)))
    return jobs


def relay_locked_job(res: Resources) -> LockedJob[RelayCounts]:
    relay = res.cfg.outbox_relay
    job = relay_job(res)
    return LockedJob(Job.OUTBOX_RELAY, relay.poll_interval, relay.lock_ttl,
                     partial(run_relay_cycle, job), first_delay=0.0, wakeup=res.wakeup,
                     idle=partial(relay_idle, job), record=partial(record_tick, res.db))


def refreshes(res: Resources) -> list[Refresh]:
    """The database-derived gauges, each one cheap query."""
    rf = res.cfg.jobs.recording_finalize
    slot: list[Refresh] = ([partial(refresh_slot, source=source_of(res.cfg.outbox_relay))]
                           if res.cfg.outbox_relay.source == "logical" else [])
    outbox = partial(refresh_outbox, logical=res.cfg.outbox_relay.source == "logical")
    return [refresh_finalize, outbox, refresh_notification_queue, *slot,
            partial(refresh_recording_slo, sla=rf.finalize_sla_timeout,
                    interval=rf.polling_interval),
            partial(refresh_reaper_backlog, cfg=res.cfg.jobs.conference_reaper),
            record_backlogs]  # last: the charts' rollup, from the gauges just read


def ping(conn: psycopg.Connection) -> None:
    conn.execute(QUERIES["db_ping"])


def _gated(gate: PendingGate | None, job: str, serve: Starter) -> Starter:
    """*serve*, or with a pending schema check *serve* once it has passed."""
    return serve if gate is None else partial(after_gate, gate, job, serve)


@attrs.frozen
class _Wiring:
    """What every branch of the tree is built with."""

    res: Resources
    intensity: Intensity
    lock_dsn: str
    deadline: float | None
    gate: PendingGate | None


def build_tree(res: Resources, excluded: frozenset[str] = frozenset(),
               gate: PendingGate | None = None) -> SupervisorSpec:
    """The tree without the *excluded* jobs; with *gate* (the check at start found no
    database) a ``schema-gate`` child checks again and every job waits for it."""
    sup, pg = res.cfg.supervision, res.cfg.postgres
    w = _Wiring(res, Intensity(max_restarts=sup.max_restarts, window=sup.restart_window,
                               backoff_base=0.5, backoff_cap=min(30.0, sup.restart_window)),
                conninfo(pg, "safetynet-lock"), client_deadline(pg), gate)
    # The exporter starts before the scan leader: until that leads, this process is a
    # standby and exports none of the database-wide gauges (not even their zeros).
    stand_by()
    children = [
        ChildSpec("metrics-exporter", partial(
            serve_metrics_exporter, res.cfg.http.listen, Readiness(partial(res.db.run, ping))),
                  Restart.PERMANENT, shutdown=1.0),
        *([] if gate is None else [ChildSpec(
            "schema-gate", partial(serve_schema_gate, res.db, gate), Restart.TRANSIENT,
            shutdown=1.0)]),
        _scan_leader(w),
    ]
    if res.cfg.outbox_relay.enabled and Job.OUTBOX_RELAY not in excluded:
        children.append(_outbox(w))
    children.append(_jobs(w, excluded))
    return SupervisorSpec("safetynet", children, Strategy.ONE_FOR_ONE, w.intensity)


def _scan_leader(w: _Wiring) -> ChildSpec:
    """The database-wide reads on one replica at a time (actors/leases/scan_leader.py)."""
    res = w.res
    scans = [ChildSpec("gauge-refresher",
                       partial(serve_gauge_refresher, res.db, refreshes(res)),
                       Restart.PERMANENT, shutdown=1.0)]
    if res.cfg.audit.enabled:
        scans.append(ChildSpec(
            "auditor", partial(serve_auditor, res.db, audit_thresholds(res.cfg),
                               res.cfg.audit.interval),
            Restart.PERMANENT, shutdown=1.0))
    scan_tree = SupervisorSpec("scans", scans, Strategy.ONE_FOR_ONE, w.intensity)
    lease = scan_lease()
    return ChildSpec(f"scan-leader:{lease.name}",
                     partial(serve_scan_leader, lease, w.lock_dsn,
                             partial(serve_supervisor, scan_tree), deadline=w.deadline),
                     Restart.PERMANENT, shutdown=2.0)


def _outbox(w: _Wiring) -> ChildSpec:
    """The relay under its lock keeper, beside the LISTEN that wakes it (with wakeup =
    "poll" migrate installed no NOTIFY trigger: nothing to LISTEN for)."""
    res, grace = w.res, w.res.cfg.supervision.shutdown_grace
    listen_dsn = conninfo(res.cfg.postgres, APPLICATION_NAME)
    listener = [ChildSpec("outbox-listener", partial(
        serve_outbox_listener, listen_dsn, res.wakeup, deadline=w.deadline,
        min_interval=res.cfg.outbox_relay.notify_min_interval),
                          Restart.PERMANENT, shutdown=grace)
                ] if res.cfg.outbox_relay.wakeup == "notify" else []
    outbox = SupervisorSpec("outbox", [
        *listener,
        ChildSpec("lock-keeper:outbox-relay",
                  partial(serve_lock_keeper, relay_locked_job(res), w.lock_dsn,
                          deadline=w.deadline),
                  Restart.PERMANENT, shutdown=grace),
    ], Strategy.REST_FOR_ONE, w.intensity)
    return ChildSpec("outbox", _gated(w.gate, Job.OUTBOX_RELAY, partial(
        serve_supervisor, outbox)), Restart.PERMANENT, shutdown=grace)


def _jobs(w: _Wiring, excluded: frozenset[str]) -> ChildSpec:
    """One lock keeper per job (recording-finalize, conference-reaper)."""
    grace = w.res.cfg.supervision.shutdown_grace
    jobs = SupervisorSpec(
        "jobs",
        [ChildSpec(f"lock-keeper:{job.name}",
                   _gated(w.gate, job.name, partial(serve_lock_keeper, job, w.lock_dsn,
                                                    deadline=w.deadline)),
                   Restart.PERMANENT, shutdown=grace)
         for job in locked_jobs(res=w.res, excluded=excluded)],
        Strategy.ONE_FOR_ONE, w.intensity,
    )
    return ChildSpec("jobs", partial(serve_supervisor, jobs), Restart.PERMANENT,
                     shutdown=grace)
