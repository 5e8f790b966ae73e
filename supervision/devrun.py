"""``safetynet dev``: the embedded stack, migrated, with the daemon running on it.

Starts PostgreSQL, Tansu and SeaweedFS on free loopback ports under a temp (or given)
directory, creates the ``messenger`` database and the recordings bucket, migrates, writes
``safetynet-dev.toml`` there (the demo settings of ``config/dev.toml`` plus the servers'
addresses), prints where everything listens, and runs ``safetynet run`` in-process until
Ctrl-C; then stops every server.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click
import psycopg
import tomli_w
import trio
from psycopg import sql

from supervision.config import Config, load_config
from supervision.devstack import DevStack, open_dev_stack
from supervision.logs import configure_logging
from supervision.migrate import migrate
from supervision.queries import QUERIES

DATABASE = "messenger"
BUCKET = "call-recordings"
DEV_SETTINGS = Path("config/dev.toml")


def dev_config(stack: DevStack, base_dir: Path) -> Path:
    """Write the stack's addresses as a config layer; return its path."""
    endpoints = stack.endpoints()
    assert stack.postgres is not None
    layer = {
        "postgres": {"dsn": stack.postgres.dsn_for(DATABASE)},
        "kafka": {"bootstrap_servers": endpoints.kafka_bootstrap},
        "s3": {"endpoint_url": endpoints.s3_endpoint, "region": endpoints.s3.region,
               "bucket": BUCKET, "access_key_id": endpoints.s3.access_key_id,
               "secret_access_key": endpoints.s3.secret_access_key},
    }
    path = base_dir / "safetynet-dev.toml"
    path.write_text(tomli_w.dumps(layer), encoding="utf-8")
    path.chmod(0o600)  # it holds the demo's credentials
    return path


def prepare(stack: DevStack) -> None:
    """Create the database and the bucket, then migrate."""
    assert stack.postgres is not None and stack.s3 is not None
    with psycopg.connect(stack.postgres.dsn, autocommit=True) as conn:
        exists = conn.execute(QUERIES["database_exists"], {"name": DATABASE}).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    migrate(stack.postgres.dsn_for(DATABASE))
    stack.s3.create_bucket(BUCKET)


def load_dev_config(layer: Path) -> Config:
    files = [DEV_SETTINGS, layer] if DEV_SETTINGS.exists() else [layer]
    return load_config(files, env={})


def run_dev(base_dir: Path | None) -> int:
    """Run the demo; return the process exit code."""
    with tempfile.TemporaryDirectory(prefix="safetynet-dev-") as tmp:
        root = base_dir or Path(tmp)
        click.echo(f"starting PostgreSQL, Tansu and SeaweedFS under {root} ...")
        with open_dev_stack(root) as stack:
            prepare(stack)
            layer = dev_config(stack, root)
            cfg = load_dev_config(layer)
            endpoints = stack.endpoints()
            click.echo(f"  postgres  {_redact(stack)}")
            click.echo(f"  kafka     {endpoints.kafka_bootstrap}")
            click.echo(f"  s3        {endpoints.s3_endpoint}  (bucket {BUCKET})")
            click.echo(f"  metrics   http://{cfg.http.listen}/metrics")
            click.echo(f"  config    {layer}")
            click.echo("running the daemon; Ctrl-C stops it and every server")
            configure_logging(cfg.logging.level, cfg.logging.format)
            from supervision.app import run_daemon

            code = trio.run(run_daemon, cfg)
        click.echo("stopped")
        return code


def _redact(stack: DevStack) -> str:
    from supervision.secrets import redact_dsn

    assert stack.postgres is not None
    return redact_dsn(stack.postgres.dsn_for(DATABASE))
