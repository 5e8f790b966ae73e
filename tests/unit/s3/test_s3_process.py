"""The daemon side of the S3 worker: every request gets an outcome, whatever the worker
does, and the worker never outlives the store or the daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.s3 import process as s3_process
from actors.s3.objectstore import Missing, Transient
from actors.s3.process import open_object_store
from supervision.config import S3Config
from supervision.secrets import Secret
from tests.waiting import wait_until

FAKE = (sys.executable, str(Path(__file__).parents[2] / "fake_s3_worker.py"))
CFG = S3Config(endpoint_url="http://127.0.0.1:9", access_key_id=Secret("AKIDFAKE"),
               secret_access_key=Secret("fake-secret-value"), timeout=1.0)


async def test_answers_are_routed_to_the_request_that_asked() -> None:
    """Concurrent requests each get their own answer from one worker process."""
    results: dict[int, object] = {}
    async with open_object_store(CFG, command=FAKE) as store:

        async def ask(n: int) -> None:
            results[n] = await store.head_recording(f"r{n}")

        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(ask, n)
        assert store.starts == 1
    assert results == {n: Missing() for n in range(50)}


async def test_worker_death_fails_requests_in_flight_as_transient_and_respawns() -> None:
    """A worker that exits answers Transient for what was waiting; the next request after
    the respawn interval starts a new worker and succeeds."""
    respawn_s = 1.0  # the rule under test: one worker start per interval
    async with open_object_store(CFG, command=FAKE, respawn_interval=respawn_s) as store:
        waiting = []

        async def ask_silent() -> None:
            waiting.append(await store.head_recording("silent"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_silent)
            await trio.testing.wait_all_tasks_blocked()  # "silent" is queued first
            assert await store.head_recording("die") == Transient("s3_worker_exited")
        assert waiting == [Transient("s3_worker_exited")]
        assert await store.head_recording("r1") == Transient("s3_worker_unavailable")
        await trio.sleep(respawn_s)
        assert await store.head_recording("r1") == Missing()
        assert store.starts == 2


async def test_a_worker_that_dies_after_a_long_life_is_not_restarted_at_once() -> None:
    """The respawn interval counts from the death too: a worker that ran longer than the
    interval and then died gets no successor for one interval (the rows not yet sent are
    given back unsent, not sent to a new worker in the middle of the incident)."""
    respawn_s = 0.5
    async with open_object_store(CFG, command=FAKE, respawn_interval=respawn_s) as store:
        assert await store.head_recording("r1") == Missing()
        await trio.sleep(2 * respawn_s)  # it has run longer than one interval
        assert await store.head_recording("die") == Transient("s3_worker_exited")
        assert await store.head_recording("r2") == Transient("s3_worker_unavailable")
        assert store.starts == 1
        await trio.sleep(respawn_s)
        assert await store.head_recording("r2") == Missing()
        assert store.starts == 2


async def test_unanswered_request_times_out_as_transient() -> None:
    """A request the worker never answers gives up after answer_timeout, Transient."""
    async with open_object_store(CFG, command=FAKE) as store:
        store.answer_timeout = 0.3
        with trio.fail_after(5):
            assert await store.head_recording("silent") == Transient("s3_worker_timeout")
        assert await store.head_recording("r2") == Missing()  # the worker is still fine


async def test_garbage_from_the_worker_is_a_broken_worker_not_a_crash() -> None:
    """An answer that is not the protocol fails the waiting requests as Transient and
    leaves the store usable (a new worker)."""
    async with open_object_store(CFG, command=FAKE, respawn_interval=0) as store:
        assert await store.head_recording("garbage") == Transient("s3_worker_broken")
        assert await store.head_recording("r3") == Missing()
        assert store.starts == 2


async def test_cancelled_request_drops_its_late_answer() -> None:
    """Cancelling a request forgets it; the worker's later answers go to later requests."""
    async with open_object_store(CFG, command=FAKE) as store:
        with trio.move_on_after(0.2) as scope:
            await store.head_recording("silent")
        assert scope.cancelled_caught
        assert await store.head_recording("r4") == Missing()


async def test_missing_worker_executable_answers_unavailable() -> None:
    """If the worker cannot be started, requests answer Transient (backoff, no crash)."""
    async with open_object_store(CFG, command=("/nonexistent/python",)) as store:
        assert await store.head_bucket() == Transient("s3_worker_unavailable")
        assert store.starts == 0


