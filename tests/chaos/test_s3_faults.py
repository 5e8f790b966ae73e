"""Object-storage chaos: `safetynet run` processes reconcile through the fault proxy while
SeaweedFS answers 503 SlowDown / 500 in bursts, hangs beyond the client timeout (proxy
blackhole, and the real server SIGSTOPped), denies access, lacks the bucket, or resets
connections mid-response. Nothing may be lost, failed wrongly, or quarantined early."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.chaos.checker import state_digest
from tests.chaos.conftest import Run
from tests.chaos.daemon import Daemon, Daemons, ProxyThread, daemon_config, seed, wait_settled
from tests.faults import SLOW_DOWN, HttpRequest, HttpRule, s3_object

pytestmark = pytest.mark.chaos

# The fault windows: how long each injected fault is held (a sleep here IS the fault).
BURST_S = 1.5  # each 503/500 burst, and the calm between two bursts
HANG_S = 3.0  # HEADs blackholed, then delayed past the timeout, then SeaweedFS SIGSTOPped
RESET_S = 5.0  # HEAD responses cut by an RST
S3_DOWN_S = 4.0  # SeaweedFS stopped (connections refused)


def every_other_object_head() -> Callable[[HttpRequest], bool]:
    """Every other object HEAD (never five transient answers in a row: the outage breaker
    stays closed, so the faults reach the per-row retry path)."""
    is_object_head = s3_object("HEAD")
    count = [0]

    def match(req: HttpRequest) -> bool:
        if not is_object_head(req):
            return False
        count[0] += 1
        return count[0] % 2 == 0
    return match


def _hits(proxy: ProxyThread) -> int:
    return proxy.call(lambda: sum(rule.hits for rule in proxy.proxy.rules))


def test_s3_503_and_500_bursts(run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
                               s3_fault: ProxyThread, kafka_server: KafkaServer,
                               tmp_path: Path) -> None:
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=800, conferences=60,
                        deals=10, spread_s=16)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers,
                        finalize={"backoff_base": "1s", "backoff_cap": "3s", "batch_size": 50})
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    bursts = [("503 SlowDown", HttpRule(s3_object("HEAD"), status=503, headers=SLOW_DOWN)),
              ("500", HttpRule(s3_object("HEAD"), status=500)),
              ("503 on the bucket probe too",
               HttpRule(lambda req: req.method == "HEAD", status=503, headers=SLOW_DOWN)),
              ("500", HttpRule(s3_object("HEAD"), status=500)),
              ("503 on every other object HEAD",
               HttpRule(every_other_object_head(), status=503, headers=SLOW_DOWN)),
              ("500 on every other object HEAD",
               HttpRule(every_other_object_head(), status=500))]
    daemon.wait_for("batch_claimed", job="recording-finalize")
    for what, rule in bursts:
        s3_fault.rules(rule)
        time.sleep(BURST_S)
        run.fault(f"S3 {what} burst ({BURST_S} s)", _hits(s3_fault))
        s3_fault.clear()
        time.sleep(BURST_S)
    wait_settled(run.dsn, relay=True, limit_s=90, daemons=daemons)
    violations = run.verify(
        title="S3 503 SlowDown / 500 bursts",
        proves="transient S3 answers only reschedule: every binary adopted, none failed,"
               " none quarantined, every event published once",
        extra_invariants={"quarantined_after_bursts": _quarantined(run.dsn)})
    assert violations == [], [str(v) for v in violations]


def _quarantined(dsn: str) -> int:
    from tests.chaos.daemon import scalar
    return int(scalar(dsn, "SELECT count(*) FROM messenger.recording_finalize_attempts"
                           " WHERE status = 'Quarantined'"))


def test_s3_hang_beyond_client_timeout(run: Run, daemons: Daemons, s3_server: S3Server,
                                       bucket: str, s3_fault: ProxyThread,
                                       tmp_path: Path) -> None:
    """Requests that never answer (a proxy blackhole, and SeaweedFS itself SIGSTOPped)
    time out after s3.timeout and are retried later; nothing fails meanwhile."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=500, spread_s=10)
    cfg = daemon_config(run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
                        reaper=False, s3_timeout="1s",
                        finalize={"backoff_base": "1s", "backoff_cap": "3s", "batch_size": 50})
    daemons.add(Daemon(tmp_path, "d1", cfg)).start().wait_for("batch_claimed",
                                                              job="recording-finalize")
    s3_fault.rules(HttpRule(s3_object("HEAD"), blackhole=True))
    time.sleep(HANG_S)
    run.fault(f"S3 object HEADs blackholed for {HANG_S:g} s (client timeout 1 s)",
              _hits(s3_fault))
    s3_fault.rules(HttpRule(every_other_object_head(), latency=2.5))
    time.sleep(HANG_S)
    run.fault("every other S3 object HEAD delayed 2.5 s (beyond the 1 s timeout) for"
              f" {HANG_S:g} s", _hits(s3_fault))
    s3_fault.clear()
    assert s3_server.pid is not None
    os.kill(s3_server.pid, signal.SIGSTOP)
    try:
        time.sleep(HANG_S)
    finally:
        os.kill(s3_server.pid, signal.SIGCONT)
    run.fault(f"SeaweedFS SIGSTOPped for {HANG_S:g} s, then SIGCONT")
    wait_settled(run.dsn, relay=False, limit_s=90, daemons=daemons)
    violations = run.verify(
        title="S3 hangs beyond the client timeout",
        proves="a request that never answers is a timeout (transient): no recording with a"
               " binary is failed, nothing is lost after the server answers again",
        relay=False, extra_invariants={"quarantined_after_hangs": _quarantined(run.dsn)})
    assert violations == [], [str(v) for v in violations]


