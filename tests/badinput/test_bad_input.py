"""The bad-input suite (issue #13): each input of ``cases.CASES`` planted next to healthy
rows on real servers; the clear reason asserted; the cause fixed where it is a setting;
then ``tests.chaos.checker`` over every other row. Figures go to build/bad-input/."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import trio
from structlog.testing import capture_logs

from actors.kafka.producer import KafkaProducer
from supervision.app import resources
from supervision.dev.ports import free_ports
from supervision.tree.health import HEALTH
from tests.badinput.cases import CASES, Case, Job, Read
from tests.badinput.report import ROOT, record
from tests.badinput.world import Planted, World, cycle
from tests.chaos.checker import state_digest
from tests.faults import refuse_batches_over
from tests.messenger import skip_backoff

# Observation windows, not waits for a state (a bound on what a daemon logs, a burst that
# must go on for a while, can only be checked over some time):
AFTERMATH_S = 0.5  # after idle connections close: what closing them makes the daemon log
BURST_S = 3.0  # structlog and standard-library lines together, once both paths are seen

pytestmark = pytest.mark.badinput
Logged = MutableMapping[str, Any]  # a log event as structlog.testing captures it


def write_base(world: World, tmp_path: Path, **sections: dict[str, Any]) -> Path:
    """A valid configuration against the world's servers."""
    creds = world.s3.credentials
    base = {"postgres": {"dsn": world.dsn},
            "s3": {"endpoint_url": world.s3.endpoint_url, "bucket": world.bucket,
                   "access_key_id": creds.access_key_id,
                   "secret_access_key": creds.secret_access_key, "region": creds.region},
            **sections}
    (tmp_path / "base.toml").write_text(tomli_w.dumps(base))
    return tmp_path / "base.toml"


def write_layer(planted: Planted, layer: Path, busy_port: int = 0) -> None:
    """The bad layer as the case plants it: text (with its files), a FIFO, a symlink to
    /dev/zero, or http.listen on *busy_port*."""
    special = planted.extra.get("special")
    if layer.exists() or layer.is_symlink():
        layer.unlink()
    if special == "fifo":
        os.mkfifo(layer)
    elif special == "devzero":
        layer.symlink_to("/dev/zero")
    elif special == "huge":
        layer.write_text("# " + "x" * (2 * 1024 * 1024 - 3) + "\n")
    elif special == "busy-listen":
        layer.write_text(f'[http]\nlisten = "127.0.0.1:{busy_port}"\n')
    else:
        for name, (text, mode) in planted.extra.get("files", {}).items():
            if mode < 0:  # a FIFO nobody writes
                os.mkfifo(layer.parent / name)
                continue
            (layer.parent / name).write_text(text)
            (layer.parent / name).chmod(mode)
        layer.write_text(planted.extra["toml"].replace("{dir}", str(layer.parent)))


def run_refused(world: World, planted: Planted, tmp_path: Path) -> str:
    """``safetynet run`` as a real process, a valid configuration layered with the bad
    one; it must exit at once (a daemon that starts is killed by the timeout: a failure)."""
    base, layer = write_base(world, tmp_path), tmp_path / "bad.toml"
    write_layer(planted, layer)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           **planted.extra["env"]}
    proc = subprocess.run(
        [sys.executable, "-m", "supervision.app", "run", "-c", str(base), "-c", str(layer)],
        capture_output=True, text=True, check=False, cwd=ROOT, env=env, timeout=30)
    assert "zzw0rd" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert (proc.returncode, len(lines)) == (78, 1), proc.stderr
    return lines[0].replace(str(layer), "<layer>")


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return int(resp.status)
    except OSError:
        return 0


