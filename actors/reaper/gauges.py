"""The conference-reaper job's database-derived gauge: conferences past their window, run
by the gauge refresher on the scan leader."""

from __future__ import annotations

import psycopg

from actors.reaper.metrics import CR_ACTIVE_BACKLOG
from actors.reaper.settings import ConferenceReaperConfig
from actors.reaper.store import active_backlog


def refresh_reaper_backlog(conn: psycopg.Connection, cfg: ConferenceReaperConfig) -> None:
    CR_ACTIVE_BACKLOG.set(active_backlog(conn, cfg))