async def test_closing_the_store_kills_a_worker_that_ignores_end_of_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that does not exit when its input closes is killed after CLOSE_TIMEOUT."""
    monkeypatch.setattr(s3_process, "CLOSE_TIMEOUT", 0.3)
    started = trio.current_time()
    async with open_object_store(CFG, command=FAKE) as store:
        assert await store.head_recording("linger") == Missing()
        worker = store._worker
    assert worker is not None and worker.process.returncode == -signal.SIGKILL
    assert trio.current_time() - started < 5


async def test_a_worker_whose_start_outlasts_the_store_is_killed_not_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose worker process is still being spawned (a thread: not cancellable)
    when the store closes answers Transient, and the process it started is killed and
    reaped: it is not handed to the store's closed nursery ("Nursery is closed to new
    arrivals" used to end the cycle's task group)."""
    spawning, release = trio.Event(), trio.Event()
    spawned: list[trio.Process] = []
    real_open_process = trio.lowlevel.open_process

    async def slow_open_process(*args: Any, **kwargs: Any) -> trio.Process:
        spawning.set()
        with trio.CancelScope(shield=True):  # like the real spawn: runs to its end
            await release.wait()
            process = await real_open_process(*args, **kwargs)
        spawned.append(process)
        return process

    monkeypatch.setattr(trio.lowlevel, "open_process", slow_open_process)
    outcomes: list[object] = []
    async with trio.open_nursery() as nursery:
        async with open_object_store(CFG, command=FAKE) as store:

            async def ask() -> None:
                outcomes.append(await store.head_recording("r1"))

            nursery.start_soon(ask)
            await spawning.wait()
        release.set()  # the store is closed: now the spawn completes
    assert outcomes == [Transient("s3_worker_unavailable")]
    (process,) = spawned
    assert process.returncode is not None  # killed and reaped, not left running
    assert store.starts == 0


async def test_worker_exits_cleanly_when_the_store_closes() -> None:
    """The real worker exits 0 on end of input; its settings never show in argv/environ."""
    async with open_object_store(CFG) as store:
        assert await store.head_bucket() == Transient("ConnectError")  # nothing on :9
        worker = store._worker
        assert worker is not None
        pid = worker.process.pid
        visible = (await trio.Path(f"/proc/{pid}/cmdline").read_bytes()
                   + await trio.Path(f"/proc/{pid}/environ").read_bytes())
        assert b"fake-secret-value" not in visible and b"AKIDFAKE" not in visible
    assert worker.process.returncode == 0



async def test_worker_environment_holds_no_daemon_secrets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real worker inherits PATH, locale and TLS settings, but none of the daemon's
    SAFETYNET__* overrides nor cloud credentials (its own come over stdin)."""
    monkeypatch.setenv("SAFETYNET__POSTGRES__DSN", "postgresql://app:env-dsn-pw@db/m?sslmode=verify-full")
    monkeypatch.setenv("SAFETYNET__MEDIA__TOKEN", "env-media-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-aws-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    async with open_object_store(CFG) as store:
        assert await store.head_bucket() == Transient("ConnectError")  # nothing on :9
        worker = store._worker
        assert worker is not None
        raw = await trio.Path(f"/proc/{worker.process.pid}/environ").read_bytes()
    environ = dict(item.split("=", 1) for item in raw.decode().split("\0") if item)
    assert not [name for name in environ if name.startswith(("SAFETYNET", "AWS_"))]
    for secret in ("env-dsn-pw", "env-media-token", "env-aws-secret"):
        assert secret not in raw.decode()
    assert environ["PATH"] == os.environ["PATH"] and environ["LC_ALL"] == "C.UTF-8"
    assert environ["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"

def test_worker_exits_when_the_daemon_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the daemon closes the worker's input; the worker exits on its own."""
    program = textwrap.dedent(f"""
        import sys, trio
        sys.path.insert(0, {str(Path(__file__).parents[3])!r})
        from supervision.config import S3Config
        from supervision.secrets import Secret
        from actors.s3.process import open_object_store
        cfg = S3Config(endpoint_url="http://127.0.0.1:9", access_key_id=Secret("AKID"),
                       secret_access_key=Secret("not-a-secret"))
        async def main():
            async with open_object_store(cfg) as s:
                await s.head_bucket()
                print(s._worker.process.pid, flush=True)
                await trio.sleep(60)
        trio.run(main)
    """)
    daemon = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    try:
        assert daemon.stdout is not None
        worker_pid = int(daemon.stdout.readline())
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait(5)
        wait_until(lambda: not _alive(worker_pid), 5, "the orphaned S3 worker to exit")
    finally:
        daemon.kill()
        daemon.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_worker_process_imports_neither_the_configuration_nor_psycopg() -> None:
    """A worker starts per store and per respawn: it loads pycurl and the line protocol,
    not the daemon's configuration package or psycopg (a third of a second of CPU each)."""
    probe = ("import sys, actors.s3.worker; print(sorted(m for m in sys.modules"
             " if m.split('.')[0] in ('psycopg', 'trio') or m.startswith('supervision.config')))")
    out = subprocess.run([sys.executable, "-P", "-s", "-c", probe], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parents[3]).stdout
    assert out.strip() == "[]"