def test_s3_403_and_missing_bucket_mutate_nothing(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str, s3_fault: ProxyThread,
        tmp_path: Path) -> None:
    """403 on everything (bucket probe included), then a daemon configured with a bucket
    that does not exist: configuration faults, /readyz 503, and not a single row changes
    (no attempt consumed). With the fault gone, the same daemon converges."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=300)
    before = state_digest(run.dsn)
    s3_fault.rules(HttpRule(lambda req: True, status=403,
                            headers={"x-amz-error-code": "AccessDenied"}))
    cfg = daemon_config(run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
                        reaper=False)
    denied = daemons.add(Daemon(tmp_path, "denied", cfg)).start()
    ready = _wait_readyz(denied, 503, limit_s=20)
    denied.wait_for("config_fault", count=4)  # several cycles, each refusing to claim
    run.fault("S3 403 AccessDenied on every request for 4 cycles", _hits(s3_fault))
    after_403 = state_digest(run.dsn)

    missing_cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server,
                                bucket=f"missing-{uuid.uuid4().hex[:8]}", reaper=False)
    denied.terminate()
    missing = daemons.add(Daemon(tmp_path, "missing", missing_cfg)).start()
    missing_ready = _wait_readyz(missing, 503, limit_s=20)
    missing.wait_for("config_fault", count=4)
    run.fault("bucket missing (daemon configured with a bucket that does not exist),"
              " 4 cycles")
    after_missing = state_digest(run.dsn)
    missing.terminate()
    faults = [e.get("event") for d in (denied, missing) for e in d.events()
              if e.get("event") == "config_fault"]

    s3_fault.clear()
    daemons.add(Daemon(tmp_path, "healed", cfg)).start()
    wait_settled(run.dsn, relay=False, limit_s=60, daemons=daemons)
    violations = run.verify(
        title="S3 403 and missing bucket",
        proves="a configuration fault claims nothing and consumes no attempt (state digest"
               " unchanged), readiness is 503; once fixed everything converges",
        relay=False,
        extra_invariants={"rows_changed_under_403": int(after_403 != before),
                          "rows_changed_bucket_missing": int(after_missing != before),
                          "readyz_not_503": int(not (ready and missing_ready)),
                          "no_config_fault_logged": int(len(faults) < 2)})
    assert violations == [], [str(v) for v in violations]


def _wait_readyz(daemon: Daemon, status: int, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{daemon.port}/readyz", timeout=1).status_code \
                    == status:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def test_s3_reset_mid_response(run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
                               s3_fault: ProxyThread, tmp_path: Path) -> None:
    """Every other object HEAD response is cut by an RST after 20 bytes (inside the status
    line): a connection error mid-response is transient."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=500, spread_s=5)
    cfg = daemon_config(run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
                        reaper=False,
                        finalize={"backoff_base": "500ms", "backoff_cap": "2s",
                                  "batch_size": 50})
    s3_fault.rules(HttpRule(every_other_object_head(), reset_after=20))
    daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    time.sleep(RESET_S)
    run.fault(f"RST after 20 response bytes on every other HEAD for {RESET_S:g} s",
              _hits(s3_fault))
    s3_fault.clear()
    wait_settled(run.dsn, relay=False, limit_s=60, daemons=daemons)
    violations = run.verify(
        title="S3 connection reset mid-response",
        proves="a response cut by an RST is transient: retried, never a wrong verdict",
        relay=False, extra_invariants={"quarantined_after_resets": _quarantined(run.dsn)})
    assert violations == [], [str(v) for v in violations]


def test_seaweedfs_stopped_and_restarted_mid_drain(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """The real SeaweedFS process is stopped (connections refused) for ~4 s while the
    backlog drains, then started again on the same ports with its data."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=800, conferences=60,
                        spread_s=8)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers,
                        finalize={"backoff_base": "1s", "backoff_cap": "3s", "batch_size": 50})
    daemons.add(Daemon(tmp_path, "d1", cfg)).start().wait_for(
        "recording_reconciled", count=50)  # mid-drain
    s3_server.stop()
    try:
        time.sleep(S3_DOWN_S)
    finally:
        s3_server.start()
    run.fault(f"SeaweedFS stopped for {S3_DOWN_S:g} s, then started again")
    wait_settled(run.dsn, relay=True, limit_s=90, daemons=daemons)
    violations = run.verify(
        title="SeaweedFS stopped and restarted",
        proves="object storage gone (refused) is transient: the backlog waits and is"
               " adopted once the server is back, no binary is declared missing",
        extra_invariants={"quarantined_after_restart": _quarantined(run.dsn)})
    assert violations == [], [str(v) for v in violations]
