"""The suite-wide log scanner finds what it is meant to find."""

from __future__ import annotations

import io
import json
import logging

import psycopg
import psycopg.conninfo
import psycopg_pool
import pytest
import structlog

from supervision.logs import configure_logging
from supervision.secrets import Secret, dsn_secrets
from tests.logscan import leaks
from tests.waiting import wait_until


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


@pytest.mark.parametrize("line", [
    "connect failed: host=db password = hunter22 user=app",
    "dsn: host=db password='two words' port=5432",
    "dsn: host=db sslpassword=keyphrase",
    'error connecting: invalid percent-encoded token: "pa%zzword"',
])
def test_scanner_flags_libpq_credentials_whatever_their_value(line: str) -> None:
    """Credentials the scanner knows nothing about are still found by their shape:
    ``password = x`` with spaces, quoted values, ``sslpassword`` and psycopg's message for
    a bad '%' in a URL (which quotes the password)."""
    assert leaks(json.dumps({"event": line}), set()) != []


def test_scanner_passes_masked_credentials() -> None:
    """What the scrubber leaves behind is clean."""
    text = json.dumps({"event": 'password=*** sslpassword = *** percent-encoded token: "***"'})
    assert leaks(text, set()) == []


def test_psycopg_pool_retry_warnings_never_show_the_password() -> None:
    """psycopg_pool logs its connect error on every retry through the standard library,
    and for a bad '%' in a URL that error quotes the password: configured with the DSN's
    secrets, those lines reach the log masked."""
    dsn = "postgresql://app:pa%zzw0rd@127.0.0.1:9/x"
    buffer = io.StringIO()
    configure_logging("info", "json", stream=buffer, secrets=dsn_secrets(dsn))
    pool = psycopg_pool.ConnectionPool(dsn, min_size=1, open=False, name="leaky",
                                       reconnect_timeout=600)
    pool.open(wait=False)
    try:
        wait_until(lambda: "error connecting in 'leaky'" in buffer.getvalue(), 30,
                   "the pool's connect warning")
    finally:
        pool.close()
    assert leaks(buffer.getvalue(), dsn_secrets(dsn) | {"pa%zzw0rd"}) == []


def test_driver_messages_logged_by_actors_are_masked() -> None:
    """A driver message that quotes a credential is masked in an actor's log line and in
    a logged traceback, even when the secret was never registered."""
    buffer = io.StringIO()
    configure_logging("info", "json", stream=buffer)
    try:
        psycopg.conninfo.conninfo_to_dict("postgresql://app:pa%zzw0rd@h/x")
    except psycopg.ProgrammingError as exc:
        structlog.get_logger("t").error("actor_failed", error=str(exc))
        structlog.get_logger("t").exception("actor_crashed")
    logging.getLogger("psycopg.pool").warning("error connecting: %s", "sslpassword = k3yphrase")
    assert "pa%zzw0rd" not in buffer.getvalue() and "k3yphrase" not in buffer.getvalue()
    assert leaks(buffer.getvalue(), set()) == []


@pytest.mark.parametrize(("line", "secret"), [
    ("connect failed: host=db password = hunter22 user=app", "hunter22"),
    ("dsn: host=db password='two words' port=5432", "two words"),
    ("fetch https://app:pw123@s3.example/b failed", "pw123"),
    ('error connecting: invalid percent-encoded token: "pa%zzword"', "pa%zzword"),
])
def test_scrubber_masks_each_credential_shape_it_knows(line: str, secret: str) -> None:
    """Values that may hold a credential are scanned (the scrubber skips the scan only
    for text none of its patterns could match), and the credential is masked."""
    from supervision.secrets import Scrubber

    assert secret not in Scrubber().scrub(line)
    plain = "recording_reconciled 6f1c1f63-29a4"
    assert Scrubber().scrub(plain) == plain
