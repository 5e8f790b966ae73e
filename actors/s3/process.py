"""The daemon's object store: HEADs answered by the S3 worker process.

>>> async with open_object_store(cfg.s3) as store:
...     outcome = await store.head_recording(recording_id)   # Found | Missing | Transient | ...

:class:`WorkerObjectStore` has the interface of
:class:`~actors.s3.objectstore.HttpObjectStore` (and the same outcomes: the worker runs
exactly that client), but each request is a JSON line to ``python -m
actors.s3.worker`` and the answer a line back. Signing and HTTP then burn another
core's CPU instead of the GIL the committers and the claimer need (issue #4: the mixed
drain went from ~0.55 to ~0.8+ of the S3 ceiling).

The worker is started on the first request, with its settings and credentials written to
its stdin. The credentials come from :class:`~actors.s3.credentials.CredentialSource`
(static keys, else botocore's chain), fetched in a thread before the start; when they
are temporary, every :data:`REFRESH_INTERVAL` the source is asked again (botocore renews
them 15 minutes before they expire) and changed keys go to the running worker as one
more line on its stdin — it is not restarted, and requests queued after the line are
signed with the new keys. A failure to get credentials answers the requests with its
outcome: a :class:`Fault` (a configuration fault: unknown profile, STS refusing the role)
or, when the source may recover, ``Transient(NOT_SENT)``.

If the worker dies, every request in flight answers ``Transient("s3_worker_exited")`` —
the rows keep their attempt and are retried after their back-off, and the breaker stops
the cycle if it keeps happening — and the next request starts a new one (at most one
start per :data:`RESPAWN_INTERVAL`, and none within that interval of a death, however long
the dead one ran; in between, requests answer ``Transient(NOT_SENT)``, which the reconciler
treats as not attempted). A request with no answer after
``3 * s3.timeout + 5 s`` answers ``Transient("s3_worker_timeout")`` (checked by one timer
per worker generation, not a cancel scope per request).

The worker's environment is filtered (:func:`worker_environment`): it gets what Python,
locale and libcurl need, never the daemon's ``SAFETYNET__*`` overrides (the DSN, keys,
tokens) nor cloud credentials — its own credentials come over stdin.

What cancellation does: a cancelled request forgets its id; the late answer is dropped.
Leaving the context closes the worker's stdin (it exits on end of input), waits up to
:data:`CLOSE_TIMEOUT` for it, then kills it. The worker runs in its own session, so a
terminal's Ctrl-C reaches only the daemon, which then shuts down in order; if the daemon
is killed outright, the worker sees end of input and exits.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import structlog
import trio

from actors.s3.credentials import CredentialSource, CredentialsUnavailable
from actors.s3.metrics import S3_WORKER_STARTS
from actors.s3.objectstore import Fault, Found, HeadOutcome, Missing, Transient
from actors.s3.wire import (
    OP_BUCKET,
    OP_CANARY,
    OP_LIST,
    OP_OBJECT,
    Credentials,
    LineSplitter,
    decode_answer,
    encode_credentials,
    encode_request,
    encode_settings,
)
from supervision.config import S3Config
from supervision.errors import WireError, first_leaf

log = structlog.get_logger("s3_worker")

# -P: the working directory is not put on sys.path (a planted pycurl.py there would be
# imported by the process that holds the S3 keys); -s: no user site-packages either; and
# the worker runs in WORKER_CWD, so a relative PYTHONPATH entry cannot point at it
WORKER_COMMAND = (sys.executable, "-P", "-s", "-m", "actors.s3.worker")
WORKER_CWD = "/"
# The answer when no worker runs: nothing was sent, so the row was not attempted.
NOT_SENT = "s3_worker_unavailable"
RESPAWN_INTERVAL = 1.0
CLOSE_TIMEOUT = 3.0
REFRESH_INTERVAL = 60.0  # seconds between asks for renewed temporary credentials
_READ_SIZE = 64 * 1024
# what the worker may inherit: Python, locale, temp files, TLS trust and libcurl's
# proxy settings (a proxy the daemon reaches S3 through is the worker's proxy too)
WORKER_ENV_NAMES = frozenset({
    "PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "CURL_CA_BUNDLE",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
})
WORKER_ENV_PREFIXES = ("LC_", "SSL_CERT_")


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of *environ* the S3 worker gets: an allow-list, so a secret added to the
    daemon's environment later is not passed on by default."""
    return {name: value for name, value in environ.items()
            if name in WORKER_ENV_NAMES or name.startswith(WORKER_ENV_PREFIXES)}


