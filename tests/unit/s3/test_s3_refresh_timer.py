"""The S3 credential refresh timer on trio's MockClock.

Temporary keys (botocore's ``RefreshableCredentials``) expire an hour after the worker
starts; the object store asks its :class:`~actors.s3.credentials.CredentialSource` every
``REFRESH_INTERVAL`` (60 s) and hands changed keys to the worker over its pipe. botocore
renews them once fewer than 15 minutes are left (advisory: a failure then is swallowed and
the old keys still serve), and must within the last 10 (mandatory: a failure raises). The
keys' clock (botocore's ``time_fetcher``) is the mock clock, so an hour passes in an
instant, and every tick is where the timer puts it. The worker is the stand-in of
``tests/fake_s3_worker.py``, which says which key it signs with (``whoami``); the clock only
jumps while no request waits on the process (autojump is switched off around a request).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.credentials
import pytest
import trio
import trio.testing

from actors.s3.credentials import BACKOFF, CredentialSource, CredentialsUnavailable
from actors.s3.objectstore import Transient
from actors.s3.process import REFRESH_INTERVAL, WorkerObjectStore, open_object_store
from supervision.config import S3Config
from tests.unit.s3.test_s3_process import CFG, FAKE

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the keys' wall clock at mock time 0
LIFETIME = 3600.0  # seconds the first keys live
ADVISORY = 15 * 60.0  # botocore renews once fewer than this many seconds are left
MANDATORY = 10 * 60.0  # ... and must within the last 10 minutes
REAL_LIMIT = 20.0  # real seconds a wait may take before the test fails


def wall(clock: trio.testing.MockClock) -> datetime:
    return EPOCH + timedelta(seconds=clock.current_time())


class Keys:
    """The role's key issuer: records when it is asked and fails while told to."""

    def __init__(self, clock: trio.testing.MockClock, fail: Callable[[float], bool]) -> None:
        self.clock = clock
        self.fail = fail
        self.asked: list[float] = []
        self.issued = 1
        self.asked_event = trio.Event()
        self.token = trio.lowlevel.current_trio_token()

    def refresh(self) -> dict[str, str]:  # botocore calls it in the store's worker thread
        now = self.clock.current_time()
        self.asked.append(now)
        self.token.run_sync_soon(self.asked_event.set)
        if self.fail(now):
            raise ConnectionError("the role's credentials endpoint is down")
        self.issued += 1
        return self.metadata(now + LIFETIME)

    def metadata(self, expires_at: float) -> dict[str, str]:
        return {"access_key": f"ASIAKEY{self.issued}", "secret_key": f"secret-{self.issued}",
                "token": f"token-{self.issued}",
                "expiry_time": (EPOCH + timedelta(seconds=expires_at)).isoformat()}

    def credentials(self) -> botocore.credentials.RefreshableCredentials:
        return botocore.credentials.RefreshableCredentials(
            **{k: v for k, v in self.metadata(LIFETIME).items() if k != "expiry_time"},
            expiry_time=EPOCH + timedelta(seconds=LIFETIME), refresh_using=self.refresh,
            method="test-role", time_fetcher=lambda: wall(self.clock))

    async def until_asked(self, times: int) -> None:
        """Let the clock run (autojump) until the issuer was asked *times* times; then
        stop it."""
        self.clock.autojump_threshold = 0
        with trio.CancelScope() as limit:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_after_real_seconds, REAL_LIMIT, limit)
                while len(self.asked) < times:
                    self.asked_event = trio.Event()
                    await self.asked_event.wait()
                nursery.cancel_scope.cancel()
        self.clock.autojump_threshold = math.inf
        assert not limit.cancelled_caught, f"asked {len(self.asked)} times, not {times}"


