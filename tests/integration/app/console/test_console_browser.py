"""The console in a real browser: Debian's chromium driven by Selenium through
chromium-driver, against `safetynet console` processes and a real database. Screenshots go to
build/console/ (`make console-screenshots` publishes them to docs/console/)."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import tomli_w

from supervision.app.queries import ALL_QUERIES
from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.cli import ROOT
from tests.integration.app.console.support import PASSWORD, SCRIPT, USER, password_hash, quarantine
from tests.integration.app.test_pause import daemon_config
from tests.integration.app.test_shutdown import start_daemon
from tests.messenger import attempt, recording, upload_recording
from tests.waiting import wait_until

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SHOTS = ROOT / "build" / "console"

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and DRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, "
           "/usr/bin/chromedriver); .ci/run installs them")


@contextlib.contextmanager
def console_process(tmp_path: Path, dsn: str, allow_actions: bool,
                    daemon_port: int | None = None) -> Iterator[str]:
    (port,) = free_ports(1)
    path = tmp_path / f"console-{port}.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "http": {"listen": f"127.0.0.1:{daemon_port or free_ports(1)[0]}"},
        "console": {"listen": f"127.0.0.1:{port}", "allow_actions": allow_actions,
                    "user": USER, "password_hash": password_hash(), "refresh": 0},
    }))
    proc = subprocess.Popen([sys.executable, "-m", "supervision.app", "console", "-c",
                             str(path)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            env={"PATH": os.environ.get("PATH", "")})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            return httpx.get(url + "/", timeout=1.0).status_code == 401
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 30.0, "the console to listen")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def login(driver: Any, url: str, path: str = "/") -> None:
    host = url.removeprefix("http://")
    driver.get(f"http://{USER}:{PASSWORD.replace(' ', '%20')}@{host}{path}")


def shot(driver: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def text(driver: Any) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.TAG_NAME, "body").text)
    except (StaleElementReferenceException, NoSuchElementException):  # a page loading
        return ""


def find(driver: Any, element_id: str) -> Any:
    """The element *element_id*, once the page that has it is loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, 15).until(
        expected_conditions.element_to_be_clickable((By.ID, element_id)))


def see(driver: Any, needle: str) -> None:
    """Wait until the page shows *needle* (a click's navigation may still be loading)."""
    try:
        wait_until(lambda: needle in text(driver), 15.0, f"{needle!r} on the page")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the page shows: {text(driver)[:1500]!r}") from None


def test_operator_requeues_pauses_and_resumes_in_the_browser(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path, browser: Any) -> None:
    """Log in and see the overview of a running daemon (its leader, its own figures) with a
    seeded incident whose planted <script> stays inert; requeue the quarantined row with a
    reason and see the daemon make it Available, and the action in the history; pause and
    resume a job."""
    from selenium.webdriver.common.by import By

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _, rec = quarantine(conn, SCRIPT)
        quarantine(conn, "object:content_type_unknown:text/html")
    upload_recording(s3_server, rec, bucket=bucket)  # the binary was there all along
    (daemon_port,) = free_ports(1)
    config = daemon_config(tmp_path / "daemon.toml", db_dsn, s3_server, bucket, daemon_port)
    daemon = start_daemon(config, tmp_path / "daemon.log")
    try:
        with console_process(tmp_path, db_dsn, True, daemon_port) as url:
            login(browser, url)

            def leader_shown() -> bool:
                browser.refresh()
                return "recording-finalize cycles" in text(browser) and \
                    "none yet" not in text(browser)

            wait_until(leader_shown, 60.0, "the daemon's leader and cycles on the overview",
                       step_s=0.5)
            assert browser.title.startswith("Overview")  # the planted script never ran
            assert rec in text(browser) and SCRIPT in text(browser)  # shown as text
            shot(browser, "overview")
            find(browser, "nav-recordings").click()
            see(browser, "last_error")
            shot(browser, "recordings")
            for box in browser.find_elements(By.CSS_SELECTOR, "input[name=ids]"):
                if box.get_attribute("value") != attempt_id_of(db_dsn, rec):
                    box.click()  # leave only the planted row checked
            find(browser, "requeue-selected").click()
            find(browser, "reason").send_keys("bucket policy fixed")
            shot(browser, "confirm")
            find(browser, "confirm").click()
            see(browser, "1 changed")
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                wait_until(lambda: recording(conn, rec)["status"] == "Available", 30.0,
                           "the daemon to finalise the requeued recording")
            browser.get(f"{url}/recordings?q={rec}")
            see(browser, "Available")
            shot(browser, "search")
            find(browser, "nav-history").click()
            see(browser, "bucket policy fixed")
            shot(browser, "history")

            find(browser, "nav-overview").click()
            see(browser, "SLO verdicts")
            find(browser, "pause-conference-reaper").click()
            find(browser, "for").send_keys("30m")
            find(browser, "reason").send_keys("database failover drill")
            find(browser, "confirm").click()
            see(browser, "done")
            find(browser, "nav-overview").click()
            see(browser, "database failover drill")
            shot(browser, "paused")
            find(browser, "resume-conference-reaper").click()
            find(browser, "reason").send_keys("drill over")
            find(browser, "confirm").click()
            see(browser, "done")
            find(browser, "nav-overview").click()
            assert find(browser, "pause-conference-reaper")
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        verbs = [r[0] for r in conn.execute(
            "SELECT verb FROM safetynet.operator_actions ORDER BY id")]
    assert verbs == ["requeue", "pause", "resume"]