@attrs.define(eq=False)
class _Waiter:
    deadline: float  # trio time after which it answers s3_worker_timeout
    done: trio.Event = attrs.Factory(trio.Event)
    outcome: HeadOutcome | None = None

    def resolve(self, outcome: HeadOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.done.set()


@attrs.define(eq=False)
class _Worker:
    """One generation of the worker process and the requests waiting on it."""

    process: trio.Process
    requests: trio.MemorySendChannel[bytes]
    credentials: Credentials | None  # the keys it signs with
    waiting: dict[int, _Waiter] = attrs.Factory(dict)
    exited: trio.Event = attrs.Factory(trio.Event)
    busy: trio.Event = attrs.Factory(trio.Event)  # set when a request starts waiting
    alive: bool = True

    def lost(self, reason: str) -> None:
        self.alive = False
        self.requests.close()
        waiting, self.waiting = self.waiting, {}
        for waiter in waiting.values():
            waiter.resolve(Transient(reason))


class WorkerObjectStore:
    """Signed HEADs against the CALL_RECORDINGS bucket, made by the S3 worker process."""

    def __init__(self, cfg: S3Config, nursery: trio.Nursery, *,
                 command: tuple[str, ...] = WORKER_COMMAND,
                 respawn_interval: float = RESPAWN_INTERVAL,
                 credentials: CredentialSource | None = None,
                 refresh_interval: float = REFRESH_INTERVAL) -> None:
        self._cfg = cfg
        self._credentials = credentials or CredentialSource(cfg)
        self._credentials_limiter = trio.CapacityLimiter(1)
        self._refresh_interval = refresh_interval
        self._refreshing = False
        self._unavailable: Fault | None = None  # credentials that cannot be had
        self._nursery = nursery
        self._command = command
        self._respawn_interval = respawn_interval
        self._ids = itertools.count(1)
        self._worker: _Worker | None = None
        self._starting = trio.Lock()
        self._last_change = -math.inf  # the last start or loss of a generation
        self._closing = False
        self.starts = 0
        self.credential_updates = 0
        self.answer_timeout = 3 * cfg.timeout + 5

    async def head_bucket(self) -> Found | Transient | Fault:
        outcome = await self._request(OP_BUCKET, "")
        assert isinstance(outcome, Found | Transient | Fault)
        return outcome

    async def head_canary(self) -> Found | Transient | Fault:
        outcome = await self._request(OP_CANARY, "")
        assert isinstance(outcome, Found | Transient | Fault)
        return outcome

    async def probe(self) -> Found | Transient | Fault:
        """The cycle's health check: the bucket, then the object path."""
        bucket = await self.head_bucket()
        if not isinstance(bucket, Found):
            return bucket
        return await self.head_canary()

    async def head_recording(self, recording_id: str) -> HeadOutcome:
        return await self._request(OP_OBJECT, recording_id)

    async def list_recordings(self) -> Found | Missing | Transient | Fault:
        """ListObjectsV2 under the prefix: Found when a recording-named key is there."""
        outcome = await self._request(OP_LIST, "")
        assert isinstance(outcome, Found | Missing | Transient | Fault)
        return outcome

    async def _request(self, op: str, recording_id: str) -> HeadOutcome:
        worker = self._worker
        if worker is None or not worker.alive:  # the lock only to start one
            worker = await self._running_worker()
            if worker is None:
                return self._unavailable or Transient(NOT_SENT)
        request_id = next(self._ids)
        waiter = worker.waiting[request_id] = _Waiter(
            trio.current_time() + self.answer_timeout)
        worker.busy.set()
        try:
            worker.requests.send_nowait(encode_request(request_id, op, recording_id))
            await waiter.done.wait()  # answered, lost, or expired by _expire_unanswered
            return waiter.outcome or Transient("s3_worker_timeout")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return Transient("s3_worker_exited")
        finally:
            worker.waiting.pop(request_id, None)

    async def _running_worker(self) -> _Worker | None:
        async with self._starting:
            if self._worker is not None and self._worker.alive:
                return self._worker
            if (self._closing
                    or trio.current_time() - self._last_change < self._respawn_interval):
                return None
            self._last_change = trio.current_time()
            try:
                credentials = await self._current_credentials()
            except CredentialsUnavailable as exc:
                if not exc.repeated:  # once per try of the chain, not per HEAD
                    log.error("s3_credentials_unavailable", error=exc.outcome.error)
                self._unavailable = exc.outcome if isinstance(exc.outcome, Fault) else None
                return None
            self._unavailable = None
            try:
                self._worker = await self._start(credentials)
            except OSError as exc:
                log.error("s3_worker_start_failed", error=type(exc).__name__)
                return None
            return self._worker  # None: the store closed while the process started

    async def _current_credentials(self) -> Credentials | None:
        return await trio.to_thread.run_sync(
            self._credentials.current, limiter=self._credentials_limiter,
            abandon_on_cancel=True)

    async def _start(self, credentials: Credentials | None) -> _Worker | None:
        process = await trio.lowlevel.open_process(
            list(self._command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            start_new_session=True, env=worker_environment(os.environ), cwd=WORKER_CWD)
        if self._closing:  # closed during the spawn (a thread): no nursery left to serve it
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
            return None
        requests_send, requests_recv = trio.open_memory_channel[bytes](math.inf)
        requests_send.send_nowait(encode_settings(self._cfg, credentials))
        worker = _Worker(process, requests_send, credentials)
        self.starts += 1
        S3_WORKER_STARTS.inc()
        if self.starts > 1:
            log.warning("s3_worker_restarted", starts=self.starts)
        self._nursery.start_soon(self._serve, worker, requests_recv)
        if self._credentials.refreshable and not self._refreshing:
            self._refreshing = True
            self._nursery.start_soon(self._serve_refresh)
        return worker

    async def _serve_refresh(self) -> None:
        """Every refresh interval, hand renewed credentials to the running worker."""
        while not self._closing:
            await trio.sleep(self._refresh_interval)
            await self.refresh_credentials()

    async def refresh_credentials(self) -> bool:
        """Ask the source for the current keys; send them to the running worker if they
        changed. True when new keys were sent. A failure is logged and the worker keeps
        the keys it has (botocore tries again on the next ask)."""
        try:
            credentials = await self._current_credentials()
        except CredentialsUnavailable as exc:
            log.warning("s3_credentials_refresh_failed", error=exc.outcome.error)
            return False
        worker = self._worker
        if (credentials is None or worker is None or not worker.alive
                or credentials == worker.credentials):
            return False
        try:
            worker.requests.send_nowait(encode_credentials(credentials))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False  # it is going away; the next one starts with the current keys
        worker.credentials = credentials
        self.credential_updates += 1
        log.info("s3_credentials_refreshed", updates=self.credential_updates)
        return True

    async def _serve(self, worker: _Worker,
                     requests: trio.MemoryReceiveChannel[bytes]) -> None:
        """Pump one generation's pipes; when either side ends, fail what is waiting and
        make sure the process is gone."""
        reason = "s3_worker_exited"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_write_requests, worker.process, requests)
                nursery.start_soon(self._expire_unanswered, worker)
                await _read_answers(worker)
                nursery.cancel_scope.cancel()
        except* (WireError, trio.BrokenResourceError, OSError) as group:
            reason = "s3_worker_broken"
            exc = first_leaf(group, Exception)
            log.error("s3_worker_failed", error=str(exc) or type(exc).__name__)
        finally:
            self._last_change = trio.current_time()
            worker.lost(reason)
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await worker.process.wait()
            if worker.process.returncode is None:
                worker.process.kill()
                with trio.CancelScope(shield=True):
                    await worker.process.wait()
            if worker.process.returncode and not self._closing:
                log.warning("s3_worker_exited", returncode=worker.process.returncode)
            worker.exited.set()

    async def _expire_unanswered(self, worker: _Worker) -> None:
        """Answer ``s3_worker_timeout`` for requests past their deadline: one timer for
        the generation instead of a cancel scope per request (a quarter of
        ``answer_timeout`` late at most); asleep while nothing waits."""
        while True:
            if not worker.waiting:
                worker.busy = trio.Event()
                await worker.busy.wait()
            await trio.sleep(self.answer_timeout / 4)
            now = trio.current_time()
            for waiter in list(worker.waiting.values()):
                if waiter.deadline <= now:
                    waiter.resolve(Transient("s3_worker_timeout"))

    async def aclose(self) -> None:
        """Close the worker's input and wait for it to exit (kill it after the timeout)."""
        self._closing = True
        worker = self._worker
        if worker is not None and worker.alive:
            worker.requests.close()
        if worker is not None:
            with trio.move_on_after(CLOSE_TIMEOUT + 1, shield=True):
                await worker.exited.wait()


async def _write_requests(process: trio.Process,
                          requests: trio.MemoryReceiveChannel[bytes]) -> None:
    """One write per wake-up: every request queued since the last one. Closing the
    channel closes the worker's stdin, which is how it is told to exit."""
    assert process.stdin is not None
    async with process.stdin:
        async for first in requests:
            chunk = [first]
            while True:
                try:
                    chunk.append(requests.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await process.stdin.send_all(b"".join(chunk))


async def _read_answers(worker: _Worker) -> None:
    """Resolve waiters from the worker's stdout until it ends."""
    assert worker.process.stdout is not None
    splitter = LineSplitter()
    while True:
        data = await worker.process.stdout.receive_some(_READ_SIZE)
        if not data:
            return
        for line in splitter.feed(data):
            request_id, outcome = decode_answer(line)
            waiter = worker.waiting.get(request_id)
            if waiter is not None:  # else: cancelled or timed out; dropped
                waiter.resolve(outcome)


@asynccontextmanager
async def open_object_store(cfg: S3Config, **options: Any
                            ) -> AsyncIterator[WorkerObjectStore]:
    """A :class:`WorkerObjectStore` whose worker process is gone on every exit path.

    *options* go to :class:`WorkerObjectStore` (tests swap the worker command)."""
    async with trio.open_nursery() as nursery:
        store = WorkerObjectStore(cfg, nursery, **options)
        try:
            yield store
        finally:
            await store.aclose()
            nursery.cancel_scope.cancel()
