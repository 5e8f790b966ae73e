"""The table of bad inputs: what is planted, which job meets it, and the clear reason it
must give. One row per distinct input; the runners in ``test_bad_input.py`` do the rest.

Reasons are read from where an operator would look (``Read``): the finalize row's
``last_error``, the dead-letter reason, the readiness reason, a log event's field, the
cycle's counts, or the exit code and stderr of ``safetynet run``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import attrs
import psycopg

from actors.s3.objectstore import CANARY
from supervision.dev.processes import DevStackError
from tests.badinput import console_plants as cp
from tests.badinput.report import ROOT
from tests.badinput.world import PREFIX, Planted, World
from tests.cli import postgres_only_config
from tests.faults import HttpRule, s3_object
from tests.messenger import (
    insert_attempt,
    insert_call_session,
    insert_conference,
    insert_recording,
)


class Job(Enum):
    CONFIG = "config"  # `safetynet run` refuses to start; then recording-finalize heals
    FINALIZE = "recording-finalize"
    REAPER = "conference-reaper"
    RELAY = "outbox-relay"
    RELOAD = "reload"  # SIGHUP to a running `safetynet run` is refused; then finalize heals
    HTTP = "http"  # hostile clients of a running `safetynet run`'s endpoint
    DAEMON = "daemon"  # `check-config`, then `safetynet run`, on a valid config + the layer
    TOOL = "tool"  # an operator's command as a process (a CLI verb, `make audit`'s script)


class Read(Enum):
    LAST_ERROR = "last_error"
    STATUS = "status"
    DEAD_LETTER = "dead_letter"
    HEALTH = "health"
    LOG = "log"          # the expected event's error/reason field
    COUNTS = "counts"
    EXIT = "exit"
    PLANTED = "planted"  # what the plant itself measured (a listener's wake-ups)
    REFUSED = "config_reload_refused"  # the problem of the daemon's refusal line
    ANSWER = "answer"  # what the endpoint answered the prober
    SHOWN = "shown"  # what check-config printed for a key, or what the daemon's log held
    OUTPUT = "output"  # the operator command's exit code and what it said
    READYZ = "readyz"  # /readyz's answer (status and body) after the cycle


@attrs.frozen
class Case:
    id: str
    area: str
    input: str
    did: str
    job: Job
    plant: Callable[[World], Any]
    read: Read
    reason: str                 # the reason must start with this
    event: str | None = None    # the log event that must name it
    untouched: bool = False     # the bad cycle must change no row (a configuration fault)
    shows: str = ""             # text the reason must contain besides its start
    completes: bool = False     # the bad cycle must end with its counts, not fail whole


GOOD_HEAD = {"Content-Type": "audio/ogg", "Content-Length": "64",
             "x-amz-meta-duration-seconds": "42"}


# ------------------------------------------------------------------------------ plants


def due_recording(world: World, **kwargs: Any) -> str:
    rid = insert_recording(world.conn, session_id=insert_call_session(world.conn),
                           **kwargs).id
    world.exempt.add(rid)
    return rid


def odd_head(headers: Mapping[str, str], status: int = 200) -> Callable[[World], Any]:
    """The bad recording's binary exists, but HEAD on it answers *status* + *headers*."""
    async def plant(world: World) -> Planted:
        rid = due_recording(world)
        await world.upload(rid)
        world.proxy.rules.append(HttpRule(s3_object("HEAD", keys={PREFIX + rid}),
                                          status=status, headers=dict(headers)))
        return Planted(rid)
    return plant


def odd_object(**upload: Any) -> Callable[[World], Any]:
    """The recorder stored the bad recording's binary with odd metadata."""
    async def plant(world: World) -> Planted:
        rid = due_recording(world)
        await world.upload(rid, **upload)
        return Planted(rid)
    return plant


def s3_rule(rule: HttpRule) -> Callable[[World], Any]:
    """The endpoint misbehaves for some keys until the operator fixes it."""
    async def plant(world: World) -> Planted:
        world.proxy.rules.append(rule)

        async def heal() -> None:
            world.proxy.rules.clear()
        return Planted(heal=heal)
    return plant


def s3_config(**s3: Any) -> Callable[[World], Any]:
    async def plant(world: World) -> Planted:
        return Planted(config={"s3": s3})
    return plant


OTHER_BUCKET = "call-recordings-elsewhere"


def wrong_existing_bucket() -> Callable[[World], Any]:
    async def plant(world: World) -> Planted:
        with contextlib.suppress(DevStackError):  # there already
            world.s3.create_bucket(OTHER_BUCKET)
        return Planted(config={"s3": {"bucket": OTHER_BUCKET}})
    return plant


async def fresh_install_wrong_prefix(world: World) -> Planted:
    """A first deployment: no recording finalised yet (the positive canary has nothing to
    compare with), s3.key_prefix wrong, the binaries under the right one."""
    world.conn.execute("DELETE FROM messenger.recording_finalize_attempts"
                       " WHERE recording_id = %s", (world.known,))
    return Planted(config={"s3": {"key_prefix": "call-recordngs/"}})


async def octet_stream_everywhere(world: World) -> Planted:
    """The recorder (or a bucket policy) stores every binary as application/octet-stream:
    three more due recordings, and the healthy ones' objects rewritten the same way; the
    operator fixes the objects' Content-Type afterwards."""
    rids = [due_recording(world) for _ in range(3)]
    found = sorted(world.uploaded - {world.known})
    await world.upload(*rids, *found, content_type="application/octet-stream")
    for rid in rids:
        world.exempt.discard(rid)  # once fixed, each must be reconciled like any other

    async def heal() -> None:
        await world.upload(*rids, *found)
    return Planted(heal=heal)


def row(**kwargs: Any) -> Callable[[World], Any]:
    """A recording the messenger service left in an odd state (binary uploaded)."""
    async def plant(world: World) -> Planted:
        ended = kwargs.pop("ended_ago", 3600)
        status = kwargs.pop("session_status", None)
        sid = (str(uuid.uuid4()) if kwargs.pop("no_session", False)
               else insert_call_session(world.conn, ended_ago=ended, status=status))
        rid = insert_recording(world.conn, session_id=sid, **kwargs).id
        world.exempt.add(rid)
        await world.upload(rid)
        return Planted(rid)
    return plant


async def failed_call_without_end(world: World) -> Planted:
    """Failed call, ended_at NULL, status set two hours ago; the binary is there."""
    sid = insert_call_session(world.conn, ended_ago=None, status="Failed")
    world.conn.execute("UPDATE messenger.call_sessions SET updated_at = now()"
                       " - interval '2 hours' WHERE id = %s", (sid,))
    rid = insert_recording(world.conn, session_id=sid).id
    await world.upload(rid)
    return Planted(rid)  # not exempt: it must get its verdict


async def recording_row_missing(world: World) -> Planted:
    rid = str(uuid.uuid4())
    insert_attempt(world.conn, rid, insert_call_session(world.conn))
    world.exempt.add(rid)
    return Planted(rid)


async def locked_by_ingest(world: World) -> Planted:
    """The ingest callback holds the recording row (FOR UPDATE) during the cycle."""
    rid = insert_recording(world.conn, session_id=insert_call_session(world.conn)).id
    await world.upload(rid)
    ingest = psycopg.connect(world.dsn)
    ingest.execute("SELECT 1 FROM messenger.call_recordings WHERE id = %s FOR UPDATE",
                   (rid,))
    watchdog = threading.Timer(60, ingest.rollback)  # a committer that waits fails, not hangs
    watchdog.start()

    async def heal() -> None:
        watchdog.cancel()
        ingest.rollback()
        ingest.close()
    return Planted(rid, heal=heal)  # not exempt: the next cycle reconciles it


