"""The console's outbox page shows the two lag figures (issue 37, item 3): commit to
Kafka's acknowledgement from the daemon's metrics, and in the logical source the WAL the
slot retains, or that the slot is missing."""

from __future__ import annotations

import attrs
import psycopg
from psycopg import sql

from actors.outbox.logical_setup import LogicalSource
from supervision.app.console.daemon_metrics import DaemonView
from tests.integration.app.console.support import console_config
from tests.integration.app.console.test_console_asgi import client_for
from tests.integration.outbox.test_outbox_logical import source

__all__ = ["source"]  # the fixture: a publication and slot of this test's own


async def test_the_outbox_page_shows_the_slots_retained_wal_then_that_it_is_missing(
        db_dsn: str, source: LogicalSource) -> None:
    base = console_config(db_dsn)
    cfg = attrs.evolve(base, outbox_relay=attrs.evolve(
        base.outbox_relay, source="logical", slot=source.slot,
        publication=source.publication))
    async for client in client_for(cfg):
        page = (await client.get("/outbox")).text
        assert f"replication slot {source.slot}: retains" in page
        assert "MiB of WAL (reserved)" in page
        assert "no event delivered by this host" in page  # no daemon on that port
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SELECT pg_drop_replication_slot({})").format(
                sql.Literal(source.slot)))
        page = (await client.get("/outbox")).text
        assert f"replication slot {source.slot}: (missing)" in page


def test_the_daemon_view_has_no_delivery_figure_by_default() -> None:
    assert DaemonView("u").delivery is None


async def test_in_the_logical_source_the_unpublished_list_shows_what_the_slot_has_not_passed(
        db_dsn: str, source: LogicalSource) -> None:
    """Rows the slot passed (below the recorded transaction id) are not listed as
    unpublished, nor counted; a row written after the record is."""
    base = console_config(db_dsn)
    cfg = attrs.evolve(base, outbox_relay=attrs.evolve(
        base.outbox_relay, source="logical", slot=source.slot,
        publication=source.publication))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        insert = ("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
                  " event_type, payload) VALUES ('t', %s, %s, 'e', '{}') RETURNING id")
        passed = [conn.execute(insert, ("k", f"d{n}")).fetchone()[0]  # type: ignore[index]
                  for n in range(3)]
        conn.execute("UPDATE safetynet.outbox_relay_source SET passed_xid ="
                     " pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        (waiting,) = conn.execute(insert, ("k", "d9")).fetchone()  # type: ignore[misc]
    async for client in client_for(cfg):
        page = (await client.get("/outbox")).text
    assert f'href="/outbox/{waiting}"' in page
    assert not any(f'href="/outbox/{p}"' in page for p in passed)
    assert "unpublished 1 ·" in page