def _logged(log: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") == event:
                found.append(entry)
    return found


@contextlib.contextmanager
def running_daemon(world: World, tmp_path: Path, layer_text: str = "",
                   extra_env: Mapping[str, str] | None = None, *, jobs: bool = True,
                   ) -> Iterator[tuple[Any, Path, Path, int]]:
    """``safetynet run`` on a valid configuration (base + a layer, empty unless given;
    *extra_env* added), answering /healthz; yields the process, its layer file, its log
    and its port. With *jobs* False its finalize and reaper jobs are off: a case about
    the daemon's HTTP or its reloads leaves the rows to the heal (a job that ran would
    change them, sooner or later depending on the machine's load)."""
    (port,) = free_ports(1)
    off = {"enabled": False}
    base = write_base(world, tmp_path, http={"listen": f"127.0.0.1:{port}"},
                      outbox_relay=off, supervision={"shutdown_grace": "5s"},
                      **({} if jobs else {"jobs": {"recording_finalize": off,
                                                   "conference_reaper": off}}))
    layer, log = tmp_path / "layer.toml", tmp_path / "daemon.log"
    layer.write_text(layer_text)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           **(extra_env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervision.app", "run", "-c", str(base), "-c", str(layer)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while _healthz(port) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        yield proc, layer, log, port
        assert proc.poll() is None and _healthz(port) == 200, log.read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    finally:
        proc.kill()
        proc.wait()


def run_reload_refused(world: World, planted: Planted, tmp_path: Path) -> str:
    """The bad layer and SIGHUP to a running daemon: the reload must be refused (one
    config_reload_refused line, the problem returned), the daemon must answer /healthz on
    its old port, and SIGTERM must still stop it (exit 0)."""
    with running_daemon(world, tmp_path, jobs=False) as (proc, layer, log, _):
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            write_layer(planted, layer, busy.getsockname()[1])
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while not _logged(log, "config_reload_refused"):
                assert proc.poll() is None and time.monotonic() < deadline, \
                    log.read_text()[-2000:]
                time.sleep(0.05)
        assert not _logged(log, "config_reloaded") and not _logged(log, "tree_restarted")
        problems = [str(e["problem"]) for e in _logged(log, "config_reload_refused")]
        assert len(problems) == 1, problems
    return problems[0].replace(str(layer), "<layer>")


def run_idle_flood(world: World, planted: Planted, tmp_path: Path) -> str:
    """Idle connections to a running daemon's endpoint, then a prober's /readyz: its
    answer (status and body) is the reason; the daemon logs a bounded number of lines
    about them and lives on."""
    with running_daemon(world, tmp_path, jobs=False) as (_, _, log, port):
        before = len(log.read_text().splitlines())
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5)
                for _ in range(planted.extra["idle_connections"])]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                answer = f"{resp.status} {resp.read().decode().strip()}"
        finally:
            for conn in idle:
                conn.close()
        time.sleep(AFTERMATH_S)  # what closing them makes the daemon log
        lines = log.read_text().splitlines()[before:]
        http = [line for line in lines if '"http_' in line]
        assert len(http) <= 3 and "Traceback" not in "\n".join(lines), http
    return answer


