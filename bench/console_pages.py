"""The console's pages on big tables (issue #27, item 2): each page's render time.

A benchmark (not a test); it prints figures and asserts no timing.

``--rows`` (default 1,000,000) recordings with their finalize rows are seeded set-based
(``bench/recording_finalize.py``'s rows: every 10th Available, the rest Uploading; of their
finalize rows every 7th Quarantined with a ``last_error``, every 3rd rescheduled an hour
ahead, the rest due), and ``--outbox`` (default 1,000,000) outbox rows, every 100th
unpublished and every 1,000th of those dead-lettered, and eight days (the retention) of
the charts' per-minute rollup for every job; then VACUUM ANALYZE. Each page is
requested ``--repeat`` times through the ASGI app in-process (routing, the database
through the console's own pool, the template: all but the socket), after two warm-up
requests. Printed per page: the median and the 95th percentile in ms, and the median as a
ratio to a baseline measured in the same run — the median of one trivial statement
(``SELECT 1``) through the same pool — so figures from machines of different speed can be
compared. The issue's bound is 200 ms per page.

    .venv/bin/python bench/console_pages.py [--rows 1000000] [--outbox 1000000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._measure import percentile
from bench.recording_finalize import RESET, SEED
from supervision.app.console import views
from supervision.app.console.app import build_app
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import config_from_dict
from supervision.db.database import open_database
from supervision.db.migrate import install_demo
from supervision.db.pgconn import conninfo
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from tests.messenger import PREFIX

SHAPE = """
UPDATE messenger.recording_finalize_attempts
SET status = CASE WHEN abs(hashtext(id::text)) %% 7 = 0 THEN 'Quarantined' ELSE status END,
    last_error = CASE WHEN abs(hashtext(id::text)) %% 7 = 0
                      THEN 'object:content_type_unknown:text/html' END,
    next_attempt_at = CASE WHEN abs(hashtext(id::text)) %% 3 = 0
                           THEN now() + interval '1 hour' ELSE next_attempt_at END
"""
OUTBOX = """
INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
    payload, created_at, published_at, publish_attempts)
SELECT 'pin.messenger.call-recording-available.v1', md5('k' || n), md5('d' || n),
       'CallRecordingAvailable', jsonb_build_object('recordingId', md5('r' || n)),
       now() - interval '1 hour' + n * interval '1 millisecond',
       CASE WHEN n %% 100 = 0 THEN NULL ELSE now() END, 1
FROM generate_series(1, %(rows)s) AS n
"""
DEAD = """
INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason, blocks_key)
SELECT id, topic, message_key, 'MessageSizeTooLargeError', id %% 2 = 0
FROM messenger.integration_outbox
WHERE published_at IS NULL AND id %% 100000 = 0
"""
# the charts' rollup full: eight days (its retention) of every job's minutes
MINUTES = """
INSERT INTO safetynet.job_minutes (job, minute, cycles, reconciled, failed, published,
    backlog, oldest_age_s, ack_ms_max, ack_ms_buckets, restarts, lease_changes)
SELECT j, date_trunc('minute', now()) - m * interval '1 minute', 30, m %% 50, m %% 7,
       m %% 40, 1000 + m %% 500, m %% 900, 100 + m %% 900, '{1,2,3,4,5,0,0,0,0,1}',
       (m %% 997 = 0)::int, (m %% 499 = 0)::int
FROM unnest(ARRAY['recording-finalize', 'conference-reaper', 'outbox-relay']) AS j,
     generate_series(0, 8 * 1440 - 1) AS m
"""
PAGES = ("/", "/?span=24h", "/jobs/recording-finalize", "/jobs/outbox-relay?span=24h",
         "/recordings?status=Quarantined", "/recordings?status=Pending&window=due",
         "/recordings?status=Pending&window=later", "/recordings?q=no-such-file-id",
         "/conferences", "/outbox", "/outbox/keys", "/outbox/100", "/audit", "/history")
SECRET = "bench-proxy-secret-0123456789"


def seed(dsn: str, rows: int, outbox: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET)
        conn.execute(SEED, {"tag": "c", "rows": rows, "all_available": False,
                            "prefix": PREFIX})
        conn.execute(SHAPE, {})
        conn.execute(OUTBOX, {"rows": outbox})
        conn.execute(DEAD, {})
        conn.execute(MINUTES, {})
        conn.execute("VACUUM ANALYZE")


async def measure(dsn: str, repeat: int) -> list[str]:
    cfg = config_from_dict({"postgres": {"dsn": dsn}, "console": {
        "auth": "proxy_header", "trusted_proxies": ["127.0.0.1"], "proxy_secret": SECRET}})
    lines = []
    async with open_database(conninfo(cfg.postgres, "bench-console"), size=4) as db:
        def ping(conn: psycopg.Connection) -> Any:
            return conn.execute(ALL_QUERIES["console_ping"]).fetchone()

        base = []
        for _ in range(repeat * 5):
            started = time.perf_counter()
            await db.run(ping)
            base.append(time.perf_counter() - started)
        baseline = statistics.median(base)
        lines.append(f"baseline (SELECT 1 through the pool): median {baseline * 1000:.2f} ms")
        transport = httpx.ASGITransport(app=build_app(cfg, db), client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=transport,
                                     base_url=f"http://{cfg.console.listen}",
                                     headers={"X-Forwarded-User": "bench",
                                              "X-Safetynet-Proxy-Secret": SECRET}) as client:
            for page in PAGES:
                times = []
                for i in range(repeat + 2):
                    started = time.perf_counter()
                    response = await client.get(page)
                    if i >= 2:
                        times.append(time.perf_counter() - started)
                    assert response.status_code in (200, 404), (page, response.status_code)
                lines.append(_line(page, times, baseline))
        # the audit's run is a POST limited to one per AUDIT_MIN_INTERVAL_S: its work,
        # the statements the POST runs, timed through the same pool
        times = []
        for i in range(repeat + 2):
            started = time.perf_counter()
            await db.run(views.audit, cfg)
            if i >= 2:
                times.append(time.perf_counter() - started)
        lines.append(_line("audit run (POST /audit/run)", times, baseline))
    return lines


def _line(page: str, times: list[float], baseline: float) -> str:
    median = statistics.median(times)
    return (f"{page:45} median {median * 1000:7.1f} ms  p95 "
            f"{percentile(times, 0.95) * 1000:7.1f} ms  {median / baseline:6.0f}x baseline"
            f"{'' if median < 0.2 else '  OVER 200 ms'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--outbox", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    pg = PostgresServer(tmp)
    try:
        start_all([pg])
        install_demo(pg.dsn)
        started = time.perf_counter()
        seed(pg.dsn, args.rows, args.outbox)
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; seeded {args.rows}"
              f" recordings and {args.outbox} outbox rows in"
              f" {time.perf_counter() - started:.0f} s", flush=True)
        print("\n".join(trio.run(measure, pg.dsn, args.repeat)))
    finally:
        stop_all([pg])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