def conference(**kwargs: Any) -> Callable[[World], Any]:
    async def plant(world: World) -> Planted:
        room = insert_conference(world.conn, last_activity_ago=125, **kwargs)
        world.exempt.add(room.id)
        return Planted(room.id)
    return plant


def media(trouble: str) -> Callable[[World], Any]:
    """The recorder stop API misbehaves for one running recording of a closed room."""
    async def plant(world: World) -> Planted:
        from tests.messenger import insert_conference_recording

        room = insert_conference(world.conn, last_activity_ago=125, participants=1)
        rid = insert_conference_recording(world.conn, room)
        if trouble == "hang":
            world.media.hang(rid)
        elif trouble == "garbage":
            world.media.garbage(rid)
        elif trouble == "unreachable":
            return Planted(rid, config={"media": {"base_url": "http://127.0.0.1:9"}})
        else:
            world.media.answer(rid, int(trouble))
        return Planted(rid)
    return plant


def outbox(payload: str, headers: str, topic: str | None = None) -> Callable[[World], Any]:
    """A row another writer put in the outbox, JSON text as given."""
    async def plant(world: World) -> Planted:
        oid = world.enqueue(topic or world.topic, "bad", payload, headers, raw=True)
        world.exempt.add(str(oid))
        return Planted(str(oid))
    return plant


async def missing_topic(world: World) -> Planted:
    """Rows for a topic that does not exist, the broker creating none (auto-create off);
    the operator creates it afterwards."""
    assert world.kafka is not None
    kafka = world.kafka
    kafka.create_topic(world.topic)  # the healthy rows' topic exists
    topic = f"{world.topic}.missing"
    ids = [world.enqueue(topic, key, {"N": 1}, None) for key in ("a", "b")]

    async def heal() -> None:
        kafka.create_topic(topic)
    assert len(ids) == 2  # not exempt: published once the topic exists
    return Planted(topic, heal=heal, extra={"no_topic_creation": True})


HUGE = {  # a row another writer left in the outbox, far over the producer's 1 MiB
    "payload": "jsonb_build_object('blob', repeat('x', 40000000)), '{}'",
    "headers": "'{\"N\": 1}', jsonb_build_object('h', repeat('y', 5000000))",
}


def huge_row(column: str) -> Callable[[World], Any]:
    """One row of *column* tens of megabytes large (compressible: cheap to store)."""
    async def plant(world: World) -> Planted:
        key = "repeat('k', 2000000)" if column == "message_key" else "'bad'"
        values = HUGE.get(column, HUGE["payload"].replace("40000000", "10"))
        row = world.conn.execute(
            "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
            f" event_type, payload, headers) SELECT %s, {key}, gen_random_uuid()::text,"
            f" 'Test', {values} RETURNING id", (world.topic,)).fetchone()
        assert row is not None
        world.exempt.add(str(row[0]))
        return Planted(str(row[0]))
    return plant


async def batch_refused(world: World) -> Planted:
    """Rows of 30 KB around one of 300 KB, with a broker that refuses any batch over
    200 KB whole (its message.max.bytes below the client's max request size)."""
    for n in range(6):
        world.enqueue(world.topic, f"m{n}", {"Pad": "x" * 30_000}, None)
    oid = world.enqueue(world.topic, "big", {"Pad": "x" * 300_000}, None)
    world.exempt.add(str(oid))
    return Planted(str(oid), extra={"broker_max_bytes": 200_000})


DEAD_PILE = """
WITH rows AS (
    INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
        payload, publish_attempts, last_error)
    SELECT 't.dead', 'k' || g, 'd' || g, 'Test', '{}', 1, 'dead-letter: kafka:X'
    FROM generate_series(1, 100000) g
    RETURNING id, topic, message_key
)
INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason, blocks_key)
SELECT id, topic, message_key, 'kafka:X', false FROM rows RETURNING outbox_id
"""


async def dead_letter_pile(world: World) -> Planted:
    """100,000 dead letters left from earlier incidents (never purged before #26)."""
    ids = world.conn.execute(DEAD_PILE).fetchall()
    world.exempt.update(str(r[0]) for r in ids)
    return Planted()


async def notify_storm(world: World) -> Planted:
    """Any login NOTIFYs safetynet_outbox 20,000 times while the listener runs with a
    0.2 s minimum interval: the relay's wake-ups are counted."""
    import time
    from functools import partial

    import trio

    from actors.outbox.listener import serve_outbox_listener
    from supervision.tree.wakeup import Wakeup
    from tests.waiting import wait_until

    woken: list[float] = []

    class Counting(Wakeup):
        def wake_from_thread(self, token: trio.lowlevel.TrioToken) -> None:
            woken.append(time.monotonic())
            super().wake_from_thread(token)

    def storm() -> float:
        with psycopg.connect(world.dsn, autocommit=True) as conn:
            started = time.monotonic()
            for n in range(20):
                conn.execute("SELECT pg_notify('safetynet_outbox', %s || '-' || g)"
                             " FROM generate_series(1, 1000) g", (str(n),))
            return started

    wakeup = Counting()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_outbox_listener, world.dsn, wakeup,
                                    min_interval=0.2))
        started = await trio.to_thread.run_sync(storm)
        last = time.monotonic()
        with contextlib.suppress(AssertionError):  # no wake-up after it: said below
            await trio.to_thread.run_sync(wait_until, lambda: bool(woken) and (
                woken[-1] >= last), 5, "a wake-up after the storm")
        nursery.cancel_scope.cancel()
    during = [t for t in woken if t >= started]
    bound = (last - started) / 0.2 + 3
    caught_up = bool(woken) and woken[-1] >= last
    verdict = "coalesced" if len(during) <= bound and caught_up else "NOT coalesced"
    return Planted(extra={"reason": f"{verdict}: {len(during)} wake-up(s) for 20000"
                                    f" notifications in {last - started:.1f}s"})


HIJACK = """
GRANT CREATE ON SCHEMA public TO PUBLIC;
CREATE FUNCTION public.left(varchar, integer) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
"""


async def hijack_left(world: World) -> Planted:
    """A co-tenant's public.left(varchar, int), a better match than pg_catalog.left(text,
    int) for safetynet.finalize_classify's call; a recording whose kind it would report."""
    world.conn.execute(HIJACK)
    return Planted(due_recording(world, session_kind="Webinar"))


def config_file(text: str, env: Mapping[str, str] | None = None) -> Callable[[World], Any]:
    """``safetynet run`` started with *text* added to a valid configuration."""
    async def plant(world: World) -> Planted:
        return Planted(extra={"toml": text, "env": dict(env or {})})
    return plant


def config_special(kind: str, text: str = "",
                   files: Mapping[str, tuple[str, int]] | None = None) -> Callable[[World], Any]:
    """The layered file is not plain text: *kind* ``fifo`` (a FIFO), ``devzero`` (a
    symlink to /dev/zero), ``busy-listen`` (http.listen on a port another socket holds),
    ``files`` (*text* names *files*, written with their modes, as ``{dir}/NAME``)."""
    async def plant(world: World) -> Planted:
        return Planted(extra={"toml": text, "env": {}, "special": kind,
                              "files": dict(files or {})})
    return plant


