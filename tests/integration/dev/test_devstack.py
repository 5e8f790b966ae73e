"""The real-server dev stack: each server works, is locked down, restarts, and never leaks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import DEV_SCRAM_ITERATIONS, PostgresServer
from supervision.dev.processes import DevStackError, start_all
from supervision.dev.s3 import S3Server
from supervision.dev.stack import open_dev_stack

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_postgres_accepts_queries_on_its_dsn(pg_server: PostgresServer) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS devstack_probe (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO devstack_probe VALUES (1, 'a') ON CONFLICT (id) DO NOTHING")
        assert conn.execute("SELECT v FROM devstack_probe WHERE id = 1").fetchone() == ("a",)
        version = conn.execute("SHOW server_version_num").fetchone()
        assert version is not None and int(version[0]) >= 180000
        conn.execute("CREATE DATABASE devstack_other")
    with psycopg.connect(pg_server.dsn_for("devstack_other")) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("devstack_other",)


def test_postgres_keeps_its_shared_memory_segments_in_its_data_directory(
        pg_server: PostgresServer) -> None:
    """Dynamic shared memory as files under the data directory (its control segment is
    there from the start), so a server killed outright leaves nothing in /dev/shm once
    its directory is removed."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        assert conn.execute("SHOW dynamic_shared_memory_type").fetchone() == ("mmap",)
        segments = [name for (name,) in conn.execute("SELECT pg_ls_dir('pg_dynshmem')")]
    assert any(name.startswith("mmap.") for name in segments), segments


def test_postgres_rejects_a_wrong_password(pg_server: PostgresServer) -> None:
    bad = pg_server.dsn.replace(pg_server.password, "wrong")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(bad, connect_timeout=5).close()


