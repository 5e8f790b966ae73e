"""recording-finalize's section, ``[jobs.recording_finalize]``.

>>> RecordingFinalizeConfig(batch_size=50).lock_ttl
300.0

A job run in cycles under a lease: its ``polling_interval``, ``lock_ttl`` and
``max_run_duration`` are the shared block (:class:`~supervision.config.LeasedJob`), given
here only their defaults. Imports attrs and the runtime's config building blocks only, so
the configuration is loaded and checked (exit 78) without importing the job's actors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import ClassVar

import attrs

from supervision.config.fields import (
    DAY,
    MAX_BATCH,
    at_least_one,
    fraction,
    non_negative,
    positive,
    setting,
)
from supervision.config.leased import (
    LeasedJob,
    lock_ttl_setting,
    max_run_duration_setting,
    polling_interval_setting,
)
from supervision.durations import format_duration


@attrs.frozen
class RecordingFinalizeConfig(LeasedJob):
    # settings that existed once: refused (exit 78) with what replaced them, not "unknown"
    removed_keys: ClassVar[Mapping[str, str]] = {
        "max_failed_per_cycle":
            "removed: Missing verdicts now need evidence instead of a per-cycle cap"
            " (docs/architecture.md); delete this line",
    }

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

    def problems(self, key: str) -> Iterator[str]:
        """What is wrong with the section across its keys (*key*: its dotted key)."""
        if self.backoff_cap < self.backoff_base:
            yield (f"{key}.backoff_cap: must be >= backoff_base "
                   f"({format_duration(self.backoff_base)}), got "
                   f"{format_duration(self.backoff_cap)}")
