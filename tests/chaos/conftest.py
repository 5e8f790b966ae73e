"""Chaos fixtures: daemons stopped (and their logs scanned for secrets) after each test, a
fault proxy in front of SeaweedFS, a dedicated Tansu that advertises a fault proxy, and
the relay's source (``relay_source``: ``table`` unless a scenario parametrizes it,
``@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)``; a logical run gets
a publication and slot of its own before the scenario seeds, dropped after its daemons
stopped)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from actors.envelope import event_id
from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.chaos.checker import (
    Limits,
    Violation,
    check,
    largest_transaction,
    outside_windows,
    redeliveries,
    redelivery_bound,
    summary,
)
from tests.chaos.daemon import RELAY_BATCH, Daemons, ProxyThread, scalar
from tests.chaos.ledger import Offsets, end_offsets, read_ledger
from tests.chaos.report import DOC, load, record, render, write_atomic
from tests.chaos.sources import (
    RelaySource,
    close_source,
    open_source,
    undelivered_event_ids,
)

# the limits of tests.chaos.daemon.daemon_config, for the checker
LIMITS = Limits(sla_s=0, max_attempts=8, empty_room_grace_s=5, provision_timeout_s=5,
                stale_live_timeout_s=60)


@pytest.fixture(scope="session", autouse=True)
def reliability_doc() -> Iterator[None]:
    """After the chaos tests ran, render build/reliability.md from the figures they wrote
    under build/ (the committed docs/reliability.md changes only by `make
    reliability-report`), so a test run leaves the tree clean."""
    yield
    figures = load()
    if figures:  # each xdist worker that ran a scenario renders; the last one has them all
        write_atomic(DOC, render(figures))


@pytest.fixture
def relay_source(request: pytest.FixtureRequest, db_dsn: str) -> Iterator[RelaySource]:
    """The source the scenario's relay reads (``request.param``, default ``table``)."""
    source = open_source(db_dsn, getattr(request, "param", "table"))
    try:
        yield source
    finally:
        close_source(db_dsn, source)


@pytest.fixture
def daemons(relay_source: RelaySource) -> Iterator[Daemons]:
    # set up after the relay's source, so its daemons stop before the slot is dropped
    group = Daemons()
    try:
        yield group
    finally:
        group.stop_all()
    assert group.leaks() == [], "a daemon logged a secret"


@pytest.fixture
def s3_fault(s3_server: S3Server) -> Iterator[ProxyThread]:
    """An HTTP-mode fault proxy in front of the session's SeaweedFS."""
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    proxy = ProxyThread(port, http=True).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@attrs.define
class ProxiedKafka:
    server: KafkaServer
    proxy: ProxyThread

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"


@pytest.fixture(scope="session")
def proxied_kafka(stack_dir: Path) -> Iterator[ProxiedKafka]:
    """A Tansu of its own that advertises the fault proxy's port: every client connection
    (bootstrap and the broker's advertised address) goes through the proxy."""
    port = free_ports(1)[0]
    base = stack_dir / "chaos-kafka"
    base.mkdir(exist_ok=True)
    server = KafkaServer(base, advertised_port=port)
    server.start()
    proxy = ProxyThread(server.port, port=port).start()
    try:
        yield ProxiedKafka(server, proxy)
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture
def kafka_via_proxy(proxied_kafka: ProxiedKafka) -> Iterator[ProxiedKafka]:
    proxied_kafka.proxy.clear()
    yield proxied_kafka
    proxied_kafka.proxy.clear()