def test_postgres_authenticates_tcp_with_cheap_scram_hashes(pg_server: PostgresServer) -> None:
    """TCP clients authenticate with SCRAM only (every host line of pg_hba), and the
    superuser's and a new role's passwords are SCRAM hashes at the dev stack's iteration
    count (a test suite opens thousands of connections), with which a login works."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS devstack_scram_probe")
        conn.execute("CREATE ROLE devstack_scram_probe LOGIN PASSWORD 'probe-password'")
        hashes = dict(conn.execute(
            "SELECT rolname, rolpassword FROM pg_authid"
            " WHERE rolname IN ('postgres', 'devstack_scram_probe')").fetchall())
        methods = conn.execute("SELECT DISTINCT auth_method FROM pg_hba_file_rules"
                               " WHERE type = 'host'").fetchall()
    assert methods == [("scram-sha-256",)]
    prefix = f"SCRAM-SHA-256${DEV_SCRAM_ITERATIONS}:"
    assert {name: value.startswith(prefix) for name, value in hashes.items()} == {
        "postgres": True, "devstack_scram_probe": True}
    probe = pg_server.dsn.replace("postgres:" + pg_server.password, "devstack_scram_probe:"
                                  "probe-password")
    with psycopg.connect(probe, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("devstack_scram_probe",)


async def _round_trip(bootstrap: str, topic: str, partition: int = 0) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, f"msg-{i}".encode(), partition=partition)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, partition)])
        got: list[bytes] = []
        while len(got) < 3:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 15)
            got += [record.value for records in batch.values() for record in records]
        return got
    finally:
        await consumer.stop()


def test_tansu_round_trips_produce_and_consume_on_an_auto_created_topic(
    kafka_server: KafkaServer,
) -> None:
    got = asyncio.run(_round_trip(kafka_server.bootstrap_servers, "devstack-auto"))
    assert got == [b"msg-0", b"msg-1", b"msg-2"]


def test_tansu_create_topic_makes_the_requested_partitions(kafka_server: KafkaServer) -> None:
    kafka_server.create_topic("devstack-created", partitions=3)

    async def partitions() -> set[int] | None:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_server.bootstrap_servers)
        await consumer.start()
        try:
            assert "devstack-created" in await consumer.topics()
            result: set[int] | None = consumer.partitions_for_topic("devstack-created")
            return result
        finally:
            await consumer.stop()

    assert asyncio.run(partitions()) == {0, 1, 2}
    got = asyncio.run(_round_trip(kafka_server.bootstrap_servers, "devstack-created", 2))
    assert got == [b"msg-0", b"msg-1", b"msg-2"]


def test_s3_rejects_unsigned_and_wrongly_signed_requests(s3_server: S3Server) -> None:
    s3_server.create_bucket("devstack-locked")
    url = s3_server.endpoint_url
    assert httpx.get(f"{url}/").status_code == 403
    assert httpx.put(f"{url}/devstack-locked/anon.txt", content=b"x").status_code == 403
    assert httpx.get(f"{url}/devstack-locked/anon.txt").status_code == 403
    from httpx_auth import AWS4Auth

    wrong = AWS4Auth(s3_server.credentials.access_key_id, "not-the-secret", "us-east-1", "s3")
    assert httpx.get(f"{url}/", auth=wrong).status_code == 403


def test_s3_signed_put_then_head_returns_content_type_and_metadata(s3_server: S3Server) -> None:
    s3_server.create_bucket("devstack-media")
    s3_server.put_object("devstack-media", "rec/2024/a b.ogg", b"OggS" + b"\0" * 100,
                         "audio/ogg", {"duration-seconds": "12.5"})
    headers = s3_server.head_object("devstack-media", "rec/2024/a b.ogg")
    assert headers["content-type"] == "audio/ogg"
    assert headers["x-amz-meta-duration-seconds"] == "12.5"
    assert headers["content-length"] == "104"
    with pytest.raises(DevStackError, match="404"):
        s3_server.head_object("devstack-media", "missing")


def test_restart_keeps_ports_and_data_and_serves_again(own_stack_dir: Path) -> None:
    with open_dev_stack(own_stack_dir) as stack:
        assert stack.postgres and stack.kafka and stack.s3
        before = stack.endpoints()
        pids = (stack.postgres.pid, stack.kafka.pid, stack.s3.pid)
        with psycopg.connect(stack.postgres.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE survives (x int)")
        stack.s3.create_bucket("keep")
        stack.s3.put_object("keep", "k", b"data", None, {})

        for server in (stack.postgres, stack.kafka, stack.s3):
            server.restart()

        assert stack.endpoints() == before
        assert None not in (stack.postgres.pid, stack.kafka.pid, stack.s3.pid)
        assert set(pids).isdisjoint({stack.postgres.pid, stack.kafka.pid, stack.s3.pid})
        with psycopg.connect(stack.postgres.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM survives").fetchone() == (0,)
        assert asyncio.run(_round_trip(stack.kafka.bootstrap_servers, "after-restart")) == [
            b"msg-0", b"msg-1", b"msg-2"]
        assert stack.s3.head_object("keep", "k")["content-length"] == "4"
    assert (stack.postgres.pid, stack.kafka.pid, stack.s3.pid) == (None, None, None)


def test_s3_starts_on_fresh_ports_when_one_it_picked_was_taken_meanwhile(
        tmp_path: Path) -> None:
    """Another process binds the filer's port between the pick and weed's start (the
    kernel hands the same range to outgoing connections): weed refuses to start, and the
    server starts again on freshly picked ports, keeping the S3 port its callers know."""
    s3 = S3Server(tmp_path)
    s3_port, filer_port = s3.ports["s3.port"], s3.ports["filer.port"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", filer_port))
        squatter.listen()
        try:
            s3.start()
            assert s3.ports["s3.port"] == s3_port
            assert s3.ports["filer.port"] != filer_port
            s3.create_bucket("fresh")
            assert "Port allocation failed" in (tmp_path / "s3.log").read_text()
        finally:
            s3.stop()


def test_start_failure_raises_devstack_error_with_log_tail_and_stops_the_others(
    own_stack_dir: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: probes are refused at once
        postgres = PostgresServer(own_stack_dir, port=taken.getsockname()[1])
        kafka = KafkaServer(own_stack_dir)
        with pytest.raises(DevStackError, match=r"(?s)postgres exited.*could not bind"):
            start_all([postgres, kafka])
    assert (postgres.pid, kafka.pid) == (None, None)


_CHILD = """
import json, signal, sys
from pathlib import Path
from supervision.dev.stack import open_dev_stack
# Ctrl-C as at a terminal, whatever this process inherited: a command started with `&`
# by a non-interactive shell (a CI runner, nohup) ignores SIGINT, and so would we
signal.signal(signal.SIGINT, signal.default_int_handler)
with open_dev_stack(Path(sys.argv[1])) as stack:
    print(json.dumps([s.pid for s in (stack.postgres, stack.kafka, stack.s3)]), flush=True)
    sys.stdin.readline()  # parent: newline = leave normally; or SIGINT / SIGKILL us here
"""


def _survivors(pids: set[int], base_dir: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] in pids or str(base_dir) in cmdline:
            found.append(f"{proc.info['pid']}: {cmdline}")
    return found


@pytest.mark.parametrize("ending", ["exit", "sigint", "sigkill"])
def test_no_server_process_survives_the_owning_python_process(
    own_stack_dir: Path, ending: str
) -> None:
    base_dir = own_stack_dir / "stack"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(base_dir), ending],
                             cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        server_pids = json.loads(child.stdout.readline())
        assert len(server_pids) == 3 and all(server_pids)
        descendants = {p.pid for p in psutil.Process(child.pid).children(recursive=True)}
        assert set(server_pids) <= descendants
        assert len(descendants) > 3  # postgres' own children are tracked too
        if ending == "exit":
            child.communicate("\n", timeout=30)
        elif ending == "sigint":
            child.send_signal(signal.SIGINT)
        elif ending == "sigkill":
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if ending == "sigkill":  # no Python cleanup ran: PR_SET_PDEATHSIG alone must do it
        deadline = time.monotonic() + 10
        while _survivors(descendants, base_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
    else:  # the context manager stopped everything before the interpreter exited
        assert child.returncode == (0 if ending == "exit" else -signal.SIGINT)
    assert _survivors(descendants, base_dir) == []
