"""The recorder-signal sender: asks the media stack to stop recorders of closed rooms.

>>> async with open_media_client(cfg.media) as http:
...     sender = RecorderSignal(cfg.media, http)
...     nursery.start_soon(run_recorder_signal, sender, stops_recv)

Inputs: :class:`StopRecording` messages (receive channel), sent by the conference reaper
after the batch that closed the room has committed. Outputs: one
``POST {media.base_url}/recordings/{recording_id}/stop`` per message (SPEC §5), JSON
``{"SessionId": ..., "Reason": "ConferenceEnded"}``, ``Idempotency-Key: <recording_id>``,
``Authorization: Bearer …`` only when ``media.token`` is set; at most ``concurrency`` at
a time, each bounded by ``media.timeout``. 2xx, 404 and 409 are done; anything else is
logged (recording id and status or error class: never the URL or the token) and counted
in ``safetynet_recorder_stop_failed_total`` (``reason="tls"`` when the media stack's
certificate is not trusted: ``media.ca_file`` is wrong, a configuration fault that also
sets ``safetynet_config_fault{component="media"}`` and /readyz to 503 until a stop gets
an HTTP answer). Nothing is retried and nothing rolls back: the signal is best-effort,
recording-finalize drives the recording to a terminal state.
Restart type: none — it lives for one cycle.

What cancellation does: requests in flight are dropped (their recorders are finalized by
the recording path). Once the inbox is closed, the whole fan-out gets 1.5 x
``media.timeout``: a request that started at once always ends with its own outcome,
requests still queued behind the limiter are cut off, logged and counted as
``abandoned``. So a media-stack outage stretches a cycle by that much at most, never
towards ``max_run_duration`` (which would delay the next tick and the empty-room SLO).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import structlog
import trio

from actors.reaper.messages import StopOutcome, StopRecording
from actors.reaper.metrics import RECORDER_STOP_FAILED
from supervision.config import MediaConfig
from supervision.tls import verifying_context
from supervision.tree.health import HEALTH

log = structlog.get_logger("recorder_signal")

DONE_STATUSES = frozenset({404, 409})
FAULT = "media"  # the configuration-fault component of an untrusted certificate


@asynccontextmanager
async def open_media_client(media: MediaConfig) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP client of the media stack, closed on every exit path.

    ``trust_env=False``: the media stack is an internal service reached directly; a proxy
    picked up from the environment would see the bearer token. Over https the certificate
    is verified against ``media.ca_file`` (a private CA) or certifi's public CAs; a bundle
    that cannot be loaded raises :class:`~supervision.errors.ConfigError` before any
    request.
    """
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=8)
    verify = verifying_context(media.ca_file, "media.ca_file")
    async with httpx.AsyncClient(timeout=media.timeout, limits=limits, verify=verify,
                                 trust_env=False) as client:
        yield client


class RecorderSignal:
    """Sends one stop request and classifies the answer; never raises for HTTP trouble."""

    def __init__(self, media: MediaConfig, http: httpx.AsyncClient) -> None:
        self._base = media.base_url.rstrip("/")
        self._timeout = media.timeout
        self._auth = f"Bearer {media.token.reveal()}" if media.token else None
        self._http = http

    @property
    def timeout(self) -> float:
        return self._timeout

    async def stop(self, request: StopRecording) -> StopOutcome:
        headers = {"Idempotency-Key": request.recording_id}
        if self._auth is not None:
            headers["Authorization"] = self._auth
        try:
            with trio.fail_after(self._timeout):  # the whole exchange, not each socket op
                response = await self._http.post(
                    f"{self._base}/recordings/{request.recording_id}/stop",
                    json={"SessionId": request.conference_id, "Reason": "ConferenceEnded"},
                    headers=headers, timeout=self._timeout)
        except (trio.TooSlowError, httpx.TimeoutException):
            return StopOutcome(request, False, "timeout")
        except httpx.HTTPError as exc:
            tls = _tls_error(exc)
            if tls is not None:  # a configuration fault (media.ca_file), not an outage
                HEALTH.set_fault(FAULT, f"tls: {tls} (check media.ca_file)")
                return StopOutcome(request, False, f"tls:{tls}")
            return StopOutcome(request, False, f"connection:{type(exc).__name__}")
        except Exception as exc:  # best-effort: nothing here may fail a committed cycle
            return StopOutcome(request, False, f"error:{type(exc).__name__}")
        HEALTH.clear_fault(FAULT)  # the handshake went through (or there was none)
        code = response.status_code
        return StopOutcome(request, 200 <= code < 300 or code in DONE_STATUSES, str(code))


async def run_recorder_signal(
    sender: RecorderSignal, inbox: trio.MemoryReceiveChannel[StopRecording], *,
    concurrency: int = 8, drain: float | None = None,
) -> None:
    """Send a stop for every message until *inbox* is closed and the fan-out is done.

    After the close, the fan-out is bounded by *drain* seconds (default: 1.5 x
    ``media.timeout``, see the module docstring).
    """
    limiter = trio.CapacityLimiter(concurrency)
    in_flight: dict[str, StopRecording] = {}

    async def one(request: StopRecording) -> None:
        in_flight[request.recording_id] = request
        async with limiter:
            outcome = await sender.stop(request)
        del in_flight[request.recording_id]
        _report(outcome)

    async with inbox, trio.open_nursery() as nursery:
        async for request in inbox:
            nursery.start_soon(one, request)
        nursery.cancel_scope.deadline = trio.current_time() + (
            1.5 * sender.timeout if drain is None else drain)
    if nursery.cancel_scope.cancelled_caught:
        for request in in_flight.values():
            _report(StopOutcome(request, False, "abandoned"))


def _tls_error(exc: BaseException) -> str | None:
    """The TLS failure under an httpx error (its reason, e.g. CERTIFICATE_VERIFY_FAILED)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return str(seen.reason or type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return None


def _report(outcome: StopOutcome) -> None:
    rid, cid = outcome.request.recording_id, outcome.request.conference_id
    if outcome.done:
        log.info("recorder_stop_sent", recording_id=rid, conference_id=cid,
                 status=outcome.detail)
        return
    reason = outcome.detail.split(":", 1)[0]
    reason = "http_status" if reason.isdigit() else reason
    RECORDER_STOP_FAILED.labels(reason=reason).inc()
    log.warning("recorder_stop_failed", recording_id=rid, conference_id=cid,
                error=outcome.detail)
