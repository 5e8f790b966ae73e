"""The sections of the jobs: ``[jobs.recording_finalize]``, ``[jobs.conference_reaper]``,
``[outbox_relay]`` and ``[audit]``.

>>> RecordingFinalizeConfig(batch_size=50).lock_ttl
300.0

The jobs run under a lease share one block (:class:`LeasedJob`): ``polling_interval``,
``lock_ttl`` and ``max_run_duration`` are declared once, below, with their docs, bounds
and the rule that binds them (the lease outlives the longest cycle); each job gives only
its defaults, and its TOML keys stay flat (``jobs.recording_finalize.lock_ttl``). These
sections live in the runtime's config package, not in ``actors/<job>/``: the
configuration is loaded and checked (exit 78) before any actor is imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from supervision.config.fields import (
    DAY,
    HOUR,
    MAX_BATCH,
    MINUTE,
    at_least_one,
    fraction,
    non_negative,
    one_of,
    positive,
    setting,
)
from supervision.durations import format_duration

# --------------------------------------------------------------------------- leased jobs


def polling_interval_setting(default: float) -> Any:
    """A leased job's ``polling_interval`` setting, with the job's *default*."""
    return setting(default, "Time between cycle starts.", duration=True, checks=[positive],
                   maximum=HOUR)


def lock_ttl_setting(default: float) -> Any:
    """A leased job's ``lock_ttl`` setting, with the job's *default*."""
    return setting(
        default, "TTL of the job's lease and bound of one cycle; must exceed "
        "max_run_duration. The lease is renewed every lock_ttl/4 while a cycle runs: a "
        "frozen leader is replaced this long after its last renewal (plus one "
        "polling_interval).", duration=True, checks=[positive], maximum=2 * HOUR)


def max_run_duration_setting(default: float) -> Any:
    """A leased job's ``max_run_duration`` setting, with the job's *default*."""
    return setting(default, "A cycle stops claiming after this long.", duration=True,
                   checks=[positive], maximum=HOUR)


class LeasedJob:
    """A job that runs in cycles under a lease (the lock keeper): its section declares
    ``polling_interval = polling_interval_setting(...)``, ``lock_ttl =
    lock_ttl_setting(...)`` and ``max_run_duration = max_run_duration_setting(...)``.
    Adds no field of its own."""

    __slots__ = ()

    polling_interval: float
    lock_ttl: float
    max_run_duration: float

    def lease_problems(self, key: str) -> Iterator[str]:
        """What is wrong with the block as a whole (*key*: the section's dotted key)."""
        if self.lock_ttl <= self.max_run_duration:
            yield (f"{key}.lock_ttl: must be greater than max_run_duration "
                   f"({format_duration(self.max_run_duration)}), got "
                   f"{format_duration(self.lock_ttl)}")


# --------------------------------------------------------------------------- sections


@attrs.frozen
class RecordingFinalizeConfig(LeasedJob):
    enabled: bool = setting(True, "Run the job (RECORDINGS_ENABLED).")
    polling_interval: float = polling_interval_setting(60.0)
    batch_size: int = setting(100, "Rows claimed per batch (exactly). At high `s3.concurrency` "
                               "keep it >= 4 x `s3.concurrency` (two reconciler pools), or "
                               "the claims cannot keep every connection busy.",
                               checks=[positive],
                               maximum=MAX_BATCH)
    max_attempts: int = setting(8, "Attempts before a row is quarantined.", checks=[positive],
                                 maximum=100)
    finalize_sla_timeout: float = setting(
        1800.0, "How long after its session ended a recording is reconciled.", duration=True,
        checks=[non_negative], maximum=7 * DAY,
    )
    backoff_base: float = setting(60.0, "First retry delay.", duration=True, checks=[positive],
                                   maximum=DAY)
    backoff_factor: float = setting(
        2.0, "Growth factor of the retry delay.", checks=[at_least_one], maximum=10.0
    )
    backoff_cap: float = setting(900.0, "Largest retry delay.", duration=True, checks=[positive],
                                  maximum=7 * DAY)
    backoff_jitter: float = setting(
        0.2, "Random +/- fraction applied to each delay.", checks=[fraction], maximum=0.9
    )
    lock_ttl: float = lock_ttl_setting(300.0)
    max_run_duration: float = max_run_duration_setting(180.0)
    redrive_after: float = setting(
        900.0, "Self-healing quarantine: rows quarantined for an object-storage failure "
        "(last_error s3:*) are requeued once S3 has been healthy this long (every cycle's "
        "probe green, its breaker closed, no transient HEAD), batch_size per cycle.",
        duration=True, checks=[non_negative], maximum=7 * DAY,
    )
    redrive_max: int = setting(
        3, "How many times one row is requeued by itself; past it, it waits for "
        "`safetynet requeue`. 0 turns the self-healing off.",
        checks=[non_negative], maximum=100,
    )


@attrs.frozen
class ConferenceReaperConfig(LeasedJob):
    enabled: bool = setting(True, "Run the job (CONFERENCE_CALLS_ENABLED).")
    polling_interval: float = polling_interval_setting(30.0)
    batch_size: int = setting(100, "Conferences claimed per phase and cycle.", checks=[positive],
                               maximum=MAX_BATCH)
    empty_room_grace: float = setting(
        90.0, "An Active room with nobody in it is ended after this long.", duration=True,
        checks=[positive], maximum=DAY,
    )
    provision_timeout: float = setting(
        120.0, "A Provisioning conference fails after this long.", duration=True,
        checks=[positive], maximum=DAY,
    )
    stale_live_timeout: float = setting(
        14400.0, "An Active conference with no activity is ended after this long.",
        duration=True, checks=[positive], maximum=30 * DAY,
    )
    lock_ttl: float = lock_ttl_setting(120.0)
    max_run_duration: float = max_run_duration_setting(30.0)
    poison_backoff_cap: float = setting(
        3600.0, "A poison conference (its outcome cannot be written, or it started after "
        "AsOf) is out of the claim for polling_interval x 2^failures, at most this long.",
        duration=True, checks=[positive], maximum=7 * DAY,
    )


@attrs.frozen
class JobsConfig:
    recording_finalize: RecordingFinalizeConfig = attrs.field(factory=RecordingFinalizeConfig)
    conference_reaper: ConferenceReaperConfig = attrs.field(factory=ConferenceReaperConfig)


@attrs.frozen
class OutboxRelayConfig:
    enabled: bool = setting(True, "Run the Kafka outbox relay.")
    batch_size: int = setting(500, "Outbox rows claimed per batch.", checks=[positive],
                               maximum=MAX_BATCH)
    poll_interval: float = setting(
        1.0, "Fallback poll period; LISTEN/NOTIFY wakes the relay sooner.", duration=True,
        checks=[positive], maximum=5 * MINUTE,
    )
    retention: float = setting(
        604800.0, "Published rows older than this are deleted.", duration=True,
        checks=[positive], maximum=365 * DAY,
    )
    retention_enabled: bool = setting(
        True, "Delete published rows older than retention (through the ix_outbox_published "
        "index); false when the messenger owns its outbox's retention.")
    wakeup: str = setting(
        "notify", "How relays learn of new outbox rows: `notify` (`safetynet migrate` "
        "installs a statement-level NOTIFY trigger on messenger.integration_outbox, polling "
        "stays the fallback) or `poll` (no trigger on the messenger's table: migrate drops "
        "it; rows wait up to poll_interval).", checks=[one_of("notify", "poll")])
    lock_ttl: float = setting(
        60.0, "TTL of the relay's lease (renewed every lock_ttl/4 while a cycle runs; a "
        "frozen leader is replaced this long after its last renewal). A relay cycle runs "
        "at most half of it.", duration=True, checks=[positive], maximum=DAY,
    )
    claim_max_bytes: int = setting(
        16 * 1024 * 1024, "Bytes of outbox rows (payload, headers, key) one claim fetches at "
        "most; a claim stops before the row that would pass it (its first row always comes). "
        "The relay holds about two claims, so its memory stays bounded whatever the rows "
        "hold. A row larger than the producer's max request size (1 MiB) is dead-lettered "
        "without its payload being fetched.", checks=[positive], maximum=1024 * 1024 * 1024,
    )
    dead_letter_retention: float = setting(
        2592000.0, "Dead letters older than this are deleted together with their outbox "
        "row, unless one still blocks later rows of its key (`safetynet replay` puts one "
        "back instead).", duration=True, checks=[positive], maximum=365 * DAY,
    )
    notify_min_interval: float = setting(
        0.05, "Shortest time between two relay wake-ups from NOTIFY safetynet_outbox; "
        "notifications in between are coalesced into one wake-up at its end (any login may "
        "NOTIFY).", duration=True, checks=[non_negative], maximum=MINUTE,
    )


@attrs.frozen
class AuditConfig:
    enabled: bool = setting(True, "Run the auditor actor in `safetynet run` (the SQL-only "
                             "invariants of `safetynet audit`, every interval).")
    interval: float = setting(
        300.0, "Time between the auditor actor's runs.", duration=True, checks=[positive],
        maximum=DAY,
    )
    window: float = setting(
        900.0, "How far back the auditor actor looks at terminal transitions and outbox "
        "rows (`safetynet audit --since` overrides it); at least interval + grace, so every "
        "transition is judged by one run. Never further than outbox_relay.retention: "
        "pruned outbox rows are not violations. A run's cost grows with the rows inside it.",
        duration=True, checks=[positive], maximum=365 * DAY,
    )
    grace: float = setting(
        300.0, "A transition younger than this is not judged yet (an Available recording "
        "is republished within a polling interval).", duration=True,
        checks=[non_negative], maximum=DAY,
    )
    relay_lag: float = setting(
        300.0, "An unpublished outbox row younger than this is not a violation.",
        duration=True, checks=[non_negative], maximum=DAY,
    )
    max_violations: int = setting(
        1000, "Violations reported per invariant and run at most (the gauge saturates here).",
        checks=[positive], maximum=100_000,
    )
    s3_sample: int = setting(
        50, "`safetynet audit`: Failed recordings HEADed at most per run (failed_with_object).",
        checks=[non_negative], maximum=10_000,
    )
    s3_rate: float = setting(
        10.0, "`safetynet audit`: HEAD requests per second at most.", checks=[positive],
        maximum=1000.0,
    )
    kafka_max_messages: int = setting(
        100_000, "`safetynet audit --kafka`: messages read at most; a window holding more "
        "cannot be judged (exit 1).", checks=[positive], maximum=500_000,
    )
    kafka_timeout: float = setting(
        30.0, "`safetynet audit --kafka`: bound of the whole topic read.", duration=True,
        checks=[positive], maximum=HOUR,
    )
    kafka_max_bytes: int = setting(
        256 * 1024 * 1024, "`safetynet audit --kafka`: bytes of messages (keys, values, "
        "headers) read at most; a window holding more cannot be judged (exit 1).",
        checks=[positive], maximum=4 * 1024 * 1024 * 1024,
    )
