"""The soak: 3,000 recordings and 500 conferences falling due over the run, two daemons,
and random faults from a seeded RNG — S3 errors / resets / hangs / refusals, Kafka
refused, a daemon SIGKILLed (restarted a moment later), backends and lock sessions
terminated. Then the faults stop, the daemons settle, and every invariant is checked;
the shipped auditor agrees: the daemons' own auditor actors (every 5 s through the faults,
production age bounds) logged ``invariant_violated`` for no invariant but lateness (the
SLO ones, which a 0 s SLA under faults breaks on purpose) and export 0 for every invariant
once settled, and ``safetynet audit --kafka`` with no age bounds exits 0 with no violation.

``SAFETYNET_SOAK_SEED`` (default 1) and ``SAFETYNET_SOAK_SECONDS`` (default 60) pick the
run; the rows scale with the seconds, so a shorter soak keeps the same rates (50
recordings and 8.3 conferences falling due a second, a fault every 0.5 to 2 s): ``make test``
runs 30 s, ``make reliability-report`` the full 60 s. The figures go to
``build/reliability/soak-seed<N>-<source>.json``: the soak runs in both of the relay's
sources (``table``, ``logical``).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.audit.invariants import Invariant
from supervision.dev.s3 import S3Server
from tests.chaos.conftest import ProxiedKafka, Run
from tests.chaos.daemon import (
    Daemon,
    Daemons,
    ProxyThread,
    audit_cli,
    audit_config,
    daemon_config,
    seed,
    terminate_backends,
    wait_settled,
)
from tests.chaos.sources import SOURCES
from tests.chaos.test_process_faults import logged_twice
from tests.chaos.test_s3_faults import every_other_object_head
from tests.faults import SLOW_DOWN, HttpRule, s3_object
from tests.waiting import wait_until

pytestmark = pytest.mark.chaos

RECORDINGS = 3000  # over the default 60 s; a shorter soak gets its share
CONFERENCES = 500
DEFAULT_SECONDS = 60.0
# The SLO invariants measure lateness: with the soak's SLA of 0 s a row is "past the SLO"
# one poll interval after it falls due, which the faults make happen on purpose. The live
# auditor may report them during the faults; every other invariant, never.
LATENESS = {str(Invariant.LOST_RECORDING), str(Invariant.LOST_CONFERENCE)}


@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_soak_random_faults(run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
                            s3_fault: ProxyThread, kafka_via_proxy: ProxiedKafka,
                            tmp_path: Path) -> None:
    test_began = time.monotonic()
    soak_seed = int(os.environ.get("SAFETYNET_SOAK_SEED", "1"))
    seconds = float(os.environ.get("SAFETYNET_SOAK_SECONDS", DEFAULT_SECONDS))
    recordings = round(RECORDINGS * seconds / DEFAULT_SECONDS)
    conferences = round(CONFERENCES * seconds / DEFAULT_SECONDS)
    rng = random.Random(soak_seed)
    run.name = f"soak-seed{soak_seed}-{run.source.name}"
    kafka = kafka_via_proxy
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=recordings,
                        conferences=conferences, deals=50, spread_s=seconds * 0.8,
                        conference_spread_s=seconds * 0.8)
    run.begin_kafka(kafka.bootstrap)
    run.started = time.monotonic()
    cfg = daemon_config(run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
                        kafka=kafka.bootstrap, source=run.source, s3_timeout="1500ms",
                        finalize={"batch_size": 50, "backoff_base": "1s", "backoff_cap": "4s"},
                        reaper={"batch_size": 25}, audit={"interval": "5s"})
    group = [daemons.add(Daemon(tmp_path, name, cfg)).start() for name in ("a", "b")]
    counts: Counter[str] = Counter()
    later: list[tuple[float, Callable[[], None]]] = []

    def s3(rule: HttpRule | None, label: str) -> None:
        s3_fault.clear()
        if rule is not None:
            s3_fault.rules(rule)
        later.append((time.monotonic() + rng.uniform(1, 4), s3_fault.clear))
        counts[label] += 1

    def kill9() -> None:
        alive = [d for d in group if d.alive()]
        if alive:
            victim = rng.choice(alive)
            victim.kill9()
            later.append((time.monotonic() + rng.uniform(0.5, 2.5), lambda: restart(victim)))
            counts["daemon SIGKILLed (restarted 0.5-2.5 s later)"] += 1

    def restart(daemon: Daemon) -> None:
        if not daemon.alive():
            daemon.start()

    def s3_down() -> None:
        s3(None, "S3 refused for 1-4 s")
        s3_fault.set(down=True)

    def kafka_down() -> None:
        kafka.proxy.set(down=True)
        later.append((time.monotonic() + rng.uniform(1, 4),
                      lambda: kafka.proxy.set(down=False)))
        counts["Kafka refused for 1-4 s"] += 1

    actions: list[tuple[str, Callable[[], None]]] = [
        ("s3-503", lambda: s3(HttpRule(s3_object("HEAD"), status=503, headers=SLOW_DOWN),
                              "S3 503 SlowDown on object HEADs for 1-4 s")),
        ("s3-500", lambda: s3(HttpRule(every_other_object_head(), status=500),
                              "S3 500 on every other object HEAD for 1-4 s")),
        ("s3-reset", lambda: s3(HttpRule(every_other_object_head(), reset_after=20),
                                "S3 reset mid-response on every other HEAD for 1-4 s")),
        ("s3-hang", lambda: s3(HttpRule(every_other_object_head(), blackhole=True),
                               "S3 hang (beyond the 1.5 s timeout) on every other HEAD")),
        ("s3-down", s3_down),
        ("kill9", kill9),
        ("kafka-down", kafka_down),
        ("pg-terminate", lambda: counts.update(
            {"pg_terminate_backend of daemon sessions (busy ones first)":
             terminate_backends(run.dsn, busy=True) or terminate_backends(run.dsn)})),
        ("lock-kill", lambda: counts.update(
            {"advisory-lock sessions terminated": terminate_backends(
                run.dsn, app="safetynet-lock")})),
    ]
    end = time.monotonic() + seconds
    timeline: list[str] = []
    while time.monotonic() < end:
        now = time.monotonic()
        for item in [x for x in later if x[0] <= now]:
            later.remove(item)
            item[1]()
        name, action = rng.choice(actions)
        timeline.append(name)
        action()
        time.sleep(rng.uniform(0.5, 2.0))
    for _, fn in sorted(later, key=lambda x: x[0]):
        fn()  # heal: restart the killed, clear the proxies
    s3_fault.clear()
    kafka.proxy.clear()
    for daemon in group:
        if not daemon.alive():
            daemon.start()
    for label, n in counts.items():
        run.fault(label, n)
    settle_s = wait_settled(run.dsn, relay=True, limit_s=240, daemons=daemons,
                            source=run.source)
    violations = run.verify(
        title=f"Soak, seed {soak_seed}, {run.source.name} source",
        proves=f"{recordings} recordings and {conferences} conferences falling due over"
               f" {seconds:.0f} s under random S3/Kafka/PostgreSQL/process faults:"
               " nothing lost, nothing duplicated, no wrong verdict, bounded",
        extra_invariants={"logged_twice": logged_twice(daemons)},
        seed=soak_seed, fault_seconds=seconds, settle_seconds=round(settle_s, 1),
        faults_by_kind=dict(counts), daemon_starts={d.name: d.starts for d in group},
        timeline=" ".join(timeline))
    assert violations == [], [str(v) for v in violations][:20]
    live = [e for d in group for e in d.events() if e.get("event") == "invariant_violated"
            and e.get("invariant") not in LATENESS]
    assert live == [], live[:5]
    def leader_gauges_at_zero() -> bool:
        # the auditor runs on the database-scans lease holder only; standbys export none
        running = [d for d in group if d.alive()]
        if not all(d.answers() for d in running):
            return False  # a daemon the heal restarted is not listening yet
        exported = [g for g in (d.invariant_gauges() for d in running) if g]
        return len(exported) == 1 and set(exported[0].values()) == {0.0}
    wait_until(leader_gauges_at_zero, 30, "one daemon (the scan leader) exporting every"
               " safetynet_invariant_violations back at 0, the others none", 0.5)
    # the window starts with this test: the session's broker holds earlier tests' events
    since = f"{math.ceil(time.monotonic() - test_began)}s"
    shipped = audit_cli(audit_config(tmp_path, cfg), "--json", "--kafka", "--since", since)
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    assert json.loads(shipped.stdout)["violations"] == []
