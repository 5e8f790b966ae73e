"""The console's pure parts: password hashes, the cross-site rule, trusted proxies, the
failed-login limit, and the reading of a daemon's /metrics."""

from __future__ import annotations

import base64

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from structlog.testing import capture_logs

from supervision.app.console.daemon_metrics import parse
from supervision.app.console.security import (
    FAILURE_WINDOW_S,
    MAX_FAILURES,
    Gate,
    Login,
    Refusal,
    cross_site,
    trusted,
)
from supervision.app.settings import config_from_dict
from supervision.passwords import MIN_N, BadHash, hash_password, verify_password


def test_password_hash_round_trips_and_never_contains_the_password() -> None:
    """A hash verifies its password only, and two hashes of one password differ (salt)."""
    first, second = hash_password("pa55 word", n=MIN_N), hash_password("pa55 word", n=MIN_N)
    assert first != second and "pa55" not in first
    assert verify_password("pa55 word", first) and not verify_password("pa55 Word", first)


@pytest.mark.parametrize("stored", [
    "pa55word", "scrypt$16384$8$1$c2FsdA==", "bcrypt$1$2$3$YWJjZGVmZ2g=$YWJjZGVmZ2hpamtsbW5vcA==",
    "scrypt$1000$8$1$YWJjZGVmZ2g=$YWJjZGVmZ2hpamtsbW5vcA==",  # N not a power of two
    "scrypt$4194304$8$1$YWJjZGVmZ2g=$YWJjZGVmZ2hpamtsbW5vcA==",  # N past the cap
    "scrypt$16384$8$1$not base64$YWJjZGVmZ2hpamtsbW5vcA==",
])
def test_malformed_or_too_costly_hashes_are_refused_without_quoting_them(stored: str) -> None:
    """A value that is not a bounded scrypt hash is refused; the message never quotes it."""
    with pytest.raises(BadHash) as caught:
        verify_password("x", stored)
    assert stored not in str(caught.value)


def test_config_refuses_a_clear_text_password_hash_naming_the_key() -> None:
    """console.password_hash must be a hash: a password pasted there is a config error."""
    from supervision.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        config_from_dict({"postgres": {"dsn": "postgresql://a@127.0.0.1/c"},
                          "console": {"password_hash": "hunter2"}})
    (problem,) = caught.value.problems
    assert problem.startswith("console.password_hash: ") and "hunter2" not in problem


@pytest.mark.parametrize(("headers", "refused"), [
    ({}, False), ({"sec-fetch-site": "same-origin"}, False), ({"sec-fetch-site": "none"}, False),
    ({"sec-fetch-site": "same-site"}, True), ({"sec-fetch-site": "cross-site"}, True),
    ({"origin": "http://c.test"}, False), ({"origin": "http://evil.test"}, True),
    ({"origin": "null"}, True), ({"origin": "https://console.example.com"}, False),
])
def test_cross_site_rule(headers: dict[str, str], refused: bool) -> None:
    """Only same-origin (or user-initiated) requests from the console's own origin or its
    public origin pass."""
    origins = {"http://c.test", "https://console.example.com"}
    assert (cross_site(headers, origins) is not None) == refused


def test_trusted_proxies_match_addresses_and_networks() -> None:
    """A proxy is trusted by exact address or network; anything unparsable is not."""
    assert trusted("10.1.2.3", ("10.1.0.0/16",)) and trusted("::1", ("::1",))
    assert not trusted("10.2.0.1", ("10.1.0.0/16",)) and not trusted("", ("0.0.0.0/0",))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_failed_logins_are_logged_and_limited_per_user_until_the_window_passes(
        ) -> None:
    """Each failed login is logged with the client and user (never the password); after
    MAX_FAILURES the user is refused (429) even with the right password and from another
    address, another user is not, and the limit lifts once the window has passed."""
    cfg = config_from_dict({"postgres": {"dsn": "postgresql://a@127.0.0.1/c"}, "console": {
        "user": "ana", "password_hash": hash_password("right", n=MIN_N)}}).console
    clock = FakeClock()
    gate = Gate(cfg, clock=clock)

    def auth(password: str, user: str = "ana") -> list[tuple[str, str]]:
        return [("authorization", "Basic " + base64.b64encode(
            f"{user}:{password}".encode()).decode())]

    with capture_logs() as logs:
        for _ in range(MAX_FAILURES):
            assert isinstance(await gate.authenticate("10.0.0.1", auth("guess-7731")),
                              Refusal)
    assert [(e["event"], e["client"], e["user"]) for e in logs] == [
        ("console_login_failed", "10.0.0.1", "ana")] * MAX_FAILURES
    assert not any("guess-7731" in str(v) for e in logs for v in e.values())
    for client in ("10.0.0.1", "10.0.0.2"):
        limited = await gate.authenticate(client, auth("right"))
        assert isinstance(limited, Refusal) and limited.status == 429
    other = await gate.authenticate("10.0.0.1", auth("x", "bob"))
    assert isinstance(other, Refusal) and other.status == 401  # checked, not limited
    clock.now += FAILURE_WINDOW_S + 1
    assert await gate.authenticate("10.0.0.1", auth("right")) == Login("ana")


def test_daemon_metrics_are_read_into_breaker_faults_and_cycles() -> None:
    """The breaker, each configuration fault, the leases held and the cycle counters of
    a daemon's exposition are picked out; garbage is reported, not raised."""
    registry = CollectorRegistry()
    Gauge("safetynet_s3_breaker_open", "", registry=registry).set(1)
    fault = Gauge("safetynet_config_fault", "", ["component"], registry=registry)
    fault.labels(component="kafka").set(1)
    fault.labels(component="s3").set(0)
    Gauge("safetynet_lock_held", "", ["job"], registry=registry).labels(
        job="conference-reaper").set(1)
    runs = Counter("messenger_recording_finalize_run", "", ["status"], registry=registry)
    runs.labels(status="ok").inc(7)
    Histogram("messenger_recording_finalize_cycle_duration_seconds", "",
              registry=registry).observe(0.5)
    seen = parse("u", generate_latest(registry).decode())
    assert (seen.why, seen.breaker_open, seen.config_faults, seen.leading) == (
        "", True, ["kafka"], ["conference-reaper"])
    assert seen.runs == {"recording-finalize": {"ok": 7.0}}
    assert seen.mean_cycle_s == {"recording-finalize": 0.5}
    assert parse("u", "not { metrics").why.startswith("unreadable metrics")


def test_trusted_proxies_is_an_array_or_a_comma_separated_environment_value() -> None:
    """console.trusted_proxies takes a TOML array, or (from the environment too) a
    comma-separated string; anything else names the key."""
    from supervision.app.settings import load_config
    from supervision.errors import ConfigError

    env = {"SAFETYNET__POSTGRES__DSN": "postgresql://a@127.0.0.1/c",
           "SAFETYNET__CONSOLE__TRUSTED_PROXIES": "127.0.0.1, 10.1.0.0/16"}
    assert load_config([], env).console.trusted_proxies == ("127.0.0.1", "10.1.0.0/16")
    assert config_from_dict({"postgres": {"dsn": "postgresql://a@127.0.0.1/c"}, "console": {
        "trusted_proxies": "10.0.0.1"}}).console.trusted_proxies == ("10.0.0.1",)
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"postgres": {"dsn": "postgresql://a@127.0.0.1/c"},
                          "console": {"trusted_proxies": [10]}})
    assert caught.value.problems == [
        "console.trusted_proxies: expected an array of strings, got array"]
