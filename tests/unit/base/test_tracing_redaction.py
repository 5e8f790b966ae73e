"""The OTLP exporter's own log lines (a failed export quotes the URL) never show the
endpoint's query values (issue #26)."""

from __future__ import annotations

import io
import json

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from supervision.app.settings import config_from_dict
from supervision.logs import configure_logging
from supervision.secrets import secrets_in

ENDPOINT = "http://127.0.0.1:9/v1/traces?tenant=opaque-tenant-77&api_key=s3cr3t-api-key"


def test_a_failed_export_logs_the_endpoint_without_its_query_values() -> None:
    """Exporting to a closed port logs the URL (warning and error lines); the tenant and
    the api_key are masked, whatever their parameter's name."""
    cfg = config_from_dict({"postgres": {"dsn": "postgresql://u@127.0.0.1/m"},
                            "tracing": {"endpoint": ENDPOINT}})
    buffer = io.StringIO()
    configure_logging("info", "json", stream=buffer, secrets=secrets_in(cfg))
    try:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=cfg.tracing.endpoint, timeout=2)))
        with provider.get_tracer("t").start_as_current_span("s"):
            pass
        provider.shutdown()
    finally:
        configure_logging("info", "json")
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert any("/v1/traces?" in str(e["event"]) for e in lines), lines
    assert "opaque-tenant-77" not in buffer.getvalue()
    assert "s3cr3t-api-key" not in buffer.getvalue()
