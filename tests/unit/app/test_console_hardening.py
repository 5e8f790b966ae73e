"""The console's hardening (issue #38 item 4), its pure parts: the proxy's shared secret,
the public origin and the Host allow-list, scrypt on every basic login without a lock,
bounded failure tables, strict parsing of operator input, the capped metrics read."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from supervision.app.console import security
from supervision.app.console.audit_runs import AUDIT_MIN_INTERVAL_S, Audits
from supervision.app.console.commands import READ_TIMEOUT_S, hypercorn_config
from supervision.app.console.daemon_metrics import MAX_BYTES, scrape
from supervision.app.console.inputs import (
    BadInput,
    outbox_ids,
    pause_for,
    since,
    uuids,
    whole,
)
from supervision.app.console.security import (
    MAX_SCRYPT_AT_ONCE,
    FailureLimit,
    Gate,
    Login,
    Refusal,
    Site,
)
from supervision.app.settings import config_from_dict
from supervision.config import ConsoleConfig, console_problems, console_warnings
from supervision.errors import ConfigError
from supervision.passwords import MIN_N, N, hash_password, parse_hash

DSN = "postgresql://a@127.0.0.1/c"
SECRET = "s3cret-from-the-proxy-0123"


def console(**section: Any) -> ConsoleConfig:
    return config_from_dict({"postgres": {"dsn": DSN}, "console": section}).console


def problems_of(**section: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        console(**section)
    return caught.value.problems


# ------------------------------------------------------------------ configuration


def test_new_hashes_cost_2_17_and_a_configured_hash_below_2_14_is_refused() -> None:
    """`--hash-password` makes N = 2^17 (OWASP); a hash cheaper than 2^14 in the config is
    a config error naming the key; 2^14 itself is accepted."""
    assert N >= 2**17 and parse_hash(hash_password("x"))[0] == N
    (problem,) = problems_of(user="u", password_hash=hash_password("x", n=2**13))
    assert problem.startswith("console.password_hash: scrypt N = 8192 is too cheap")
    assert console(user="u", password_hash=hash_password("x", n=MIN_N)).user == "u"


def test_proxy_header_auth_requires_the_shared_secret() -> None:
    """auth = proxy_header without console.proxy_secret cannot start, naming the key; a
    short secret is refused at load."""
    assert console_problems(console(auth="proxy_header", trusted_proxies=["127.0.0.1"])) == [
        "console.proxy_secret: required when console.auth = proxy_header"]
    assert console_problems(console(auth="proxy_header", trusted_proxies=["127.0.0.1"],
                                    proxy_secret=SECRET)) == []
    (problem,) = problems_of(proxy_secret="short")
    assert problem == "console.proxy_secret: must be at least 16 characters"


def test_basic_auth_on_a_non_loopback_listen_needs_a_public_origin() -> None:
    """Basic auth listening beyond loopback without console.public_origin (the TLS
    terminator's origin) cannot start, naming the key; on loopback, or with it, it can."""
    login = {"user": "u", "password_hash": hash_password("x", n=MIN_N)}
    (problem,) = console_problems(console(listen="0.0.0.0:9470", **login))
    assert problem.startswith("console.public_origin: required when console.auth = basic")
    assert console_problems(console(listen="0.0.0.0:9470",
                                    public_origin="https://console.example.com",
                                    **login)) == []
    assert console_problems(console(listen="[::1]:9470", **login)) == []


@pytest.mark.parametrize("origin", [
    "console.example.com", "ftp://console.example.com", "https://console.example.com/x",
    "https://u:p@console.example.com", "https://console.example.com:99999", "https://",
])
def test_public_origin_must_be_an_origin(origin: str) -> None:
    (problem,) = problems_of(public_origin=origin)
    assert problem.startswith("console.public_origin: must be an origin")


def test_the_console_refuses_to_start_naming_the_missing_keys(tmp_path: Path) -> None:
    """`safetynet console` on a basic-auth config listening on every address, without a
    public origin: exit 78, the key named on stderr, nothing served."""
    from supervision.app.cli import main

    config = tmp_path / "c.toml"
    config.write_text(f'[postgres]\ndsn = "{DSN}"\n[console]\nlisten = "0.0.0.0:9470"\n'
                      f'user = "u"\npassword_hash = "{hash_password("x", n=MIN_N)}"\n')
    result = CliRunner().invoke(main, ["console", "-c", str(config)])
    assert result.exit_code == 78
    assert "config error: console.public_origin: required" in result.output


def test_trusted_networks_wider_than_one_host_are_warned_of() -> None:
    cfg = console(auth="proxy_header", proxy_secret=SECRET,
                  trusted_proxies=["127.0.0.1", "::1/128", "10.0.0.0/8"])
    (warning,) = console_warnings(cfg)
    assert warning.startswith("console.trusted_proxies: 10.0.0.0/8 is wider than one host")


def test_hypercorn_has_a_read_timeout() -> None:
    assert hypercorn_config(config_from_dict({"postgres": {"dsn": DSN}})).read_timeout == \
        READ_TIMEOUT_S > 0


def test_history_since_far_in_the_past_is_a_usage_error_not_a_traceback() -> None:
    from supervision.app.cli import main

    result = CliRunner().invoke(main, ["history", "--since", "1000000d"])
    assert result.exit_code == 2 and "--since" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# ------------------------------------------------------------------ proxy_header


def proxy_gate() -> Gate:
    return Gate(console(auth="proxy_header", trusted_proxies=["127.0.0.1"],
                        proxy_secret=SECRET))


@pytest.mark.parametrize(("headers", "status"), [
    ([("x-forwarded-user", "ana"), ("x-safetynet-proxy-secret", SECRET)], 0),
    ([("x-forwarded-user", "ana")], 403),  # a local process without the secret
    ([("x-forwarded-user", "ana"), ("x-safetynet-proxy-secret", SECRET[:-1] + "x")], 403),
    ([("x-forwarded-user", "ana"), ("x-safetynet-proxy-secret", SECRET),
      ("x-safetynet-proxy-secret", SECRET)], 403),
    ([("x-forwarded-user", "ana"), ("x-forwarded-user", "root"),
      ("x-safetynet-proxy-secret", SECRET)], 400),
    ([("x-forwarded-user", "ana, root"), ("x-safetynet-proxy-secret", SECRET)], 400),
    ([("x-safetynet-proxy-secret", SECRET)], 401),
])
async def test_proxy_header_needs_the_secret_and_one_identity(
        headers: list[tuple[str, str]], status: int) -> None:
    """Only a request from a trusted address carrying the shared secret once and the
    identity header once logs in."""
    login = await proxy_gate().authenticate("127.0.0.1", headers)
    assert (login == Login("ana")) if status == 0 else (
        isinstance(login, Refusal) and login.status == status)


async def test_proxy_header_without_a_configured_secret_lets_nobody_in() -> None:
    gate = Gate(console(auth="proxy_header", trusted_proxies=["127.0.0.1"]))
    login = await gate.authenticate("127.0.0.1", [("x-forwarded-user", "ana"),
                                                  ("x-safetynet-proxy-secret", "")])
    assert isinstance(login, Refusal) and login.status == 403


# ------------------------------------------------------------------ basic


def basic(user: str, password: str) -> list[tuple[str, str]]:
    return [("authorization",
             "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())]


def basic_gate() -> Gate:
    return Gate(console(user="ana", password_hash=hash_password("right", n=MIN_N)))


async def test_an_unknown_user_costs_one_scrypt_of_the_same_cost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong user name is not told apart by skipping scrypt: it is run against a dummy
    hash of the configured hash's cost (never the real one)."""
    gate = basic_gate()
    checked: list[str] = []
    verify = security.verify_password

    def spy(password: str, stored: str) -> bool:
        checked.append(stored)
        return verify(password, stored)

    monkeypatch.setattr(security, "verify_password", spy)
    assert isinstance(await gate.authenticate("10.0.0.1", basic("mallory", "right")), Refusal)
    assert isinstance(await gate.authenticate("10.0.0.1", basic("ana", "wrong")), Refusal)
    real = gate.cfg.password_hash.reveal()
    assert checked[1] == real and checked[0] != real
    assert parse_hash(checked[0])[:3] == parse_hash(real)[:3]


async def test_scrypt_runs_in_parallel_but_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No lock across scrypt: two logins check their passwords at once (a barrier of two
    is passed), and never more than MAX_SCRYPT_AT_ONCE at a time."""
    gate = basic_gate()
    barrier = threading.Barrier(2, timeout=30)
    state = {"now": 0, "most": 0}
    guard = threading.Lock()

    def slow(password: str, stored: str) -> bool:
        with guard:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            barrier.wait()
        finally:
            with guard:
                state["now"] -= 1
        return False

    monkeypatch.setattr(security, "verify_password", slow)
    results: list[Any] = []

    async def attempt(n: int) -> None:
        results.append(await gate.authenticate(f"10.0.0.{n}", basic(f"user{n}", "x")))

    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(attempt, n)
    assert [r.status for r in results] == [401] * 6  # no barrier broke
    assert state["most"] == MAX_SCRYPT_AT_ONCE


def test_failure_tables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(security, "MAX_TRACKED", 10)
    table = FailureLimit(3)
    for n in range(100):
        for _ in range(5):
            table.add(f"10.0.{n}.1", 1.0)
    assert len(table.seen) == 10 and all(len(t) == 3 for t in table.seen.values())
    assert table.blocked("10.0.99.1", 1.0) and not table.blocked("10.0.0.1", 1.0)


async def test_successful_logins_leave_nothing_in_the_failure_tables() -> None:
    gate = basic_gate()
    for n in range(50):
        assert await gate.authenticate(f"10.1.0.{n}", basic("ana", "right")) == Login("ana")
    assert not gate.by_client.seen and not gate.by_user.seen


async def test_one_address_trying_many_users_is_limited_per_address() -> None:
    """Behind a proxy every login shares an address: its own, larger budget."""
    gate = basic_gate()
    statuses = []
    for n in range(security.MAX_ADDRESS_FAILURES + 1):
        refused = await gate.authenticate("10.0.0.9", basic(f"u{n}", "x"))
        assert isinstance(refused, Refusal)
        statuses.append(refused.status)
    assert statuses == [401] * security.MAX_ADDRESS_FAILURES + [429]


# ------------------------------------------------------------------ Host and Origin


@pytest.mark.parametrize(("listen", "public", "host", "ok"), [
    ("127.0.0.1:9470", "", "127.0.0.1:9470", True),
    ("127.0.0.1:9470", "", "localhost:9470", True),
    ("127.0.0.1:9470", "", "evil.test:9470", False),  # DNS rebinding
    ("127.0.0.1:9470", "", "127.0.0.1:9471", False),
    ("127.0.0.1:9470", "https://console.example.com", "console.example.com", True),
    ("127.0.0.1:9470", "https://console.example.com:8443", "console.example.com:8443", True),
    ("10.0.0.5:9470", "", "10.0.0.5:9470", True),
    ("10.0.0.5:9470", "", "localhost:9470", False),
    ("0.0.0.0:9470", "", "10.9.9.9:9470", True),
    ("0.0.0.0:9470", "", "evil.test:9470", False),
    ("[::]:9470", "", "[fe80::1]:9470", True),
    ("[::1]:9470", "", "[::1]:9470", True),
])
def test_host_allow_list_comes_from_listen_and_public_origin(
        listen: str, public: str, host: str, ok: bool) -> None:
    site = Site.of(console(listen=listen, public_origin=public))
    assert site.host_ok(host) == ok


def test_posts_may_come_from_the_public_origin() -> None:
    site = Site.of(console(public_origin="https://Console.example.com/"))
    assert site.origins("http", "127.0.0.1:9470") == {
        "http://127.0.0.1:9470", "https://console.example.com"}


# ------------------------------------------------------------------ operator input


@pytest.mark.parametrize("text", ["²", "١٢", "-1", "0", "1.5", "", " 7", "9" * 19, "0x10"])
def test_an_outbox_id_is_ascii_digits_within_bigint(text: str) -> None:
    """'²'.isdigit() is true, int('²') fails: an id is checked for what it names."""
    with pytest.raises(BadInput, match=r"^ids: must be a whole number"):
        outbox_ids([text])


def test_good_ids_parse() -> None:
    assert outbox_ids(["7", "9223372036854775807"]) == [7, 2**63 - 1]
    assert whole("42", "after") == 42
    assert uuids(["0C7A8E2C-0D4B-4E6A-9D0E-1F2A3B4C5D6E"]) == [
        "0c7a8e2c-0d4b-4e6a-9d0e-1f2a3b4c5d6e"]
    with pytest.raises(BadInput, match=r"^ids: must be UUIDs"):
        uuids(["0c7a8e2c"])


@pytest.mark.parametrize("text", ["2 hours", "2hrs", "0", "0s", "9" * 400, "367d", "-1h"])
def test_a_pause_for_that_does_not_parse_is_refused_never_indefinite(text: str) -> None:
    with pytest.raises(BadInput, match=r"^for: "):
        pause_for(text)


def test_a_pause_for_parses_or_is_empty() -> None:
    assert pause_for("2h") == 7200.0 and pause_for("") is None


@pytest.mark.parametrize("text", ["1000000d", "9" * 400, "2026-13-01", "yesterday"])
def test_since_out_of_range_or_malformed_is_refused(text: str) -> None:
    with pytest.raises(BadInput, match=r"^since: "):
        since(text)


# ------------------------------------------------------------------ audit, metrics


def test_one_audit_at_a_time_and_one_per_interval() -> None:
    clock = {"now": 100.0}
    audits = Audits(clock=lambda: clock["now"])
    assert audits.wait() == 0
    started = audits.start()
    assert audits.wait() == AUDIT_MIN_INTERVAL_S  # running
    audits.done("ana", ["v"], started)
    clock["now"] += 3
    assert audits.wait() == pytest.approx(AUDIT_MIN_INTERVAL_S - 3)
    clock["now"] += AUDIT_MIN_INTERVAL_S
    assert audits.wait() == 0 and audits.last is not None
    assert audits.last.violations == ["v"] and audits.last.by == "ana"
    assert audits.last.age().endswith("s ago")


class _Endless(http.server.BaseHTTPRequestHandler):
    sent = 0

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.end_headers()
        line = b"# " + b"x" * 65_533 + b"\n"
        try:
            while _Endless.sent < 64 * MAX_BYTES:
                self.wfile.write(line)
                _Endless.sent += len(line)
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endless() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_metrics_read_stops_at_the_cap(endless: str) -> None:
    """A daemon answering endless metrics: the console stops reading past MAX_BYTES and
    says so; it never holds the whole answer."""
    seen = await scrape(endless)
    assert seen.why == f"metrics larger than {MAX_BYTES} bytes"
    assert _Endless.sent < 16 * MAX_BYTES