def idle_connections(count: int) -> Callable[[World], Any]:
    """*count* connections to the endpoint that never send a byte, then a prober."""
    async def plant(world: World) -> Planted:
        return Planted(extra={"idle_connections": count})
    return plant


async def metadata_outage(world: World) -> Planted:
    """No S3 keys in the configuration, botocore's chain left with the instance metadata
    service, which answers 503 (a loopback stand-in); the operator's fix is the keys."""
    import os

    from tests.imds_stub import serve_imds

    stub = serve_imds("AKIDUNUSED", "unused-secret", "unused-token")
    imds = stub.__enter__()
    imds.up = False
    names = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
             "AWS_METADATA_SERVICE_TIMEOUT": "1", "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "1",
             "AWS_CONFIG_FILE": "/nonexistent/aws-config",
             "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}
    cleared = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AWS_PROFILE", "AWS_EC2_METADATA_DISABLED", "AWS_WEB_IDENTITY_TOKEN_FILE",
               "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
    saved = {n: os.environ.get(n) for n in (*names, *cleared)}
    for name in cleared:
        os.environ.pop(name, None)
    os.environ.update(names)

    async def heal() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        stub.__exit__(None, None, None)
    return Planted(config={"s3": {"access_key_id": "", "secret_access_key": ""}}, heal=heal)


async def planted_pycurl(world: World) -> Planted:
    """The daemon runs in a directory where someone planted a ``pycurl.py`` that would
    capture the S3 keys; healing checks it never ran."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp(prefix="badinput-cwd-"))
    marker = directory / "captured"
    (directory / "pycurl.py").write_text(
        f"open({str(marker)!r}, 'w').write('keys')\nraise ImportError('planted')\n")
    previous = os.getcwd()
    os.chdir(directory)

    async def heal() -> None:
        os.chdir(previous)
        imported = marker.exists()
        shutil.rmtree(directory)
        assert not imported, "the S3 worker imported the planted pycurl.py"
    return Planted(heal=heal)


def daemon_layer(text: str, *, secrets: tuple[str, ...], until: str, show: str = "",
                 env: Mapping[str, str] | None = None) -> Callable[[World], Any]:
    """``safetynet check-config`` (when *show* names a key) and then ``safetynet run`` on a
    valid configuration with *text* layered on and *env* added, until the daemon's log
    holds *until*: neither ever shows one of *secrets*, every log line is a JSON object."""
    async def plant(world: World) -> Planted:
        return Planted(extra={"toml": text, "env": dict(env or {}), "secrets": secrets,
                              "until": until, "show": show})
    return plant


def _command(*args: str, env: Mapping[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
    """*args* run from the repository with a bare environment (plus *env*)."""
    return subprocess.run(list(args), capture_output=True, text=True, check=False, cwd=ROOT,
                          timeout=120, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                            "PYTHONPATH": str(ROOT), **(env or {})})


async def pause_as_spoofed_root(world: World) -> Planted:
    """An operator whose environment says ``USER=root`` pauses recording-finalize with
    ``safetynet pause``; the pause's ``paused_by`` as ``safetynet status --json`` shows it
    (the host spelled ``<host>``), then ``resume``."""
    def run() -> str:
        directory = Path(tempfile.mkdtemp(prefix="badinput-pause-"))
        config = str(postgres_only_config(directory, world.dsn))
        spoofed = {"USER": "root", "LOGNAME": "root", "COLUMNS": "200"}
        try:
            verb = "recording-finalize"
            paused = _command(sys.executable, "-m", "supervision.app", "pause", "--job", verb,
                              "--reason", "bad-input", "-c", config, env=spoofed)
            assert paused.returncode == 0, paused.stderr
            status = _command(sys.executable, "-m", "supervision.app", "status", "--json",
                              "-c", config, env=spoofed)
            (pause,) = json.loads(status.stdout)["paused"]
            resumed = _command(sys.executable, "-m", "supervision.app", "resume", "--job", verb,
                               "-c", config, env=spoofed)
            assert resumed.returncode == 0, resumed.stderr
        finally:
            shutil.rmtree(directory)
        return str(pause["paused_by"]).replace(f"@{socket.gethostname()} ", "@<host> ")
    return Planted(extra={"run": run})


async def audit_without_source(world: World) -> Planted:
    """``make audit``'s script over both locks with every request sent through a proxy on
    a closed loopback port: no vulnerability source answers."""
    def run() -> str:
        proxy = "http://127.0.0.1:9"
        done = _command(sys.executable, "tools/audit_locks.py", "requirements/dev.lock",
                        "requirements/runtime.lock",
                        env={"https_proxy": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy,
                             "HTTP_PROXY": proxy, "no_proxy": "", "NO_PROXY": ""})
        said = (done.stdout + done.stderr).strip()
        assert "No known vulnerabilities found" not in said, said
        return f"exit {done.returncode}: {said}"
    return Planted(extra={"run": run})


async def refresh_still_expired(world: World) -> Planted:
    """No S3 keys configured; botocore's chain finds temporary keys inside its mandatory
    refresh window, and every refresh returns keys already expired (botocore then raises a
    plain RuntimeError); the operator's fix is the keys."""
    import botocore.credentials
    import botocore.session

    keys = world.s3.credentials

    def metadata(expires_in: dt.timedelta) -> dict[str, str]:
        return {"access_key": keys.access_key_id, "secret_key": keys.secret_access_key,
                "token": "", "expiry_time": (dt.datetime.now(dt.UTC) + expires_in).isoformat()}

    refreshes: list[int] = []

    def refresh() -> dict[str, str]:
        refreshes.append(1)
        return metadata(dt.timedelta(minutes=-1))

    def found(self: botocore.session.Session) -> botocore.credentials.RefreshableCredentials:
        return botocore.credentials.RefreshableCredentials.create_from_metadata(
            metadata(dt.timedelta(minutes=1)), refresh_using=refresh, method="assume-role")

    original = botocore.session.Session.get_credentials
    botocore.session.Session.get_credentials = found  # type: ignore[method-assign]

    async def heal() -> None:
        botocore.session.Session.get_credentials = original  # type: ignore[method-assign]
        assert refreshes, "botocore never refreshed the planted keys"
    return Planted(config={"s3": {"access_key_id": "", "secret_access_key": ""}}, heal=heal)


async def many_missing_topics(world: World) -> Planted:
    """Rows for 30 topics that do not exist, the broker creating none (auto-create off);
    the operator creates them afterwards."""
    assert world.kafka is not None
    kafka = world.kafka
    kafka.create_topic(world.topic)
    topics = [f"{world.topic}.gone{n:02d}" for n in range(30)]
    for topic in topics:
        world.enqueue(topic, "k", {"N": 1}, None)

    async def heal() -> None:
        for topic in topics:
            kafka.create_topic(topic)
    return Planted(heal=heal, extra={"no_topic_creation": True})


def _c(id: str, area: str, bad: str, did: str, job: Job, plant: Callable[[World], Any],
       read: Read, reason: str, event: str | None = None, untouched: bool = False,
       shows: str = "", completes: bool = False) -> Case:
    return Case(id, area, bad, did, job, plant, read, reason, event, untouched, shows,
                completes)


FIN, REAP, RELAY, CONF, TOOL = Job.FINALIZE, Job.REAPER, Job.RELAY, Job.CONFIG, Job.TOOL
QUARANTINED = "recording quarantined at once (no verdict, no retry), the rest finalised"
CONFIG_FAULT = ("configuration fault: nothing claimed, no attempt spent, readiness 503;"
                " healed by the next cycle once fixed")
