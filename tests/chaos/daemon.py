"""Chaos helpers: `safetynet run` as real processes, their config, bulk seeding, and the
Trio fault proxy (tests/faults.py) driven from synchronous test code in a thread.

A chaos test is synchronous: it starts daemons (``Daemon``), injects faults (signals,
``pg_terminate_backend``, a ``ProxyThread`` in front of S3 or Kafka, server stop/start),
then waits for convergence and runs the checker over the database and a Kafka ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import tomli_w
import trio
from prometheus_client.parser import text_string_to_metric_families

from supervision.app.queries import ALL_QUERIES
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from supervision.dev.uploads import Upload, object_headers
from tests.chaos.sources import RelaySource, unread, waiting
from tests.faults import FaultProxy
from tests.logscan import KNOWN_SECRETS, leaks
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "call-recordings/"
MAX_ATTEMPTS = 8
RELAY_BATCH = 50  # the relay's batch_size: many waves per drain, a tight duplicate bound
_T = TypeVar("_T")


# ------------------------------------------------------------------------------ config


def daemon_config(dsn: str, *, s3_url: str, s3: S3Server, bucket: str,
                  kafka: str | None = None, relay: bool | None = None,
                  source: RelaySource | None = None, finalize: dict[str, Any] | None = None,
                  reaper: dict[str, Any] | bool = True, s3_timeout: str = "2s",
                  **sections: dict[str, Any]) -> dict[str, Any]:
    """Short intervals (as the demo's supervision/dev/demo.toml), SLA 0, fast back-off;
    the relay runs only when a Kafka address is given (or *relay* says so), reading
    *source* (default: the table)."""
    creds = s3.credentials
    rf: dict[str, Any] = {"polling_interval": "1s", "batch_size": 100,
                          "finalize_sla_timeout": "0s", "backoff_base": "200ms",
                          "backoff_cap": "1s", "max_attempts": MAX_ATTEMPTS,
                          "lock_ttl": "30s", "max_run_duration": "20s", **(finalize or {})}
    cr: dict[str, Any] = {"polling_interval": "1s", "empty_room_grace": "5s",
                          "provision_timeout": "5s", "stale_live_timeout": "1m",
                          "lock_ttl": "30s", "max_run_duration": "20s"}
    if isinstance(reaper, dict):
        cr.update(reaper)
    else:
        cr["enabled"] = reaper
    raw: dict[str, Any] = {
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3_url, "bucket": bucket, "region": creds.region,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key, "timeout": s3_timeout},
        "kafka": {"bootstrap_servers": kafka or "127.0.0.1:1"},
        "jobs": {"recording_finalize": rf, "conference_reaper": cr},
        "outbox_relay": {"enabled": bool(kafka) if relay is None else relay,
                         "poll_interval": "300ms", "batch_size": RELAY_BATCH,
                         **(source or RelaySource()).settings()},
        "supervision": {"shutdown_grace": "5s", "max_restarts": 50, "restart_window": "60s"},
        "logging": {"format": "json", "level": "info"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


# ------------------------------------------------------------------------------ daemon


def audit_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The shipped auditor: `safetynet audit` on the daemon's own config, no age bounds."""
    return subprocess.run([sys.executable, "-m", "supervision.app", "audit", *args,
                           "-c", str(config)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def audit_config(tmp_path: Path, cfg: dict[str, object]) -> Path:
    """The daemons' config with the auditor's age bounds at zero: every row is judged,
    however young (the test has settled first), over the last hour."""
    path = tmp_path / "audit.toml"
    path.write_text(tomli_w.dumps({**cfg, "audit": {"grace": "0s", "relay_lag": "0s",
                                                    "window": "1h", "s3_rate": 1000}}))
    return path



class Daemon:
    """One `python -m supervision.app run` process with its own config file, log and port."""

    def __init__(self, tmp: Path, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.port = free_ports(1)[0]
        config = {**config, "http": {"listen": f"127.0.0.1:{self.port}"}}
        self.config_path = tmp / f"{name}.toml"
        self.config_path.write_text(tomli_w.dumps(config))
        self.log = tmp / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Daemon:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervision.app", "run", "-c", str(self.config_path)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM and wait; the exit code (SIGKILL after *timeout*)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                return -9
        return self.proc.returncode

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out

    def names(self) -> list[str]:
        return [str(e.get("event")) for e in self.events()]

    def wait_for(self, event: str, count: int = 1, job: str | None = None,
                 limit_s: float = 30.0) -> None:
        """Return once the daemon logged *event* (of *job*, if given) *count* times: the
        signal a scenario waits for instead of a fixed sleep."""
        def seen() -> bool:
            return sum(1 for e in self.events() if e.get("event") == event
                       and (job is None or e.get("job") == job)) >= count
        wait_until(seen, limit_s, f"{self.name}: {count} x {event}")

    def answers(self) -> bool:
        """Its endpoint answers ``/healthz`` (a restarted daemon binds it a while later)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).is_success
        except httpx.HTTPError:
            return False

    def invariant_gauges(self) -> dict[str, float]:
        """``safetynet_invariant_violations{invariant}`` as this daemon's /metrics shows it
        (empty before its auditor's first run)."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        return {sample.labels["invariant"]: sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "safetynet_invariant_violations"}

    def leaks(self) -> list[str]:
        return leaks(self.log.read_text(errors="replace"), KNOWN_SECRETS)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


class Daemons:
    """A set of daemons stopped (SIGTERM, then SIGKILL) at the end of a test."""

    def __init__(self) -> None:
        self.all: list[Daemon] = []

    def add(self, daemon: Daemon) -> Daemon:
        self.all.append(daemon)
        return daemon

    def stop_all(self) -> dict[str, int]:
        return {d.name: d.terminate() for d in self.all if d.proc is not None}

    def leaks(self) -> list[str]:
        return [f"{d.name}: {leak}" for d in self.all for leak in d.leaks()]


# ------------------------------------------------------------------------------ database


def scalar(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params or None).fetchone()
        assert row is not None
        return row[0]


def execute(dsn: str, query: str, *params: Any) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params or None).rowcount


def terminate_backends(dsn: str, *, app: str | None = None, pids: list[int] | None = None,
                       busy: bool = False) -> int:
    """``pg_terminate_backend`` the other client sessions on the test database (the
    daemons'), optionally only those of application_name *app*, of *pids*, or those inside
    a transaction (*busy*); how many were terminated."""
    return int(scalar(
        dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
             " WHERE datname = current_database() AND pid <> pg_backend_pid()"
             " AND backend_type = 'client backend'"
             " AND (%s::text IS NULL OR application_name = %s::text)"
             " AND (%s::int[] IS NULL OR pid = ANY(%s::int[]))"
             " AND (NOT %s OR xact_start IS NOT NULL)", app, app, pids, pids, busy))


PENDING = ("SELECT count(*) FROM messenger.recording_finalize_attempts"
           " WHERE status = 'Pending'")
ACTIVE_DUE = ("SELECT count(*) FROM messenger.conference_sessions"
              " WHERE status IN ('Provisioning', 'Active')")


def settled(dsn: str, *, relay: bool, source: RelaySource | None = None) -> bool:
    """No finalize row Pending, no seeded conference active, and (with a relay) every
    event delivered as the source records it; for the logical source also nothing left
    unread past the slot (peeked only once the rest holds)."""
    work = int(scalar(dsn, PENDING)) + int(scalar(dsn, ACTIVE_DUE))
    if work or not relay:
        return work == 0
    source = source or RelaySource()
    if waiting(dsn, source):
        return False
    return source.logical is None or not unread(dsn, source)


def wait_settled(dsn: str, *, relay: bool, limit_s: float, daemons: Daemons | None = None,
                 source: RelaySource | None = None) -> float:
    """Wait until :func:`settled`; the seconds it took."""
    start = time.monotonic()
    while not settled(dsn, relay=relay, source=source):
        if time.monotonic() - start > limit_s:
            tails = "\n".join(d.tail(1500) for d in (daemons.all if daemons else []))
            raise AssertionError(
                f"not settled after {limit_s}s: pending={scalar(dsn, PENDING)} "
                f"active={scalar(dsn, ACTIVE_DUE)}"
                f" undelivered={waiting(dsn, source or RelaySource())}\n{tails}")
        time.sleep(0.2)
    return time.monotonic() - start


# ------------------------------------------------------------------------------ seeding


def seed(dsn: str, s3: S3Server, bucket: str, *, recordings: int, conferences: int = 0,
         deals: int = 0, uploaded_share: float = 0.7, available_share: float = 0.1,
         spread_s: float = 0.0, conference_spread_s: float = 0.0) -> set[str]:
    """The `safetynet dev` incident: lost callbacks (``uploaded_share`` with the binary,
    ``available_share`` Available but unpublished, with theirs, the rest without) and orphaned
    conferences (a third per reaper phase; with *deals* > 0 they share that many deal ids,
    so the conference-ended topic has several events per key; finalize rows fall due
    uniformly over *spread_s* seconds). Returns the ids of the
    recordings whose object is in S3."""
    available = int(recordings * available_share)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(ALL_QUERIES["dev_seed_recordings"],
                            {"n": recordings, "available": available}).fetchall()
        if spread_s:  # due over the next spread_s seconds, so faults meet live work
            conn.execute("UPDATE messenger.recording_finalize_attempts"
                         " SET next_attempt_at = now() + random() * %s * interval '1 second'",
                         (spread_s,))
        if conferences:
            conn.execute(ALL_QUERIES["dev_seed_conferences"], {"n": conferences})
        if conference_spread_s:  # each conference falls due within the next N seconds
            conn.execute(
                "UPDATE messenger.conference_sessions SET"
                " created_at = CASE WHEN status = 'Provisioning'"
                "   THEN now() - interval '5 s' + random() * %(d)s * interval '1 s'"
                "   ELSE created_at END,"
                " last_activity_at = CASE"
                "   WHEN status = 'Active' AND active_participant_count = 0"
                "   THEN now() - interval '5 s' + random() * %(d)s * interval '1 s'"
                "   WHEN status = 'Active'"
                "   THEN now() - interval '60 s' + random() * %(d)s * interval '1 s'"
                "   ELSE last_activity_at END", {"d": conference_spread_s})
        if deals:
            conn.execute("UPDATE messenger.conference_sessions SET deal_id ="
                         " md5('deal' || (abs(hashtext(id::text)) %% %s))::uuid", (deals,))
    pending = [str(r[0]) for r in rows if r[1] != "Available"]
    # Available recordings have their binary too (the positive canary HEADs them)
    to_upload = pending[:round(recordings * uploaded_share)] + [
        str(r[0]) for r in rows if r[1] == "Available"]
    upload(s3, bucket, to_upload)
    return set(to_upload)


def upload(s3: S3Server, bucket: str, recording_ids: Collection[str]) -> None:
    """The recorder's uploads (audio/ogg with a duration), 16 at a time, straight to S3."""
    headers = object_headers("audio/ogg", {"duration-seconds": "42"})
    body = b"OggS" + bytes(60)
    s3.put_objects(bucket, [Upload(f"{PREFIX}{rid}", body, headers) for rid in recording_ids])


# ------------------------------------------------------------------------------ proxy


class ProxyThread:
    """A :class:`tests.faults.FaultProxy` served by its own Trio loop in a thread, so that
    synchronous tests can switch its faults (``set``/``call`` run in the proxy's loop)."""

    def __init__(self, upstream_port: int, *, http: bool = False, port: int | None = None
                 ) -> None:
        self.proxy = FaultProxy("127.0.0.1", upstream_port, http=http)
        if port is not None:
            self.proxy.port = port
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return self.proxy.url

    def start(self) -> ProxyThread:
        ready = threading.Event()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                await nursery.start(self.proxy.serve)
                ready.set()

        self._thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self._thread.start()
        assert ready.wait(10), "fault proxy did not start"
        return self

    def call(self, fn: Callable[[], _T]) -> _T:
        assert self._token is not None
        return trio.from_thread.run_sync(fn, trio_token=self._token)

    def set(self, **attrs: Any) -> None:
        """Set proxy attributes (``down``) or TCP faults (``blackhole``, ``latency``...)."""
        def apply() -> None:
            for name, value in attrs.items():
                if name == "down":
                    self.proxy.down = value
                else:
                    setattr(self.proxy.faults, name, value)
        self.call(apply)

    def rules(self, *rules: Any) -> None:
        """Replace the HTTP rules."""
        def apply() -> None:
            self.proxy.rules[:] = list(rules)
        self.call(apply)

    def clear(self) -> None:
        self.call(self.proxy.clear)

    def stop(self) -> None:
        if self._scope is not None and self._thread is not None and self._thread.is_alive():
            scope = self._scope
            self.call(scope.cancel)
            self._thread.join(10)
