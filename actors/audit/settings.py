"""The auditor's section, ``[audit]``: the auditor actor of ``safetynet run`` and the
bounds of ``safetynet audit``.

>>> AuditConfig().window
900.0

Imports attrs and the runtime's config building blocks only.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from supervision.config.fields import DAY, HOUR, non_negative, positive, setting
from supervision.durations import format_duration


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

    def problems(self, key: str) -> Iterator[str]:
        """What is wrong with the section across its keys (*key*: its dotted key)."""
        if self.window < self.interval + self.grace:
            yield (f"{key}.window: must be >= interval + grace "
                   f"({format_duration(self.interval + self.grace)}), got "
                   f"{format_duration(self.window)}")