def shown(world: World, planted: Planted, tmp_path: Path) -> str:
    """``check-config`` on a valid configuration with the layer: the value it printed for
    the planted key, and never a planted secret."""
    base, layer = write_base(world, tmp_path), tmp_path / "shown.toml"
    layer.write_text(planted.extra["toml"])
    proc = subprocess.run(
        [sys.executable, "-m", "supervision.app", "check-config", "-c", str(base), "-c",
         str(layer)], capture_output=True, text=True, check=False, cwd=ROOT, timeout=30,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    for secret in planted.extra["secrets"]:
        assert secret not in proc.stdout + proc.stderr, proc.stdout
    value: Any = tomllib.loads(proc.stdout)
    for name in planted.extra["show"].split("."):
        value = value[name]
    return f"{planted.extra['show']} = {value}"


def run_daemon_with_layer(world: World, planted: Planted, tmp_path: Path) -> str:
    """What check-config prints for the planted key (if one is named), then ``safetynet
    run`` with the layer until its log holds the planted text (``BOTH_PATHS``: lines of
    structlog and of the standard library's loggers): every line of its stderr is a JSON
    object and none holds a planted secret; the daemon answers /healthz throughout."""
    reason = shown(world, planted, tmp_path) if planted.extra["show"] else ""
    until = planted.extra["until"]

    def paths(lines: Sequence[dict[str, Any]]) -> set[str]:
        return {"stdlib" if "logger" in e else "structlog" for e in lines}

    def parsed(log: Path, *, whole_lines_only: bool = False) -> list[dict[str, Any]]:
        text = log.read_text()
        if whole_lines_only:  # a running daemon may be mid-write: its last line not yet whole
            text = text[:text.rfind("\n") + 1]
        out = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                raise AssertionError(f"a log line that is not JSON: {line[:300]!r}") from None
            assert isinstance(entry, dict), line[:300]
            out.append(entry)
        return out

    with running_daemon(world, tmp_path, planted.extra["toml"],
                        planted.extra["env"]) as (proc, _, log, _):
        deadline = time.monotonic() + 60
        while not (paths(parsed(log, whole_lines_only=True)) == {"stdlib", "structlog"}
                   if until == "BOTH_PATHS"
                   else until in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, \
                log.read_text()[-2000:]
            time.sleep(0.2)
        if until == "BOTH_PATHS":  # a burst of both for a while longer
            time.sleep(BURST_S)
    lines, text = parsed(log), log.read_text()
    for secret in planted.extra["secrets"]:
        assert secret not in text, [line for line in text.splitlines() if secret in line]
    if not reason:
        stdlib = sum("logger" in e for e in lines)
        assert min(stdlib, len(lines) - stdlib) >= 20, (stdlib, len(lines))  # a burst of both
        reason = "every line one JSON object, from structlog and from the standard library"
    return reason


async def readyz_answer(world: World) -> str:
    """/readyz of the daemon's endpoint (in this process, where the cycle set its
    faults): its status and body."""
    import httpx
    import psycopg

    from actors.metrics_exporter import Readiness, serve_metrics_exporter

    async def ping() -> None:
        await trio.to_thread.run_sync(lambda: psycopg.connect(world.dsn).close())

    async with trio.open_nursery() as nursery:
        (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                             Readiness(ping))
        port = listener.socket.getsockname()[1]
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        nursery.cancel_scope.cancel()
    return f"{answer.status_code} {answer.text.strip()}"


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
        elif case.job is Job.RELOAD:
            outcome = await trio.to_thread.run_sync(run_reload_refused, world, planted,
                                                    tmp_path)
        elif case.job is Job.HTTP:
            outcome = await trio.to_thread.run_sync(run_idle_flood, world, planted, tmp_path)
        elif case.job is Job.DAEMON:
            outcome = await trio.to_thread.run_sync(run_daemon_with_layer, world, planted,
                                                    tmp_path)
        elif case.job is Job.TOOL:
            outcome = await trio.to_thread.run_sync(planted.extra["run"])
        else:
            outcome = await cycle(world.config(**planted.config), case.job.value)
        if case.read is Read.READYZ:
            outcome = await readyz_answer(world)
    reason = read_reason(case, world, planted, logs, outcome)
    touched = await trio.to_thread.run_sync(state_digest, world.dsn) != before

    if planted.heal is not None:  # the operator fixes the cause
        await planted.heal()
    HEALTH.clear_fault("s3")
    HEALTH.clear_fault("kafka")
    job = case.job if case.job in (Job.FINALIZE, Job.REAPER, Job.RELAY) else Job.FINALIZE
    held_off = any(f'"{count}":' in str(outcome) for count in ("withheld", "config_fault"))
    if case.job in (Job.DAEMON, Job.RELOAD, Job.HTTP) or held_off:
        # a real daemon ran and was stopped, maybe between a claim and its verdict: those
        # rows wait out the claim's back-off; rows given back for want of evidence or for
        # their Content-Type wait out their hold-off; both fast-forwarded here
        await trio.to_thread.run_sync(skip_backoff, world.dsn)
    healed = await cycle(world.config(), job.value)
    invariants, violations = await trio.to_thread.run_sync(
        partial(world.violations, relay=case.job is Job.RELAY))
    invariants["mutated_while_refused"] = int(case.untouched and touched)
    record(case.id, area=case.area, bad_input=case.input, did=case.did, reason=reason,
           invariants=invariants, exempt=len(world.exempt),
           duration_s=time.monotonic() - started)

    assert reason.startswith(case.reason), (reason, outcome)
    assert case.shows in reason, (case.shows, reason)
    assert not (case.completes and outcome.startswith("run-once failed")), outcome
    assert case.event is None or about(logs, case.event, planted), (
        f"no {case.event} event", [e["event"] for e in logs])
    assert not (case.untouched and touched), "a refused cycle changed rows"
    assert violations == [], (violations, healed)
