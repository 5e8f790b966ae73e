"""An incident-scoped requeue in a real browser (Debian's chromium through Selenium, as in
test_console_browser.py): the filter typed in, the preview's count and sample, the act with
a reason, the history. Screenshots go to build/console/ (incident-preview.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from tests.integration.app.console.support import quarantine
from tests.integration.app.console.test_console_browser import (
    browser,
    console_process,
    find,
    login,
    pytestmark,
    see,
    shot,
)
from tests.messenger import attempt

__all__ = ["browser", "pytestmark"]  # the fixture and the skip, shared


def test_operator_previews_then_requeues_an_incident_in_the_browser(
        db_dsn: str, tmp_path: Path, browser: Any) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        hit = [quarantine(conn, "s3:http_503_SlowDown") for _ in range(3)]
        miss, miss_rec = quarantine(conn, "object:content_type_unknown:text/html")
    with console_process(tmp_path, db_dsn, allow_actions=True) as url:
        login(browser, url, "/recordings?status=Quarantined")
        find(browser, "incident-requeue").click()
        find(browser, "incident").send_keys("INC-42 S3 throttling")
        find(browser, "since").send_keys("1h")
        find(browser, "error-pattern").send_keys("http_503*")
        find(browser, "preview").click()
        see(browser, "requeue would change 3 row(s)")
        assert miss not in browser.page_source
        shot(browser, "incident-preview")
        find(browser, "reason").send_keys("bucket throttling lifted")
        find(browser, "confirm").click()
        see(browser, "3 changed")
        see(browser, "Every page done")
        login(browser, url, "/history")
        see(browser, "INC-42 S3 throttling")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert all(attempt(conn, rec)["status"] == "Pending" for _, rec in hit)
        assert attempt(conn, miss_rec)["status"] == "Quarantined"
