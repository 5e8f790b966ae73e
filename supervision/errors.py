"""The exception tree of safetynet: one root, one subclass per concern.

Driver errors (psycopg, httpx, aiokafka) are translated into these at the boundary
that talks to the driver, so callers decide on *kinds* of failure, never on a
driver's class hierarchy. Each class's docstring is its default message.
"""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class SafetynetError(Exception):
    """safetynet failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(SafetynetError):
    """The configuration is invalid."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems) or None)


class MigrationError(SafetynetError):
    """The database schema could not be migrated."""


class InfrastructureError(SafetynetError):
    """A server safetynet depends on (PostgreSQL, S3, Kafka) failed or is unreachable."""


class DatabaseBusy(InfrastructureError):
    """A statement waited ``postgres.lock_timeout`` for a row another session holds and
    gave up; its transaction rolled back and its work is tried again in a later cycle."""


class LeaseLost(SafetynetError):
    """This process's lease on the job is no longer the live term (another daemon took it
    over): the fenced transaction rolled back, and the cycle steps down."""


class ConfigurationFault(SafetynetError):
    """A dependency is misconfigured (missing bucket, access denied, unknown topic);
    retrying will not help until the configuration is fixed."""


class WireError(SafetynetError):
    """A line on the S3 worker pipe could not be understood."""


def describe(exc: BaseException | None) -> str:
    """``"<class>: <first line of its message>"``: what a log line or an exit message says
    about an error (libpq's first line names the cause, e.g. ``SSL error: certificate
    verify failed``; never a password: libpq does not quote it). A group describes its
    first leaf; no error at all is a child that "exited normally"."""
    if exc is None:
        return "exited normally"
    if isinstance(exc, BaseExceptionGroup):
        exc = first_leaf(exc, BaseException)
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def leaves(exc: BaseException) -> list[BaseException]:
    """Every non-group exception inside *exc*, depth first (*exc* itself if not a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def first_leaf(group: BaseExceptionGroup[E], kind: type[E]) -> E:
    """The first exception of *kind* in a (possibly nested) group, as ``except*`` caught it:
    the one way the house takes an error out of a group."""
    return next(leaf for leaf in leaves(group) if isinstance(leaf, kind))