def attempt_id_of(dsn: str, recording_id: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return str(attempt(conn, recording_id)["id"])


class _EvilPage(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        body = (f'<form id="f" method="post" action="{self.target}/actions/pause">'
                '<input name="job" value="recording-finalize"><input name="confirm" '
                'value="yes"><input name="reason" value="evil"></form>'
                "<script>document.getElementById('f').submit()</script>").encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_read_only_refusal_and_cross_site_post_in_the_browser(
        db_dsn: str, tmp_path: Path, browser: Any) -> None:
    """A read-only console shows no action and refuses a forged one (403), and still
    judges the audit on its button (a POST, as Chromium sends it); a page on another
    origin that auto-submits a pause form to the console is refused as
    cross-site, and nothing is paused or recorded."""
    from selenium.webdriver.common.by import By

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row_id, rec = quarantine(conn, "s3:http_503")
    with console_process(tmp_path, db_dsn, allow_actions=False) as url:
        login(browser, url, "/recordings")
        assert not browser.find_elements(By.ID, "requeue-selected")
        token = browser.find_element(By.NAME, "token").get_attribute("value")
        browser.execute_script(  # a forged form, as a user could make with devtools
            "const f = document.createElement('form'); f.method = 'post';"
            "f.action = '/actions/requeue';"
            "for (const [k, v] of Object.entries(arguments[0])) {"
            " const i = document.createElement('input'); i.name = k; i.value = v;"
            " f.appendChild(i); }"
            "document.body.appendChild(f); f.submit();",
            {"token": token, "ids": row_id, "confirm": "yes", "reason": "x"})
        see(browser, "this console is read-only")
        shot(browser, "read-only")
        login(browser, url, "/audit")  # judging the invariants writes nothing: a POST
        find(browser, "run-audit").click()
        see(browser, "violation(s), judged")
    with console_process(tmp_path, db_dsn, allow_actions=True) as url:
        login(browser, url)  # the browser now holds the credentials and a session
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EvilPage)
        _EvilPage.target = url.replace("127.0.0.1", "localhost")
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            login(browser, _EvilPage.target)
            browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
            see(browser, "cross-site request refused")
        finally:
            server.shutdown()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, rec)["status"] == "Quarantined"
        assert conn.execute("SELECT count(*) FROM safetynet.job_pauses").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM safetynet.operator_actions"
                            ).fetchone() == (0,)


