"""Bounded waits on PostgreSQL: the session settings every daemon connection carries, and a
connection class that gives up on a server that stops answering.

>>> dsn = conninfo(cfg.postgres, "safetynet-lock")
>>> conn = connect(dsn, client_deadline(cfg.postgres))   # in a worker thread
>>> conn.execute("SHOW lock_timeout").fetchone()
('5s',)

Every daemon connection (the pool, each lock keeper's, the outbox listener's) is opened
from :func:`conninfo`: the user's DSN merged with

* ``options=-c statement_timeout=… -c lock_timeout=… -c idle_in_transaction_session_timeout=…``
  from ``[postgres]``, and ``-c search_path=pg_catalog,pg_temp`` (:data:`SEARCH_PATH`:
  every query names its schema, so a function or operator another role planted in
  ``public`` is never what a name resolves to; issue #26). The user's own ``options``
  come after ours, so a ``-c`` written in the DSN wins;
* ``connect_timeout`` from ``[postgres]``, and TCP keepalives and ``tcp_user_timeout``
  (:data:`TCP`), so a peer that vanished (a partition, a dead host) is found within
  about 15 s even on an idle connection;
* ``application_name`` (ours: operators find each connection in ``pg_stat_activity``).

A parameter the DSN sets itself (``connect_timeout``, ``keepalives_idle``, …) wins over
ours: the DSN is the operator's last word.

What none of these bound: a backend that is stopped (SIGSTOP, a frozen VM) while its host's
kernel keeps answering TCP. ``statement_timeout`` needs the backend to run, and keepalives
and ``tcp_user_timeout`` are satisfied by the kernel. :class:`BoundedConnection` is the
client-side bound: each round trip (a statement, a COMMIT, a ping) that gets no answer
within :func:`client_deadline` closes the connection and raises
:class:`psycopg.OperationalError`, so the transaction is given up (the server rolls it
back when it runs again) and the caller's thread is freed.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.errors import _WaitTimeout

from supervision.config import PostgresConfig

# Fixed TCP settings (documented in docs/operations.md): the first keepalive after 5 s of
# silence, then every 2 s, dead after 3 unanswered; unacknowledged data for 15 s kills it.
TCP: dict[str, int] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                       "keepalives_count": 3, "tcp_user_timeout": 15_000}


SEARCH_PATH = "pg_catalog,pg_temp"  # pg_temp last: never searched before pg_catalog


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def conninfo(cfg: PostgresConfig, application_name: str) -> str:
    """The DSN of a daemon connection: ``cfg.dsn`` with the session bounds merged in."""
    theirs: dict[str, Any] = conninfo_to_dict(cfg.dsn.reveal())
    bounds = (f"-c statement_timeout={_ms(cfg.statement_timeout)}"
              f" -c lock_timeout={_ms(cfg.lock_timeout)}"
              f" -c idle_in_transaction_session_timeout="
              f"{_ms(cfg.idle_in_transaction_session_timeout)}"
              f" -c search_path={SEARCH_PATH}")
    ours: dict[str, Any] = {**TCP, "connect_timeout": max(2, math.ceil(cfg.connect_timeout))}
    options = " ".join(o for o in (bounds, theirs.pop("options", "")) if o)
    return make_conninfo("", **{**ours, **theirs, "options": options,
                                "application_name": application_name})


def with_defaults(dsn: str, **params: Any) -> str:
    """*dsn* with each of *params* that it does not set itself."""
    return make_conninfo("", **{**params, **conninfo_to_dict(dsn)})


def client_deadline(cfg: PostgresConfig) -> float:
    """How long a round trip may go unanswered before the client gives up (seconds)."""
    return cfg.statement_timeout + min(5.0, cfg.statement_timeout)


class BoundedConnection(psycopg.Connection[Any]):
    """A connection whose every round trip is bounded by :attr:`deadline` seconds."""

    deadline: float | None = None

    def wait(self, gen: PQGen[Any], interval: float = 0.1,
             timeout: float | None = None) -> Any:
        try:
            return super().wait(gen, interval, timeout if timeout is not None else self.deadline)
        except _WaitTimeout:
            if timeout is not None:  # the caller's own bound (notifies): not a failure
                raise
            self.close()  # the server may still run it: this session is unusable
            raise psycopg.OperationalError(
                f"postgres did not answer within {self.deadline:g}s; connection closed"
            ) from None


def bounded_class(deadline: float | None) -> type[psycopg.Connection[Any]]:
    """A :class:`BoundedConnection` subclass with *deadline* (for pools, which take a
    class); plain :class:`psycopg.Connection` when *deadline* is None (unbounded)."""
    if deadline is None:
        return psycopg.Connection
    return type("BoundedConnection", (BoundedConnection,), {"deadline": deadline})


def connect(dsn: str, deadline: float | None, **defaults: Any) -> psycopg.Connection:
    """Open an autocommit connection to *dsn* (with *defaults* for what it leaves unset),
    bounded by *deadline* (blocking: call it from a worker thread)."""
    conn: psycopg.Connection = bounded_class(deadline).connect(
        with_defaults(dsn, **defaults), autocommit=True)
    return conn
