"""conference-reaper's section, ``[jobs.conference_reaper]``.

>>> ConferenceReaperConfig().stale_live_timeout
14400.0

A job run in cycles under a lease: its ``polling_interval``, ``lock_ttl`` and
``max_run_duration`` are the shared block (:class:`~supervision.config.LeasedJob`), given
here only their defaults. Imports attrs and the runtime's config building blocks only.
"""

from __future__ import annotations

import attrs

from supervision.config.fields import DAY, MAX_BATCH, positive, setting
from supervision.config.leased import (
    LeasedJob,
    lock_ttl_setting,
    max_run_duration_setting,
    polling_interval_setting,
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
