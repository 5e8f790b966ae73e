"""OpenTelemetry traces: a span per cycle and per item, as the seeds ask.

>>> with span("recording-finalize.cycle", job_run_id=run_id):
...     ...

No-op until configured: without ``[tracing] endpoint`` the API's default tracer records
nothing and costs next to nothing. With an endpoint, spans go to an OTLP/HTTP collector in
batches from the SDK's own background thread. Span context lives in context variables,
which Trio copies into every task it spawns, so item spans opened by the committers are
children of the cycle span.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import trio
from opentelemetry import trace

from supervision.config import TracingConfig

if TYPE_CHECKING:  # the SDK loads in configure_tracing, when an endpoint asks for it
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

_tracer: trace.Tracer = trace.get_tracer("safetynet")
SHUTDOWN_TIMEOUT = 5.0  # bound of the last export when tracing closes


def configure_tracing(cfg: TracingConfig, exporter: SpanExporter | None = None
                      ) -> TracerProvider | None:
    """Install an SDK tracer provider when an endpoint (or a test exporter) is given and
    return it (None: nothing installed, spans stay no-ops).

    A test exporter gets every span synchronously; the OTLP exporter gets batches. The
    provider is this module's own, not OpenTelemetry's global one (which can be set only
    once per process), so a reload can replace it (:func:`open_tracing`)."""
    global _configured, _tracer
    if exporter is None and not cfg.endpoint:
        return None
    # the SDK (~35 ms of imports) loads only when tracing is on: not for every verb's start
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "safetynet"}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.endpoint)))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracer, _configured = provider.get_tracer("safetynet"), True
    return provider


@asynccontextmanager
async def open_tracing(cfg: TracingConfig) -> AsyncIterator[None]:
    """Tracing per *cfg* inside the block; on exit the spans still buffered are exported
    (at most :data:`SHUTDOWN_TIMEOUT`, in a thread) and spans are no-ops again. Without
    an endpoint it does nothing (and leaves a test's exporter alone)."""
    global _configured, _tracer
    provider = configure_tracing(cfg)
    try:
        yield
    finally:
        if provider is not None:
            _tracer, _configured = trace.get_tracer("safetynet"), False
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_TIMEOUT):
                await trio.to_thread.run_sync(provider.shutdown, abandon_on_cancel=True)


_NO_SPAN: AbstractContextManager[trace.Span] = nullcontext(trace.INVALID_SPAN)
_configured = False  # set by configure_tracing: until then spans cost nothing


def tracing_enabled() -> bool:
    """True once :func:`configure_tracing` ran: a caller on a per-row path skips building
    a span's attributes when it is not."""
    return _configured


def span(name: str, **attributes: Any) -> AbstractContextManager[trace.Span]:
    """A span with the given attributes (None values are left out); a shared no-op
    context when tracing is not configured (a span per row would otherwise build its
    attributes and enter the API's no-op tracer for nothing)."""
    if not _configured:
        return _NO_SPAN
    return _span(name, attributes)


@contextmanager
def _span(name: str, attributes: dict[str, Any]) -> Iterator[trace.Span]:
    clean = {k: v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, attributes=clean) as current:
        yield current
