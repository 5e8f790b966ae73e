"""The session bounds merged into a daemon connection's DSN (pure: no server)."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from supervision.app.settings import config_from_dict
from supervision.config import ConfigError
from supervision.db.pgconn import client_deadline, conninfo, with_defaults


def pg(**keys: object) -> dict[str, object]:
    return {"postgres": {"dsn": "postgresql://u@db.internal/messenger?sslmode=verify-full", **keys}}


def test_bounds_keepalives_and_name_are_merged_into_the_dsn() -> None:
    """statement/lock/idle timeouts go into options in ms; keepalives, connect_timeout and
    the application name are set."""
    cfg = config_from_dict(pg(statement_timeout="2s", lock_timeout="250ms"))
    params = conninfo_to_dict(conninfo(cfg.postgres, "safetynet-lock"))
    assert params["options"] == ("-c statement_timeout=2000 -c lock_timeout=250"
                                 " -c idle_in_transaction_session_timeout=25000"
                                 " -c search_path=pg_catalog,pg_temp")
    assert params["application_name"] == "safetynet-lock"
    assert params["connect_timeout"] == "5" and params["keepalives"] == "1"
    assert params["tcp_user_timeout"] == "15000" and params["host"] == "db.internal"


def test_what_the_dsn_sets_itself_wins() -> None:
    """connect_timeout/keepalives in the DSN replace ours; its options come after ours
    (PostgreSQL applies the last -c of a setting)."""
    cfg = config_from_dict({"postgres": {
        "dsn": "host=h dbname=d sslmode=verify-full connect_timeout=20 keepalives_idle=60"
               " options='-c lock_timeout=9s -c search_path=x'"}})
    params = conninfo_to_dict(conninfo(cfg.postgres, "safetynet"))
    assert params["connect_timeout"] == "20" and params["keepalives_idle"] == "60"
    assert params["options"].endswith("-c lock_timeout=9s -c search_path=x")
    assert params["options"].startswith("-c statement_timeout=20000")
    assert conninfo_to_dict(with_defaults("host=h application_name=a",
                                          application_name="b"))["application_name"] == "a"


def test_client_deadline_is_the_statement_timeout_plus_a_margin() -> None:
    """The client waits statement_timeout plus at most 5 s for an answer."""
    assert client_deadline(config_from_dict(pg()).postgres) == 25.0
    short = config_from_dict(pg(statement_timeout="1s", lock_timeout="1s"))
    assert client_deadline(short.postgres) == 2.0


@pytest.mark.parametrize(("keys", "expected"), [
    ({"statement_timeout": "2m"},
     "postgres.statement_timeout: must be below jobs.conference_reaper.lock_ttl (2m), got 2m"),
    ({"idle_in_transaction_session_timeout": "5m"},
     "postgres.idle_in_transaction_session_timeout: must be below "
     "jobs.recording_finalize.lock_ttl (5m), got 5m"),
    ({"lock_timeout": "40s"},
     "postgres.lock_timeout: must be <= statement_timeout (20s), got 40s"),
    ({"lock_timeout": "0s"}, "postgres.lock_timeout: must be > 0, got 0s"),
])
def test_bounds_that_outlast_a_lock_ttl_are_refused_naming_the_key(
        keys: dict[str, object], expected: str) -> None:
    """A bound the job's lock would expire before is one line naming the key (exit 78)."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(pg(**keys))
    assert expected in info.value.problems
