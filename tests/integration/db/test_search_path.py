"""A co-tenant with CREATE on ``public`` plants functions and an operator that shadow what
safetynet's SQL calls (issue #26, item 3): neither the daemon, the CLI nor the safetynet
functions themselves ever call them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import tomli_w

from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import ROOT
from tests.messenger import insert_call_session, insert_recording

# Each planted object records that it ran. A varchar argument makes each one a better
# match than pg_catalog's text version, which is how public.left won in the issue.
PLANT = """
GRANT CREATE ON SCHEMA public TO PUBLIC;
CREATE TABLE public.hijacked (fn text NOT NULL);
GRANT ALL ON public.hijacked TO PUBLIC;
CREATE FUNCTION public.left(varchar, integer) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.hijacked VALUES ('left'); RETURN 'x'; END $$;
CREATE FUNCTION public.hijack_max(varchar, varchar) RETURNS varchar LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.hijacked VALUES ('max'); RETURN $2; END $$;
CREATE AGGREGATE public.max(varchar) (SFUNC = public.hijack_max, STYPE = varchar);
CREATE FUNCTION public.hijack_eq(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.hijacked VALUES ('='); RETURN $1::text = $2::text; END $$;
CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.hijack_eq);
CREATE FUNCTION public.hijack_concat(text, varchar) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.hijacked VALUES ('||'); RETURN $1 || $2::text; END $$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = varchar, FUNCTION = public.hijack_concat);
"""
PLANTED = {"left", "max", "=", "||"}


def hijacked(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT fn FROM public.hijacked").fetchall()]


def run_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervision.app", *args, "-c", str(config)],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={"PATH": os.environ.get("PATH", "")})


def test_planted_public_functions_are_never_called_by_plan_run_once_or_the_functions(
        db_dsn: str, s3_server: S3Server, bucket: str, kafka_server: KafkaServer,
        tmp_path: Path) -> None:
    """With public.left(varchar, int), public.max(varchar), public.=(varchar, varchar) and
    public.||(text, varchar) planted and CREATE on public granted to everyone (they do
    run for a session with the default search_path): `safetynet plan` of every job,
    `safetynet status` and a finalize run-once never call them, nor does
    safetynet.finalize_classify called from such an unpinned session; the unknown
    session kind is still reported through the real left()."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        sid = insert_call_session(conn)
        webinar = insert_recording(conn, session_id=sid, session_kind="Webinar")
        direct = insert_recording(conn, session_id=sid, status="Recording")
        conn.execute(PLANT)
        # the plants work: a session that searches public calls every one of them
        conn.execute("SELECT left('abc'::varchar, 1), 'a' || 'b'::varchar,"
                     " (SELECT max(v) FROM (VALUES ('a'::varchar)) t(v)),"
                     " 'a'::varchar = 'a'::varchar")
        assert set(hijacked(db_dsn)) == PLANTED
        conn.execute("TRUNCATE public.hijacked")
        classified = conn.execute(
            "SELECT phase, poison_reason FROM safetynet.finalize_classify("
            "%s, now(), 1800, 1)", (webinar.id,)).fetchone()
    assert classified == ("poison", "session_kind_unknown:Webinar")
    assert hijacked(db_dsn) == [], "the function resolved a name through search_path"
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "logging": {"level": "warning"},
    }))
    for job in ("recording-finalize", "conference-reaper", "outbox-relay"):
        proc = run_cli(config, "plan", "--job", job, "--json")
        assert proc.returncode == 0, proc.stderr
        if job == "recording-finalize":
            decisions = {d["id"]: d["decision"] for d in map(json.loads,
                                                           proc.stdout.splitlines())}
            assert decisions[webinar.id] == "quarantine"
    status = run_cli(config, "status", "--json")
    assert status.returncode in (0, 2), status.stderr
    run = run_cli(config, "run-once", "--job", "recording-finalize")
    assert run.returncode == 0, run.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        errors = dict(conn.execute(
            "SELECT recording_id::text, last_error FROM messenger.recording_finalize_attempts"
            " WHERE recording_id IN (%s, %s)", (webinar.id, direct.id)).fetchall())
    assert errors[webinar.id] == "session_kind_unknown:Webinar"
    assert hijacked(db_dsn) == []