async def _cancel_after_real_seconds(seconds: float, scope: trio.CancelScope) -> None:
    """A bound in real time that sets no deadline on the mock clock (one would be a point
    the autojump could leap to while a worker thread runs)."""
    await trio.to_thread.run_sync(time.sleep, seconds, abandon_on_cancel=True)
    scope.cancel()


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait, the mock clock standing still, for what a worker thread or the worker process
    does in real time."""
    deadline = time.monotonic() + REAL_LIMIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await trio.lowlevel.checkpoint()


async def signer(store: WorkerObjectStore) -> str:
    """The key the worker signs with now (asked with the clock standing still)."""
    outcome = await store.head_recording("whoami")
    assert isinstance(outcome, Transient) and outcome.error.startswith("signed_by:"), outcome
    return outcome.error.removeprefix("signed_by:")


def events(buffer: io.StringIO, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in buffer.getvalue().splitlines() if line.strip())
    return [e for e in lines if e.get("event") == name]


def ticks_from(start: float, end: float) -> list[float]:
    """The timer's ticks (every REFRESH_INTERVAL since the worker started at 0) in
    ``[start, end]``."""
    first = math.ceil(start / REFRESH_INTERVAL)
    return [n * REFRESH_INTERVAL for n in range(first, int(end // REFRESH_INTERVAL) + 1)]


async def test_temporary_keys_are_renewed_at_the_first_tick_inside_the_advisory_window(
        mock_clock: trio.testing.MockClock) -> None:
    """Keys valid for an hour: nobody asks for new ones during the first 45 minutes; the
    first tick with fewer than 15 minutes left (46 min) asks once, and from then on the
    worker signs with the new keys (handed over its pipe, no restart)."""
    keys = Keys(mock_clock, fail=lambda _now: False)
    source = CredentialSource(CFG, resolver=lambda _cfg: keys.credentials(),
                              clock=mock_clock.current_time)
    async with open_object_store(CFG, command=FAKE, credentials=source) as store:
        assert await signer(store) == "ASIAKEY1"
        await keys.until_asked(1)
        first_tick_inside = ticks_from(LIFETIME - ADVISORY + 1e-9, LIFETIME)[0]
        assert keys.asked == [first_tick_inside] == [46 * 60.0]
        await until(lambda: store.credential_updates == 1, "the new keys sent")
        assert await signer(store) == "ASIAKEY2"
        assert (store.credential_updates, store.starts) == (1, 1)
        # the new keys live an hour from their issue: the next renewal is 46 minutes on
        await keys.until_asked(2)
        assert keys.asked[1] == first_tick_inside + 46 * 60.0


async def test_a_failed_renewal_is_retried_at_every_tick_until_it_succeeds(
        mock_clock: trio.testing.MockClock, no_secrets_in_logs: io.StringIO) -> None:
    """The issuer down from 46 minutes on: every tick asks again (botocore swallows the
    advisory failures, the old keys still sign); the first tick inside the last ten
    minutes fails loudly (s3_credentials_refresh_failed) and the next one, the issuer back,
    renews the keys before they expire — the worker never signs with expired keys."""
    recovered_at = LIFETIME - MANDATORY + REFRESH_INTERVAL + 1  # after one mandatory failure
    keys = Keys(mock_clock, fail=lambda now: now < recovered_at)
    source = CredentialSource(CFG, resolver=lambda _cfg: keys.credentials(),
                              clock=mock_clock.current_time)
    async with open_object_store(CFG, command=FAKE, credentials=source) as store:
        assert await signer(store) == "ASIAKEY1"
        expected = ticks_from(LIFETIME - ADVISORY + 1e-9, recovered_at + REFRESH_INTERVAL)
        await keys.until_asked(len(expected))
        assert keys.asked == expected
        assert expected == [m * 60.0 for m in (46, 47, 48, 49, 50, 51, 52)]
        await until(lambda: store.credential_updates == 1, "the new keys sent")
        assert await signer(store) == "ASIAKEY2"
        assert mock_clock.current_time() < LIFETIME  # renewed before the old keys expired
        assert store.credential_updates == 1
    (failed,) = events(no_secrets_in_logs, "s3_credentials_refresh_failed")
    assert failed["error"] == "credentials_unavailable:ConnectionError"
    assert len(events(no_secrets_in_logs, "s3_credentials_refreshed")) == 1


def test_a_failed_resolution_waits_the_houses_back_off_before_asking_again() -> None:
    """After the n-th consecutive failure the chain is not asked again before a wait drawn
    by supervision.tree.backoff (full jitter under BACKOFF.ceiling(n)); the waits of many
    sources spread over that window rather than all landing on its end."""
    waits: list[list[float]] = []
    for _ in range(40):
        now = [0.0]
        asked: list[float] = []

        def resolver(_cfg: S3Config, asked: list[float] = asked,
                     now: list[float] = now) -> Any:
            asked.append(now[0])
            raise ConnectionError("sts down")

        source = CredentialSource(S3Config(), resolver=resolver, clock=lambda now=now: now[0])
        while len(asked) < 4:
            with pytest.raises(CredentialsUnavailable):
                source.current()
            now[0] = round(now[0] + 0.01, 2)  # a HEAD every 10 ms asks the source
        waits.append([b - a for a, b in itertools.pairwise(asked)])
    for failures in range(3):
        gaps = [w[failures] for w in waits]
        assert max(gaps) <= BACKOFF.ceiling(failures) + 0.011
        assert min(gaps) < BACKOFF.ceiling(failures) / 2 < max(gaps)  # spread, not fixed