EXIT_78 = "exit 78 before touching anything, one stderr line naming the key"
DEAD = "row dead-lettered with its reason, the other rows published"
REFUSED = "config error: "
RELOAD_REFUSED = ("SIGHUP refused (config_reload_refused naming the key), the daemon alive on"
                  " its old configuration, SIGTERM still exits 0")
SPIED_TRACES = "http://127.0.0.1:9/v1/traces?api_key=zzw0rd-tr4ce"  # a closed port
BURST = (f'[tracing]\nendpoint = "{SPIED_TRACES}"\n[logging]\nlevel = "debug"\n'
         '[jobs.recording_finalize]\npolling_interval = "0.05s"\n'
         '[jobs.conference_reaper]\npolling_interval = "0.05s"\n')
DEEP = "[" * 5000 + "]" * 5000
WEAK_KEY = {"client.key": ("-----BEGIN PRIVATE KEY-----\n", 0o644),
            "client.pem": ("-----BEGIN CERTIFICATE-----\n", 0o644)}

CASES: list[Case] = [
    # ---------------------------------------------------------------- configuration
    _c("config-s3-concurrency-5000", "config", "s3.concurrency = 5000 (select() breaks"
       " past 1,024 fds)", EXIT_78, CONF, config_file("[s3]\nconcurrency = 5000\n"),
       Read.EXIT, REFUSED + "s3.concurrency:", untouched=True),
    _c("config-backoff-factor-1e9", "config", "jobs.recording_finalize.backoff_factor ="
       " 1e9", EXIT_78, CONF,
       config_file("[jobs.recording_finalize]\nbackoff_factor = 1e9\n"), Read.EXIT,
       REFUSED + "jobs.recording_finalize.backoff_factor:", untouched=True),
    _c("config-max-attempts-env", "config", "SAFETYNET__JOBS__RECORDING_FINALIZE__MAX_ATTEMPTS"
       "=100000 (environment)", EXIT_78, CONF,
       config_file("", {"SAFETYNET__JOBS__RECORDING_FINALIZE__MAX_ATTEMPTS": "100000"}),
       Read.EXIT, REFUSED + "jobs.recording_finalize.max_attempts:", untouched=True),
    _c("config-batch-size-int64", "config", "outbox_relay.batch_size ="
       " 9223372036854775807", EXIT_78, CONF,
       config_file("[outbox_relay]\nbatch_size = 9223372036854775807\n"), Read.EXIT,
       REFUSED + "outbox_relay.batch_size:", untouched=True),
    _c("config-dsn-bad-percent", "config", "postgres.dsn URL with an unescaped '%' in the"
       " password", EXIT_78 + " (the password never quoted)", CONF,
       config_file('[postgres]\ndsn = "postgresql://app:pa%zzw0rd@127.0.0.1:9/m"\n'),
       Read.EXIT, REFUSED + "postgres.dsn:", untouched=True),
    _c("config-duration-words", "config", 'finalize_sla_timeout = "30 minutes"', EXIT_78,
       CONF, config_file('[jobs.recording_finalize]\nfinalize_sla_timeout = "30 minutes"\n'),
       Read.EXIT, REFUSED + "jobs.recording_finalize.finalize_sla_timeout:", untouched=True),
    _c("config-timeout-inf", "config", "s3.timeout = inf", EXIT_78, CONF,
       config_file("[s3]\ntimeout = inf\n"), Read.EXIT, REFUSED + "s3.timeout:",
       untouched=True),
    _c("config-removed-max-failed", "config",
       "jobs.recording_finalize.max_failed_per_cycle = 50 (removed: evidence replaced the"
       " cap)", EXIT_78 + " and what replaced it", CONF,
       config_file("[jobs.recording_finalize]\nmax_failed_per_cycle = 50\n"), Read.EXIT,
       REFUSED + "jobs.recording_finalize.max_failed_per_cycle: removed:", untouched=True),
    _c("config-unknown-key", "config", "jobs.recording_finalize.batchsize (a typo)",
       EXIT_78 + " and the closest name", CONF,
       config_file("[jobs.recording_finalize]\nbatchsize = 10\n"), Read.EXIT,
       REFUSED + "jobs.recording_finalize.batchsize:", untouched=True),
    _c("config-wrong-type", "config", 'jobs.conference_reaper.batch_size = "many"',
       EXIT_78, CONF, config_file('[jobs.conference_reaper]\nbatch_size = "many"\n'),
       Read.EXIT, REFUSED + "jobs.conference_reaper.batch_size:", untouched=True),
    _c("config-url-ipv6-unclosed", "config", 'media.base_url = "http://[::1" (urlsplit'
       " raises)", EXIT_78, CONF, config_file('[media]\nbase_url = "http://[::1"\n'),
       Read.EXIT, REFUSED + "media.base_url: must be an http(s) URL", untouched=True),
    _c("config-array-nested-5000", "config", "an array nested 5,000 deep (the TOML parser"
       " recurses)", EXIT_78, CONF,
       config_file(f"[jobs.recording_finalize]\nbatch_size = {DEEP}\n"), Read.EXIT,
       REFUSED + "jobs.recording_finalize.batch_size: arrays or tables nested too deeply",
       untouched=True),
    _c("config-duration-datetime", "config", "polling_interval written as a TOML datetime",
       EXIT_78, CONF, config_file("[jobs.recording_finalize]\npolling_interval ="
                                  " 1979-05-27T07:32:00Z\n"), Read.EXIT,
       REFUSED + "jobs.recording_finalize.polling_interval: expected a duration",
       untouched=True),
    _c("config-ca-file-nul", "config", "a NUL in s3.ca_file", EXIT_78, CONF,
       config_file('[s3]\nca_file = "/tmp/ca\\u0000.pem"\n'), Read.EXIT,
       REFUSED + "s3.ca_file: the path holds a NUL character", untouched=True),
    _c("config-file-fifo", "config", "the config path is a FIFO nobody writes",
       EXIT_78 + " (never waits on it)", CONF, config_special("fifo"), Read.EXIT,
       REFUSED + "<layer>: cannot read config file: is a FIFO", untouched=True),
    _c("config-file-dev-zero", "config", "the config path is a symlink to /dev/zero",
       EXIT_78 + " (never reads it)", CONF, config_special("devzero"), Read.EXIT,
       REFUSED + "<layer>: cannot read config file: is a character device", untouched=True),
    _c("config-sasl-plain-cleartext", "config", "PLAIN over SASL_PLAINTEXT to a loopback"
       " broker", EXIT_78, CONF,
       config_file('[kafka]\nsecurity_protocol = "SASL_PLAINTEXT"\nsasl_mechanism ='
                   ' "PLAIN"\nsasl_username = "u"\nsasl_password = "pw12"\n'),
       Read.EXIT, REFUSED + "kafka.sasl_mechanism: PLAIN over SASL_PLAINTEXT",
       untouched=True),
    _c("config-postgres-remote-unverified", "config", "a remote postgres.dsn with"
       " sslmode=require", EXIT_78, CONF,
       config_file('[postgres]\ndsn = "postgresql://app@db.internal/m?sslmode=require"\n'),
       Read.EXIT, REFUSED + "postgres.dsn: must use sslmode=verify-full", untouched=True),
    _c("config-key-file-world-readable", "config", "kafka.ssl_keyfile readable by"
       " others (mode 0644)", EXIT_78, CONF,
       config_special("files", '[kafka]\nsecurity_protocol = "SSL"\nssl_certfile ='
                      ' "{dir}/client.pem"\nssl_keyfile = "{dir}/client.key"\n', WEAK_KEY),
       Read.EXIT, REFUSED + "kafka.ssl_keyfile: ", untouched=True),
    _c("config-tracing-endpoint-unparsable", "config", 'tracing.endpoint = "http://[::1"',
       EXIT_78, CONF, config_file('[tracing]\nendpoint = "http://[::1"\n'), Read.EXIT,
       REFUSED + "tracing.endpoint: must be an http(s) URL", untouched=True),
    _c("config-listen-bracket-unclosed", "config", 'http.listen = "[::1:9464"', EXIT_78,
       CONF, config_file('[http]\nlisten = "[::1:9464"\n'), Read.EXIT,
       REFUSED + "http.listen: must be HOST:PORT", untouched=True),
    _c("config-file-2mib", "config", "a 2 MiB configuration file", EXIT_78 + " (never"
       " parsed)", CONF, config_special("huge"), Read.EXIT,
       REFUSED + "<layer>: cannot read config file: is 2097152 bytes", untouched=True),
    _c("config-media-ca-fifo", "config", "media.ca_file names a FIFO", EXIT_78 + " (the"
       " bundle is never opened)", CONF,
       config_special("files", '[media]\nca_file = "{dir}/ca.pem"\n', {"ca.pem": ("", -1)}),
       Read.EXIT, REFUSED + "media.ca_file: ", untouched=True),
    # -------------------------------------------------------- SIGHUP (issue #26)
    _c("reload-url-ipv6-unclosed", "config", 'SIGHUP with media.base_url = "http://[::1"',
       RELOAD_REFUSED, Job.RELOAD, config_file('[media]\nbase_url = "http://[::1"\n'),
       Read.REFUSED, "media.base_url: must be an http(s) URL", untouched=True),
    _c("reload-array-nested-5000", "config", "SIGHUP with an array nested 5,000 deep",
       RELOAD_REFUSED, Job.RELOAD,
       config_file(f"[jobs.recording_finalize]\nbatch_size = {DEEP}\n"), Read.REFUSED,
       "jobs.recording_finalize.batch_size: arrays or tables nested too deeply",
       untouched=True),
    _c("reload-duration-datetime", "config", "SIGHUP with a TOML datetime as a duration",
       RELOAD_REFUSED, Job.RELOAD, config_file("[jobs.recording_finalize]\n"
                                               "polling_interval = 1979-05-27T07:32:00Z\n"),
       Read.REFUSED, "jobs.recording_finalize.polling_interval: expected a duration",
       untouched=True),
    _c("reload-ca-file-nul", "config", "SIGHUP with a NUL in s3.ca_file", RELOAD_REFUSED,
       Job.RELOAD, config_file('[s3]\nca_file = "/tmp/ca\\u0000.pem"\n'), Read.REFUSED,
       "s3.ca_file: the path holds a NUL character", untouched=True),
    _c("reload-file-fifo", "config", "SIGHUP while the config path is a FIFO",
       RELOAD_REFUSED + " (the reload never blocks)", Job.RELOAD, config_special("fifo"),
       Read.REFUSED, "<layer>: cannot read config file: is a FIFO", untouched=True),
    _c("reload-file-dev-zero", "config", "SIGHUP while the config path is a symlink to"
       " /dev/zero", RELOAD_REFUSED + " (never read)", Job.RELOAD, config_special("devzero"),
       Read.REFUSED, "<layer>: cannot read config file: is a character device",
       untouched=True),
    _c("reload-listen-busy-port", "config", "SIGHUP moving http.listen to a port another"
       " process holds", RELOAD_REFUSED + " (the new address is bound first)", Job.RELOAD,
       config_special("busy-listen"), Read.REFUSED, "http.listen: cannot bind",
       untouched=True),
    # ------------------------------------------------------------- HTTP endpoint
    _c("http-idle-connections-200", "config", "200 connections to /readyz's port that"
       " never send a byte", "the prober is answered at once (idle connections give up"
       " their slots), a bounded number of log lines, the daemon alive", Job.HTTP,
       idle_connections(200), Read.ANSWER, "200 ready", untouched=True),
    # ------------------------------------------ secrets, logs and operators (issue #26)
    _c("config-tracing-endpoint-api-key", "config", "tracing.endpoint with ?api_key=... in"
       " its query string, the collector unreachable", "check-config prints the URL with"
       " every query value masked; the daemon runs, the OTLP exporter's failed-export lines"
       " name the URL masked, no log line holds the key", Job.DAEMON,
       daemon_layer(f'[tracing]\nendpoint = "{SPIED_TRACES}"\n', secrets=("zzw0rd-tr4ce",),
                    until="/v1/traces?", show="tracing.endpoint",
                    env={"OTEL_BSP_SCHEDULE_DELAY": "200"}),
       Read.SHOWN, "tracing.endpoint = http://127.0.0.1:9/v1/traces?api_key=***"),
    _c("config-tracing-endpoint-userinfo", "config", "tracing.endpoint with"
       " user:password@ in it, the collector unreachable", "check-config prints the URL"
       " with its userinfo masked; no log line of the daemon holds the password",
       Job.DAEMON, daemon_layer('[tracing]\nendpoint = "http://otel:zzw0rd-us3r@127.0.0.1:9'
                                '/v1/traces"\n', secrets=("zzw0rd-us3r",),
                                until="/v1/traces", show="tracing.endpoint",
                                env={"OTEL_BSP_SCHEDULE_DELAY": "200"}),
       Read.SHOWN, "tracing.endpoint = http://***@127.0.0.1:9/v1/traces"),
    _c("config-media-url-userinfo", "config", "media.base_url with user:password@ in it",
       EXIT_78 + " (the URL's credentials refused, never quoted)", CONF,
       config_file('[media]\nbase_url = "http://ops:zzw0rd-med1a@127.0.0.1:9"\n'),
       Read.EXIT, REFUSED + "media.base_url: must not carry credentials", untouched=True),
    _c("log-both-paths-burst", "config", "structlog and the standard library's loggers"
       " writing at once (a daemon whose OTLP exporter fails every 50 ms while its jobs"
       " log)", "one writer: each line written whole with its newline; every line of the"
       " daemon's stderr is one JSON object", Job.DAEMON,
       daemon_layer(BURST, secrets=(), until="BOTH_PATHS",
                    env={"OTEL_BSP_SCHEDULE_DELAY": "50",
                         "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.1"}),
       Read.SHOWN, "every line one JSON object, from structlog and from the standard"
       " library"),
    _c("cli-pause-user-spoofed", "config", "`safetynet pause` run with USER=root by"
       " someone else", "paused_by records the database session_user beside $USER@host",
       Job.TOOL, pause_as_spoofed_root, Read.OUTPUT, "root@<host> [db:"),
    _c("tool-audit-no-source", "config", "`make audit` (tools/audit_locks.py) where no"
       " vulnerability source answers (every request to a closed loopback port)",
       "one line saying nothing was audited, exit 2 (never 'No known vulnerabilities"
       " found')", Job.TOOL, audit_without_source, Read.OUTPUT,
       "exit 2: audit: no vulnerability source reachable (pypi: "),
    # ------------------------------------------------------------- S3 configuration
    _c("s3-imds-outage", "s3", "no S3 keys configured and the instance metadata service"
       " down at the first request", "no HEAD sent (nothing unsigned), no attempt spent;"
       " the chain is asked again with back-off", FIN, metadata_outage, Read.LOG,
       "credentials_unavailable:none_found", "s3_credentials_unavailable"),
    _c("s3-planted-pycurl-in-cwd", "s3", "a pycurl.py planted in the daemon's working"
       " directory", "never imported (the S3 worker starts with -P -s in /); the cycle"
       " finalises as usual", FIN, planted_pycurl, Read.COUNTS,
       '{"failed": 1, "reconciled": 2}', "recording_reconciled"),
    _c("s3-wrong-key-prefix", "s3", "s3.key_prefix names the wrong prefix (every HEAD"
       " 404)", CONFIG_FAULT + " (positive canary: a known recording answers 404)", FIN,
       s3_config(key_prefix="call-recordngs/"), Read.HEALTH,
       "configuration fault in s3: known_recording_not_found:", "known_recording_not_found",
       untouched=True),
    _c("s3-wrong-existing-bucket", "s3", "s3.bucket names a bucket that exists but holds"
       " no recording", CONFIG_FAULT + " (positive canary)", FIN, wrong_existing_bucket(),
       Read.HEALTH, "configuration fault in s3: known_recording_not_found:",
       "known_recording_not_found", untouched=True),
    _c("s3-fresh-install-wrong-prefix", "s3", "s3.key_prefix wrong on a fresh install (no"
       " recording finalised yet: no positive canary)", "Missing verdicts withheld for want"
       " of evidence (nothing listed or found under the prefix): 0 Failed, rows given back"
       " untouched and held off (no attempt), readiness 503, alert; healed once fixed and"
       " the hold-off is over", FIN,
       fresh_install_wrong_prefix, Read.HEALTH,
       "configuration fault in s3_evidence: no_evidence_for_key_prefix",
       "missing_verdicts_withheld"),
    _c("s3-missing-bucket", "s3", "s3.bucket names no bucket at all", CONFIG_FAULT, FIN,
       s3_config(bucket="no-such-bucket-here"), Read.HEALTH,
       "configuration fault in s3: bucket_missing", "config_fault", untouched=True),
    _c("s3-bad-secret-403", "s3", "s3.secret_access_key wrong (403 on every request)",
       CONFIG_FAULT, FIN, s3_config(secret_access_key="not-the-key"), Read.HEALTH,
       "configuration fault in s3: access_denied_http_403", "config_fault", untouched=True),
    _c("s3-404-to-everything", "s3", "the endpoint answers 404 to every object HEAD",
       CONFIG_FAULT + " (positive canary)", FIN,
       s3_rule(HttpRule(s3_object("HEAD"), status=404)), Read.HEALTH,
       "configuration fault in s3: known_recording_not_found:", "known_recording_not_found",
       untouched=True),
    _c("s3-200-on-canary-key", "s3", "200 on the must-not-exist canary key (a catch-all"
       " endpoint)", CONFIG_FAULT, FIN,
       s3_rule(HttpRule(s3_object("HEAD", keys={PREFIX + CANARY}), status=200)),
       Read.HEALTH, "configuration fault in s3: canary_key_exists", "config_fault",
       untouched=True),
    _c("s3-nosuchbucket-on-object", "s3", "a 404 carrying NoSuchBucket on an object HEAD",
       CONFIG_FAULT, FIN, s3_rule(HttpRule(s3_object("HEAD"), status=404,
                                         headers={"x-amz-error-code": "NoSuchBucket"})),
       Read.HEALTH, "configuration fault in s3: bucket_missing", "config_fault",
       untouched=True),
    _c("s3-refresh-still-expired", "s3", "temporary S3 keys whose refresh returns keys"
       " already expired (botocore's plain RuntimeError)", "Transient with back-off: no"
       " HEAD sent, no attempt spent, the cycle and the S3 store live on; asked again"
       " after the back-off", FIN, refresh_still_expired, Read.LOG,
       "credentials_unavailable:expired_after_refresh", "s3_credentials_unavailable",
       completes=True),
    # --------------------------------------------------------- S3 responses of one row
    _c("s3-duration-superscript", "s3", "x-amz-meta-duration-seconds: '²' (isdigit() true,"
       " int() raises)", QUARANTINED, FIN, odd_head({**GOOD_HEAD,
                                                    "x-amz-meta-duration-seconds": "²"}),
       Read.LAST_ERROR, "object:duration_invalid:", "recording_quarantined"),
    _c("s3-duration-4300-digits", "s3", "x-amz-meta-duration-seconds of 4,300 digits"
       " (past int()'s limit)", QUARANTINED, FIN,
       odd_head({**GOOD_HEAD, "x-amz-meta-duration-seconds": "9" * 4300}), Read.LAST_ERROR,
       "object:duration_invalid:99999", "recording_quarantined"),
    _c("s3-duration-past-int4", "s3", "duration 2147483648 (past the int column)",
       QUARANTINED, FIN, odd_object(duration="2147483648"), Read.LAST_ERROR,
       "object:duration_invalid:2147483648", "recording_quarantined"),
    _c("s3-duration-negative", "s3", "duration '-5'", QUARANTINED, FIN,
       odd_object(duration="-5"), Read.LAST_ERROR, "object:duration_invalid:-5",
       "recording_quarantined"),
    _c("s3-duration-missing", "s3", "object stored without duration metadata",
       QUARANTINED, FIN, odd_object(duration=None), Read.LAST_ERROR, "object:duration_missing",
       "recording_quarantined"),
    _c("s3-content-type-unknown", "s3", "Content-Type video/x-matroska", QUARANTINED, FIN,
       odd_object(content_type="video/x-matroska"), Read.LAST_ERROR,
       "object:content_type_unknown:video/x-matroska", "recording_quarantined"),
    _c("s3-content-type-octet-stream-everywhere", "s3", "every object stored as"
       " application/octet-stream (a recorder or bucket policy)", "configuration fault:"
       " nothing quarantined, those rows given back untouched and held off, readiness 503;"
       " reconciled once the objects' Content-Type is fixed", FIN, octet_stream_everywhere,
       Read.HEALTH, "configuration fault in s3_content_type: content_type_unusable:"
       "application/octet-stream", "config_fault"),
    _c("s3-content-type-control-chars", "s3", "Content-Type with control characters",
       QUARANTINED + " (non-printable characters stored as '?')", FIN,
       odd_head({**GOOD_HEAD, "Content-Type": "audio/\x01og\x7fg"}), Read.LAST_ERROR,
       "object:content_type_unknown:audio/", "recording_quarantined"),
    _c("s3-header-line-200kb", "s3", "a 200 KB header line on the HEAD answer",
       QUARANTINED + "; the S3 worker lives on", FIN,
       odd_head({**GOOD_HEAD, "x-amz-meta-pad": "a" * 200_000}), Read.LAST_ERROR,
       "object:response_unreadable:", "recording_quarantined"),
    _c("s3-503-on-one-object", "s3", "503 SlowDown on one object, every time",
       "that row retried with back-off (attempt counted), the rest finalised", FIN,
       odd_head({"x-amz-error-code": "SlowDown"}, status=503), Read.LAST_ERROR,
       "s3:http_503_SlowDown", "recording_retry_scheduled"),
    # ----------------------------------------------------- rows of the messenger service
    _c("row-session-missing", "messenger", "recording whose call_sessions row is missing",
       QUARANTINED, FIN, row(no_session=True), Read.LAST_ERROR, "session_missing",
       "recording_quarantined"),
    _c("row-session-kind-unknown", "messenger", "session_kind 'Webinar'", QUARANTINED, FIN,
       row(session_kind="Webinar"), Read.LAST_ERROR, "session_kind_unknown:Webinar",
       "recording_quarantined"),
    _c("row-ended-far-future", "messenger", "call ended_at a year in the future",
       QUARANTINED, FIN, row(ended_ago=-365 * 86400), Read.LAST_ERROR,
       "session_ended_in_future:", "recording_quarantined"),
    _c("row-recording-missing", "messenger", "finalize row whose recording row is missing",
       QUARANTINED, FIN, recording_row_missing, Read.LAST_ERROR, "recording_missing",
       "recording_quarantined"),
    _c("row-failed-call-null-ended-at", "messenger", "Failed call with ended_at NULL"
       " (status set 2 h ago)", "ended at updated_at: a bounded wait, then the verdict"
       " (binary present: Available)", FIN, failed_call_without_end, Read.STATUS, "Available",
       "recording_reconciled"),
    _c("row-locked-by-ingest", "messenger", "recording row locked by the ingest callback",
       "skipped, not waited on, no attempt spent; reconciled by the next cycle", FIN,
       locked_by_ingest, Read.COUNTS,
       '{"failed": 1, "reconciled": 2, "skipped_locked": 1}',
       "recording_skipped_locked"),
    _c("row-conference-started-after-asof", "messenger", "conference started_at an hour"
       " after AsOf", "poison: logged, counted, remembered with back-off; the batch"
       " commits", REAP, conference(started_ago=-3600), Read.LOG, "started_after_as_of",
       "item_failed"),
    _c("row-conference-duration-overflow", "messenger", "conference started_at"
       " 0001-01-01 (duration overflows)", "the batch falls back to one savepoint per row;"
       " the poison is logged and left untouched", REAP,
       conference(started_at=dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
       Read.LOG, "NumericValueOutOfRange", "item_failed"),
    # ------------------------------------------------------------------- outbox rows
    _c("outbox-payload-array", "outbox", "payload is a JSON array", DEAD, RELAY,
       outbox("[1, 2]", "{}"), Read.DEAD_LETTER,
       "malformed_row: payload is a JSON array, not an object", "outbox_row_dead_lettered"),
    _c("outbox-payload-string", "outbox", "payload is a JSON string", DEAD, RELAY,
       outbox('"just text"', "{}"), Read.DEAD_LETTER,
       "malformed_row: payload is a JSON string, not an object",
       "outbox_row_dead_lettered"),
    _c("outbox-headers-array", "outbox", "headers is a JSON array", DEAD, RELAY,
       outbox('{"N": 1}', "[1, 2]"), Read.DEAD_LETTER,
       "malformed_row: headers is a JSON array, not an object", "outbox_row_dead_lettered"),
    _c("outbox-header-number", "outbox", "header value is a number", DEAD, RELAY,
       outbox('{"N": 1}', '{"event-id": 5}'), Read.DEAD_LETTER,
       "malformed_row: header 'event-id' is a JSON number, not a string",
       "outbox_row_dead_lettered"),
    _c("outbox-header-null", "outbox", "header value is null", DEAD, RELAY,
       outbox('{"N": 1}', '{"trace": null}'), Read.DEAD_LETTER,
       "malformed_row: header 'trace' is a JSON null, not a string",
       "outbox_row_dead_lettered"),
    _c("outbox-invalid-topic", "outbox", "topic name 'not a topic!'", DEAD, RELAY,
       outbox('{"N": 1}', "{}", topic="not a topic!"), Read.DEAD_LETTER,
       "kafka:InvalidTopicError", "outbox_row_dead_lettered"),
    # ---------------------------------------------------------------------- Kafka
    _c("kafka-missing-topic", "kafka", "topic does not exist, auto-create off",
       "configuration fault for that topic (readiness 503, nothing dead-lettered, no"
       " attempt); other topics publish; heals once the topic is created", RELAY,
       missing_topic, Read.HEALTH, "configuration fault in kafka: topic ", "config_fault"),
    _c("kafka-30-missing-topics", "kafka", "rows for 30 topics that do not exist,"
       " auto-create off", "a fault per topic in the log; /readyz 503 names the first"
       " only, without addresses, and counts the others", RELAY, many_missing_topics,
       Read.READYZ, "503 not ready: configuration fault in kafka: topic ",
       "config_fault", shows="(and 29 more; see the log)"),
    # ------------------------------------- hostile outbox and database (issue #26)
    _c("outbox-huge-payload", "outbox", "a 40 MB payload", "dead-lettered without its"
       " payload being fetched (its size measured in the database); claims capped by"
       " claim_max_bytes, memory bounded", RELAY, huge_row("payload"), Read.DEAD_LETTER,
       "too_large: row of 400000", "outbox_row_dead_lettered"),
    _c("outbox-huge-headers", "outbox", "5 MB of headers", "dead-lettered unread, as a huge"
       " payload", RELAY, huge_row("headers"), Read.DEAD_LETTER, "too_large: row of 5000",
       "outbox_row_dead_lettered"),
    _c("outbox-huge-key", "outbox", "a 2 MB message_key", "dead-lettered unread, as a huge"
       " payload", RELAY, huge_row("message_key"), Read.DEAD_LETTER,
       "too_large: row of 2000", "outbox_row_dead_lettered"),
    _c("kafka-batch-too-large", "kafka", "broker refuses whole batches over its own"
       " message.max.bytes (MessageSizeTooLarge)", "the batch is sent again one message per"
       " batch: only the offender is dead-lettered, its batch-mates are published", RELAY,
       batch_refused, Read.DEAD_LETTER, "kafka:MessageSizeTooLargeError",
       "outbox_row_dead_lettered"),
    _c("outbox-dead-letter-pile", "outbox", "100,000 dead letters", "off the relay's path"
       " (ix_outbox_live, NOT EXISTS): claim, probe and gauges read only live rows; purged"
       " after dead_letter_retention, `safetynet replay` puts one back", RELAY,
       dead_letter_pile, Read.COUNTS, '{"published": 3}'),
    _c("db-notify-storm", "outbox", "20,000 NOTIFY safetynet_outbox from any login",
       "coalesced: at most one relay wake-up per notify_min_interval, the last one after"
       " the storm", RELAY, notify_storm, Read.PLANTED, "coalesced: "),
    _c("db-search-path-hijack", "messenger", "public.left(varchar, int) planted, CREATE on"
       " public granted", "never called: functions pin search_path or are bound at"
       " creation, sessions pin search_path", FIN, hijack_left, Read.LAST_ERROR,
       "session_kind_unknown:Webinar"),
    # --------------------------------------------------------------- media responses
    _c("media-stop-500", "media", "recorder stop API answers 500",
       "logged and counted; the closed room and its event stay committed", REAP, media("500"),
       Read.LOG, "500", "recorder_stop_failed"),
    _c("media-stop-timeout", "media", "recorder stop API never answers",
       "timeout after media.timeout; logged and counted; the batch stays committed", REAP,
       media("hang"), Read.LOG, "timeout", "recorder_stop_failed"),
    _c("media-stop-garbage", "media", "recorder stop API answers bytes that are not HTTP",
       "logged as a connection error and counted; the batch stays committed", REAP,
       media("garbage"), Read.LOG, "connection:", "recorder_stop_failed"),
    _c("media-unreachable", "media", "media.base_url points at a closed port",
       "every stop logged as a connection error; the batch stays committed", REAP,
       media("unreachable"), Read.LOG, "connection:", "recorder_stop_failed"),
    # ------------------------------------------------- the operator console (issue #38)
    _c("console-proxy-no-secret", "console", "a local process sends X-Forwarded-User: root"
       " to a proxy_header console from a trusted address, without the proxy's secret",
       "refused (403): only a request carrying console.proxy_secret came through the"
       " proxy", TOOL, cp.proxy_without_secret, Read.OUTPUT,
       "403 requests are accepted only through the authenticating proxy"),
    _c("console-proxy-user-repeated", "console", "X-Forwarded-User twice (ana, then root)"
       " through the proxy", "refused (400), never the last copy", TOOL,
       cp.proxy_user_repeated, Read.OUTPUT, "400 more than one X-Forwarded-User header"),
    _c("console-host-rebinding", "console", "a DNS-rebinding page: Host rebind.evil.test",
       "refused (400) before the login is checked: Host must be the listen address or"
       " console.public_origin's", TOOL, cp.host_rebinding, Read.OUTPUT, "400 unknown Host"),
    _c("console-pause-for-prose", "console", 'a pause "for" of "2 hours"', "the"
       " confirmation shown again with the error (400); nothing paused, nothing recorded",
       TOOL, cp.pause_for_prose, Read.OUTPUT, "400 for: malformed duration '2 hours'"),
    _c("console-replay-id-superscript", "console", "replay of the outbox id '²' (isdigit()"
       " is true)", "the confirmation shown again with the error (400); nothing replayed",
       TOOL, cp.replay_superscript_id, Read.OUTPUT,
       "400 ids: must be a whole number from 1 to 9223372036854775807, got '²'"),
    _c("console-history-since-huge", "console", "the history page with since=1000000d",
       "the filter form shown again with the error (400), never a 500", TOOL,
       cp.history_since_huge, Read.OUTPUT, "400 since: must be a duration back from now"
       " (24h) or an ISO date/time after the year 1, got '1000000d'"),
    _c("cli-history-since-huge", "console", "`safetynet history --since 1000000d`",
       "a usage error naming --since (exit 2), never a traceback", TOOL,
       cp.history_cli_since_huge, Read.OUTPUT, "exit 2: Error: Invalid value for"
       " --since: a duration (24h) or an ISO date/time after the year 1"),
    _c("cli-replay-superscript", "console", "`safetynet replay ²` ('²'.isdigit() is true,"
       " int('²') fails)", "named as not a dead letter (exit 2), nothing changed, the"
       " refusal recorded; never a traceback", TOOL, cp.replay_cli_superscript, Read.OUTPUT,
       "exit 2: error: not dead letters, nothing changed: "),
    _c("console-form-multipart", "console", "an action posted as multipart/form-data with"
       " a file", "refused (415) unread: nothing spooled to disk, nothing acted", TOOL,
       cp.form_multipart, Read.OUTPUT,
       "415 only application/x-www-form-urlencoded forms are accepted"),
    _c("console-form-1mib", "console", "an action form of 1 MiB, chunked (no"
       " Content-Length)", "refused (413) once 64 KiB are read; nothing acted", TOOL,
       cp.form_one_mib, Read.OUTPUT, "413 a form is at most 65536 bytes"),
    _c("console-outbox-payload-40mb", "console", "/outbox/ID of a row whose payload is"
       " 40 MB", "a 64 Ki-character preview and the size (SQL left()/octet_length()), a"
       " page under 200 kB", TOOL, cp.payload_40mb, Read.OUTPUT,
       "200 40,000,012 bytes: the first 65,536 characters, as stored"),
    _c("console-metrics-endless", "console", "the daemon at http.listen answers /metrics"
       " with an endless body", "the read stops at 2 MiB; the overview says why and"
       " shows the rest from PostgreSQL", TOOL, cp.metrics_endless, Read.OUTPUT,
       "200 Its metrics (http://<daemon>/metrics) do not answer: metrics larger than"
       " 2097152 bytes"),
    _c("console-audit-by-get", "console", "GET /audit?run=1 twenty times (a cross-site"
       " <img>), then two audit POSTs at once", "no GET runs the audit; the first POST"
       " runs it, the second is refused (429, Retry-After)", TOOL, cp.audit_by_get,
       Read.OUTPUT, "200 Not judged since this console started.; POST 303, at once again"
       " 429"),
    _c("console-basic-wide-listen", "console", "auth = basic on listen 0.0.0.0 without"
       " console.public_origin", "`safetynet console` exits 78 naming the key, serves"
       " nothing", TOOL, cp.console_process({"listen": "0.0.0.0:9470", "user": "u",
                                             "password_hash": cp.GOOD_HASH}),
       Read.OUTPUT, "exit 78: config error: console.public_origin: required when"
       " console.auth = basic and console.listen is not loopback (0.0.0.0:9470)"),
    _c("console-hash-cheap", "console", "console.password_hash with scrypt N = 2^10",
       EXIT_78, TOOL, cp.console_process({"user": "u", "password_hash": cp.CHEAP_HASH}),
       Read.OUTPUT, "exit 78: config error: console.password_hash: scrypt N = 1024 is too"
       " cheap"),
    _c("console-proxy-no-secret-config", "console", "auth = proxy_header without"
       " console.proxy_secret", "`safetynet console` exits 78 naming the key", TOOL,
       cp.console_process({"auth": "proxy_header", "trusted_proxies": ["127.0.0.1"]}),
       Read.OUTPUT, "exit 78: config error: console.proxy_secret: required when"
       " console.auth = proxy_header"),
    _c("console-incident-since-prose", "console", 'an incident filter "since" of "2 hours"',
       "the filter form shown again with the error (400); nothing previewed or acted", TOOL,
       cp.incident_since_prose, Read.OUTPUT, "400 since: must be a duration back from now"
       " (24h) or an ISO date/time after the year 1, got '2 hours'"),
    _c("console-incident-status-unknown", "console", "an incident requeue filtered on"
       " status Done", "the filter form shown again naming status (400), never a silent"
       " default", TOOL, cp.incident_status_unknown, Read.OUTPUT,
       "400 status: must be one of Quarantined, Pending, got 'Done'"),
    _c("console-incident-foreign-field", "console", "an incident requeue filtered on a"
       " topic (a replay's filter)", "refused naming topic (400), not ignored", TOOL,
       cp.incident_field_of_another_verb, Read.OUTPUT, "400 topic: is not a filter of"
       " requeue"),
    _c("console-incident-snapshot-forged", "console", "an incident act naming a snapshot"
       " this console never made", "refused (410): preview again; nothing acted", TOOL,
       cp.incident_snapshot_forged, Read.OUTPUT, "410 this snapshot is unknown here"),
    _c("console-incident-page-superscript", "console", "an incident act of page '²'",
       "refused naming page (400); nothing acted", TOOL, cp.incident_page_superscript,
       Read.OUTPUT, "400 page: must be a whole number from 1 to 9223372036854775807, got"
       " '²'"),
    _c("cli-incident-since-huge", "console", "`safetynet requeue --incident I --since"
       " 1000000d --preview`", "a usage error naming --since (exit 2), never a traceback",
       TOOL, cp.incident_cli_since_huge, Read.OUTPUT, "exit 2: Error: Invalid value for"
       " --since: must be a duration back from now (24h) or an ISO date/time after the"
       " year 1"),
]