def seed_dev_incident(dsn: str, s3_server: S3Server, bucket: str, recordings: int,
                      conferences: int) -> dict[str, int]:
    """`safetynet dev`'s incident (its named SQL and its uploads), small: lost-callback
    recordings (a tenth already Available, 70 % with their binary uploaded) and orphaned
    conferences, a third in each reaper phase; the verdicts it must end with."""
    available, with_binary = recordings // 10, round(recordings * 0.7)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        rows = cur.execute(ALL_QUERIES["dev_seed_recordings"], {
            "n": recordings, "available": available}).fetchall()
        cur.execute(ALL_QUERIES["dev_seed_conferences"], {"n": conferences})
    uploads = ([str(r[0]) for r in rows if r[1] != "Available"][:with_binary]
               + [str(r[0]) for r in rows if r[1] == "Available"])
    for rid in uploads:
        upload_recording(s3_server, rid, bucket=bucket)
    thirds = [len(range(k, conferences + 1, 3)) for k in (3, 1, 2)]
    truth = {"reconciled": with_binary, "republished": available,
             "failed": recordings - available - with_binary,
             "empty_timeout (reaper)": thirds[0], "provision_failed (reaper)": thirds[1],
             "stale_timeout (reaper)": thirds[2]}
    truth["published"] = (with_binary + available + thirds[0] + thirds[2])
    return truth


def dev_like_config(path: Path, dsn: str, s3: S3Server, bucket: str, kafka: KafkaServer,
                    port: int) -> Path:
    """The demo's short intervals (supervision/dev/demo.toml) on the test's servers."""
    creds = s3.credentials
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": bucket, "region": creds.region,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s", "finalize_sla_timeout": 0},
                 "conference_reaper": {"polling_interval": "1s", "empty_room_grace": "5s",
                                       "provision_timeout": "5s",
                                       "stale_live_timeout": "1m"}},
        "outbox_relay": {"poll_interval": "500ms"},
        "http": {"listen": f"127.0.0.1:{port}"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json"},
    }))
    return path


def test_the_seeded_incident_shows_in_the_charts_with_its_counts(
        db_dsn: str, s3_server: S3Server, kafka_server: KafkaServer, bucket: str,
        tmp_path: Path, browser: Any) -> None:
    """`safetynet dev`'s incident, healed by a running daemon: the overview's charts show
    its verdicts by outcome, exactly as seeded, and the relay's published rows; each
    chart's numbers are text (a legend and a table), and it reads at phone width too."""
    from selenium.webdriver.common.by import By

    truth = seed_dev_incident(db_dsn, s3_server, bucket, recordings=30, conferences=6)
    (daemon_port,) = free_ports(1)
    config = dev_like_config(tmp_path / "daemon.toml", db_dsn, s3_server, bucket,
                             kafka_server, daemon_port)
    daemon = start_daemon(config, tmp_path / "daemon.log")
    try:
        with console_process(tmp_path, db_dsn, True, daemon_port) as url:
            login(browser, url, "/#charts")
            legend = {k: f"{k}: {n}" for k, n in truth.items() if k != "published"}

            def healed() -> bool:
                browser.refresh()
                shown = text(browser)
                return all(line in shown for line in legend.values()) and \
                    f"published: {truth['published']}" in shown

            try:
                wait_until(healed, 90.0, "the incident's verdicts in the charts", step_s=1.0)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; want {truth}; the page shows: "
                                     f"{text(browser)[:3000]!r}") from None
            verdicts = browser.find_element(By.ID, "chart-verdicts")
            svg = verdicts.find_element(By.TAG_NAME, "svg")
            label = svg.get_attribute("aria-label")
            assert f"reconciled {truth['reconciled']}" in label
            assert f"failed {truth['failed']}" in label
            assert svg.size["width"] > 500  # two columns at 1400 px
            assert "published" in browser.find_element(By.ID, "chart-relay-rate").text
            shot(browser, "charts")
            login(browser, url, "/jobs/recording-finalize")
            see(browser, f"reconciled: {truth['reconciled']}")
            browser.set_window_size(390, 900)  # a phone
            browser.refresh()
            see(browser, f"reconciled: {truth['reconciled']}")
            narrow = browser.find_element(By.CSS_SELECTOR, "#chart-verdicts svg")
            assert 0 < narrow.size["width"] <= 390
            shot(browser, "charts-phone")
            browser.set_window_size(1400, 1000)
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