@attrs.define
class Run:
    """One scenario's bookkeeping: start time, Kafka offsets, faults counted, figures."""

    name: str
    dsn: str
    kafka: str | None = None
    uploaded: set[str] = attrs.field(factory=set)
    injected: list[str] = attrs.field(factory=list)
    faults: int = 0
    started: float = attrs.field(factory=time.monotonic)
    since: Offsets | None = None
    source: RelaySource = attrs.field(factory=RelaySource)
    relay_batch: int = RELAY_BATCH  # the daemons' [outbox_relay] batch_size
    # per crash: the event ids Kafka had and the relay had not recorded (None: not measured)
    windows: list[set[str]] | None = None

    def begin_kafka(self, bootstrap: str) -> None:
        self.kafka = bootstrap
        self.since = end_offsets(bootstrap)

    def crashed(self) -> int:
        """Right after a kill -9 (before the restart): measure the unacknowledged window,
        the events Kafka has that the relay had not recorded delivered (``published_at``;
        the slot's position), which the restart may send again; its size."""
        assert self.kafka is not None, "begin_kafka first"
        pending = set(undelivered_event_ids(self.dsn, self.source))
        on_kafka = read_ledger(self.kafka, since=self.since, limit_s=30).event_ids()
        window = pending & on_kafka
        self.windows = [*(self.windows or []), window]
        return len(window)

    def fault(self, what: str, count: int = 1) -> None:
        self.faults += count
        if what not in self.injected:
            self.injected.append(what)

    def verify(self, *, title: str, proves: str, relay: bool = True,
               limits: Limits = LIMITS, extra_invariants: dict[str, int] | None = None,
               **extra: Any) -> list[Violation]:
        """Ledger (if Kafka), checker, duplicates against their bound, figures JSON;
        returns the violations."""
        ledger = None
        if self.kafka is not None:
            expect = [str(e) for (e,) in _deliverable_event_ids(self.dsn)]
            ledger = read_ledger(self.kafka, expect=expect, since=self.since, limit_s=60)
            ledger = ledger.about(_subjects(self.dsn))
        violations = check(self.dsn, ledger=ledger, uploaded=self.uploaded, limits=limits,
                           relay=relay, slot=self.source.logical)
        invariants = summary(violations)
        if ledger is None:
            for name in ("not_in_ledger", "ledger_inconsistent", "unknown_event", "order"):
                invariants.pop(name)
        if self.source.logical is None or not relay:
            invariants.pop("slot_unread")
        checks = dict(extra_invariants or {})
        rows = {name: int(scalar(self.dsn, query)) for name, query in _ROW_FIGURES.items()}
        if ledger is not None:
            again = redeliveries(ledger)
            largest = largest_transaction(self.dsn) if self.source.logical else 0
            bound = redelivery_bound(self.source.name, self.relay_batch, self.faults,
                                     largest)
            if self.windows is not None:  # measured at each crash: the exact window
                bound = sum(len(w) for w in self.windows)
                outside = outside_windows(ledger, self.windows)
                checks["duplicate_outside_window"] = len(outside)
                extra["crash_windows"] = [len(w) for w in self.windows]
            rows["kafka messages read"] = len(ledger.entries)
            rows["kafka redeliveries"] = again.copies
            extra["duplicates"] = {"events delivered more than once": again.events,
                                   "copies beyond the first": again.copies,
                                   "bound": bound, "largest transaction": largest}
            if relay:
                checks["duplicates_over_bound"] = int(again.copies > bound)
        invariants.update(checks)
        record(self.name, title=title, proves=proves, injected=self.injected, rows=rows,
               faults=self.faults, invariants=invariants,
               duration_s=time.monotonic() - self.started, source=self.source.name,
               **extra)
        return violations + [Violation(k, "scenario check", str(v))
                             for k, v in checks.items() if v]


def _subjects(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {str(r[0]) for r in conn.execute(
            "SELECT id FROM messenger.call_recordings UNION ALL"
            " SELECT id FROM messenger.conference_sessions")}


def _deliverable_event_ids(dsn: str) -> list[tuple[str]]:
    """Every outbox row's event id but a dead letter's: what the read-back waits for
    (whatever the source recorded: the logical source writes no ``published_at``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT topic, dedupe_key FROM messenger.integration_outbox o"
                            " WHERE NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d"
                            " WHERE d.outbox_id = o.id)").fetchall()
    return [(event_id(t, d),) for t, d in rows]


_ROW_FIGURES = {
    "recordings": "SELECT count(*) FROM messenger.call_recordings",
    "available": "SELECT count(*) FROM messenger.call_recordings WHERE status = 'Available'",
    "failed": "SELECT count(*) FROM messenger.call_recordings WHERE status = 'Failed'",
    "quarantined": "SELECT count(*) FROM messenger.recording_finalize_attempts"
                   " WHERE status = 'Quarantined'",
    "max attempts used": "SELECT coalesce(max(attempts), 0)"
                         " FROM messenger.recording_finalize_attempts",
    "conferences": "SELECT count(*) FROM messenger.conference_sessions",
    "conferences ended": "SELECT count(*) FROM messenger.conference_sessions"
                         " WHERE status = 'Ended'",
    "conferences failed": "SELECT count(*) FROM messenger.conference_sessions"
                          " WHERE status = 'Failed'",
    "outbox rows": "SELECT count(*) FROM messenger.integration_outbox",
    "realtime rows": "SELECT count(*) FROM messenger.realtime_outbox",
}


@pytest.fixture
def run(request: pytest.FixtureRequest, db_dsn: str, relay_source: RelaySource) -> Run:
    name = request.node.name.removeprefix("test_").replace("[", "-").rstrip("]")
    return Run(name, db_dsn, source=relay_source)
