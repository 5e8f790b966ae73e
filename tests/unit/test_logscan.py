"""The suite-wide log scanner finds what it is meant to find."""

from __future__ import annotations

import io

import structlog

from supervision.logs import configure_logging
from supervision.secrets import Secret
from tests.logscan import leaks


def test_scanner_flags_a_secret_and_a_url_with_credentials() -> None:
    """Both kinds of leak are reported, without repeating the secret."""
    text = '{"event": "x", "dsn": "postgresql://app:pw123@db/x", "key": "s3cr3t"}'
    found = leaks(text, {"s3cr3t"})
    assert found == ["secret #0", "URL with credentials (postgresql://...)"]
    assert all("s3cr3t" not in f and "pw123" not in f for f in found)


def test_scanner_passes_clean_lines() -> None:
    """Ids, plain URLs without credentials and redacted DSNs are fine."""
    text = '{"recording_id": "abc", "endpoint": "http://127.0.0.1:8333/b", "dsn": "x"}'
    assert leaks(text, {"s3cr3t"}) == []


def test_a_secret_logged_by_mistake_prints_masked() -> None:
    """Config secrets are Secret objects: logging one by mistake shows ***."""
    buffer = io.StringIO()
    configure_logging("info", "json", stream=buffer)
    structlog.get_logger("t").info("oops", token=Secret("s3cr3t"))
    assert leaks(buffer.getvalue(), {"s3cr3t"}) == []
    assert "***" in buffer.getvalue()
