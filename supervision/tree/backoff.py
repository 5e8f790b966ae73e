"""One back-off policy for every retry loop: capped exponential growth with full jitter.

    >>> policy = Backoff(base=0.5, cap=30.0)
    >>> 0.0 <= policy.delay(3) <= policy.ceiling(3) == 4.0
    True

The n-th consecutive failure (0-based) waits a time drawn uniformly from
``[0, min(cap, base * factor**n)]`` ("full jitter"): after a PostgreSQL failover every
replica's reconnect lands somewhere in the window instead of all at once. The draw is
tenacity's ``wait_random_exponential`` (the library stamina is built on), not our own math.
Used by the supervisor's restarts, the lock keeper's and the scan leader's reconnects,
the outbox listener's reconnects, the S3 credential chain's retries and the relay's
per-row and per-topic retries. Waits the database schedules itself (a recording's next
attempt, the reaper's poison hold) are SQL.
"""

from __future__ import annotations

import attrs
import tenacity


@attrs.frozen
class Backoff:
    """Capped exponential back-off with full jitter: ``delay(n)`` after the n-th failure."""

    base: float = attrs.field(validator=attrs.validators.gt(0))
    cap: float = attrs.field(validator=attrs.validators.gt(0))
    factor: float = attrs.field(default=2.0, validator=attrs.validators.ge(1))
    _wait: tenacity.wait_random_exponential = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        wait = tenacity.wait_random_exponential(multiplier=self.base, max=self.cap,
                                                exp_base=self.factor)
        object.__setattr__(self, "_wait", wait)

    def ceiling(self, failures: int) -> float:
        """The top of the window after *failures* (0-based) consecutive failures."""
        if failures < 0:
            raise ValueError("failures must be >= 0")
        try:
            return min(self.cap, self.base * self.factor ** failures)
        except OverflowError:
            return self.cap

    def delay(self, failures: int) -> float:
        """A wait drawn uniformly from ``[0, ceiling(failures)]``."""
        if failures < 0:
            raise ValueError("failures must be >= 0")
        state = tenacity.RetryCallState(retry_object=None, fn=None,  # type: ignore[arg-type]
                                        args=(), kwargs={})
        state.attempt_number = failures + 1
        return float(self._wait(state))
