"""The bad-input suite (issue #13): each input of ``cases.CASES`` planted next to healthy
rows on real servers; the clear reason asserted; the cause fixed where it is a setting;
then ``tests.chaos.checker`` over every other row. Figures go to build/bad-input/."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import MutableMapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import trio
from structlog.testing import capture_logs

from actors.kafka_producer import KafkaProducer
from supervision.app import resources
from supervision.health import HEALTH
from tests.badinput.cases import CASES, Case, Job, Read
from tests.badinput.report import ROOT, record
from tests.badinput.world import Planted, World, cycle
from tests.chaos.checker import state_digest
from tests.faults import refuse_batches_over

pytestmark = pytest.mark.badinput
Logged = MutableMapping[str, Any]  # a log event as structlog.testing captures it


def run_refused(world: World, planted: Planted, tmp_path: Path) -> str:
    """``safetynet run`` as a real process, a valid configuration layered with the bad
    one; it must exit at once (a daemon that starts is killed by the timeout: a failure)."""
    creds = world.s3.credentials
    base = {"postgres": {"dsn": world.dsn},
            "s3": {"endpoint_url": world.s3.endpoint_url, "bucket": world.bucket,
                   "access_key_id": creds.access_key_id,
                   "secret_access_key": creds.secret_access_key, "region": creds.region}}
    (tmp_path / "base.toml").write_text(tomli_w.dumps(base))
    (tmp_path / "bad.toml").write_text(planted.extra["toml"])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           **planted.extra["env"]}
    proc = subprocess.run(
        [sys.executable, "-m", "supervision.app", "run", "-c", str(tmp_path / "base.toml"),
         "-c", str(tmp_path / "bad.toml")],
        capture_output=True, text=True, check=False, cwd=ROOT, env=env, timeout=30)
    assert "zzw0rd" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert (proc.returncode, len(lines)) == (78, 1), proc.stderr
    return lines[0]


def read_reason(case: Case, world: World, planted: Planted, logs: Sequence[Logged],
                outcome: str) -> str:
    query = {
        Read.LAST_ERROR: "SELECT last_error FROM messenger.recording_finalize_attempts"
                         " WHERE recording_id = %s",
        Read.STATUS: "SELECT status FROM messenger.call_recordings WHERE id = %s",
        Read.DEAD_LETTER: "SELECT reason FROM safetynet.outbox_dead_letters"
                          " WHERE outbox_id = %s",
    }.get(case.read)
    if query is not None:
        found = world.conn.execute(query, (planted.subject,)).fetchone()
        return "" if found is None or found[0] is None else str(found[0])
    if case.read is Read.PLANTED:
        return str(planted.extra["reason"])
    if case.read is Read.HEALTH:
        return HEALTH.reason() or ""
    if case.read is Read.LOG:
        return "; ".join(str(e.get("error")) for e in about(logs, case.event, planted))
    return outcome  # COUNTS, EXIT


def about(logs: Sequence[Logged], event: str | None, planted: Planted) -> list[Logged]:
    """The log events named *event* that have the planted subject (a recording,
    conference or outbox id, a topic) as a field's value, if there is a subject."""
    return [e for e in logs if e["event"] == event
            and (not planted.subject or planted.subject in {str(v) for v in e.values()})]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_input_gets_its_reason_and_every_other_row_its_terminal_state(
        case: Case, world: World, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    if case.job is Job.RELAY:
        world.kafka = request.getfixturevalue("kafka_server")
        world.seed_outbox()
    elif case.job is Job.REAPER:
        world.seed_conferences()
    else:
        await world.seed_recordings()
    planted: Planted = await case.plant(world)
    if planted.extra.get("no_topic_creation"):  # a broker with auto-create off
        monkeypatch.setattr(resources, "KafkaProducer", partial(KafkaProducer,
                                                             create_topics=False))
    if (limit := planted.extra.get("broker_max_bytes")) is not None:
        refuse_batches_over(monkeypatch, limit)
    before = await trio.to_thread.run_sync(state_digest, world.dsn)
    with capture_logs() as logs:
        if case.job is Job.CONFIG:
            outcome = await trio.to_thread.run_sync(run_refused, world, planted, tmp_path)
        else:
            outcome = await cycle(world.config(**planted.config), case.job.value)
    reason = read_reason(case, world, planted, logs, outcome)
    touched = await trio.to_thread.run_sync(state_digest, world.dsn) != before

    if planted.heal is not None:  # the operator fixes the cause
        await planted.heal()
    HEALTH.clear_fault("s3")
    HEALTH.clear_fault("kafka")
    job = Job.FINALIZE if case.job is Job.CONFIG else case.job
    healed = await cycle(world.config(), job.value)
    invariants, violations = await trio.to_thread.run_sync(
        partial(world.violations, relay=case.job is Job.RELAY))
    invariants["mutated_while_refused"] = int(case.untouched and touched)
    record(case.id, area=case.area, bad_input=case.input, did=case.did, reason=reason,
           invariants=invariants, exempt=len(world.exempt),
           duration_s=time.monotonic() - started)

    assert reason.startswith(case.reason), (reason, outcome)
    assert case.event is None or about(logs, case.event, planted), (
        f"no {case.event} event", [e["event"] for e in logs])
    assert not (case.untouched and touched), "a refused cycle changed rows"
    assert violations == [], (violations, healed)
