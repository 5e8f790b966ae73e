"""The Kafka outbox relay's section, ``[outbox_relay]``.

>>> OutboxRelayConfig().claim_max_bytes
16777216

The relay holds a lease (:class:`~supervision.config.Leased`: the PostgreSQL timeouts stay
below its ``lock_ttl``) but is no cycle-bounded job: a relay cycle runs at most half of its
TTL. Imports attrs and the runtime's config building blocks only: loading the
configuration never imports the relay (nor aiokafka).
"""

from __future__ import annotations

from typing import Any

import attrs

from supervision.config.fields import (
    DAY,
    MAX_BATCH,
    MINUTE,
    non_negative,
    one_of,
    positive,
    setting,
)
from supervision.config.leased import Leased
from supervision.config.values import bounded_repr

_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_FIRST | frozenset("0123456789")


def sql_name(value: Any) -> str | None:
    """A slot or publication name: PostgreSQL takes a slot's name as it is and folds an
    unquoted publication name to lower case, so both are kept to what needs no quoting."""
    if (isinstance(value, str) and 0 < len(value) <= 63 and value[0] in _NAME_FIRST
            and set(value) <= _NAME_CHARS):
        return None
    return ("must be 1-63 lower-case letters, digits and _ (not starting with a digit); "
            f"got {bounded_repr(value)}")


@attrs.frozen
class OutboxRelayConfig(Leased):
    enabled: bool = setting(True, "Run the Kafka outbox relay.")
    batch_size: int = setting(500, "Outbox rows claimed per batch.", checks=[positive],
                               maximum=MAX_BATCH)
    poll_interval: float = setting(
        1.0, "Fallback poll period; LISTEN/NOTIFY wakes the relay sooner.", duration=True,
        checks=[positive], maximum=5 * MINUTE,
    )
    retention: float = setting(
        604800.0, "Published rows older than this are deleted.", duration=True,
        checks=[positive], maximum=365 * DAY,
    )
    retention_enabled: bool = setting(
        True, "Delete published rows older than retention (through the ix_outbox_published "
        "index); false when the messenger owns its outbox's retention.")
    wakeup: str = setting(
        "notify", "How relays learn of new outbox rows: `notify` (`safetynet migrate` "
        "installs a statement-level NOTIFY trigger on messenger.integration_outbox, polling "
        "stays the fallback) or `poll` (no trigger on the messenger's table: migrate drops "
        "it; rows wait up to poll_interval).", checks=[one_of("notify", "poll")])
    lock_ttl: float = setting(
        60.0, "TTL of the relay's lease (renewed every lock_ttl/4 while a cycle runs; a "
        "frozen leader is replaced this long after its last renewal). A relay cycle runs "
        "at most half of it.", duration=True, checks=[positive], maximum=DAY,
    )
    claim_max_bytes: int = setting(
        16 * 1024 * 1024, "Bytes of outbox rows (payload, headers, key) one claim fetches at "
        "most; a claim stops before the row that would pass it (its first row always comes). "
        "The relay holds about two claims, so its memory stays bounded whatever the rows "
        "hold. A row larger than the producer's max request size (1 MiB) is dead-lettered "
        "without its payload being fetched.", checks=[positive], maximum=1024 * 1024 * 1024,
    )
    dead_letter_retention: float = setting(
        2592000.0, "Dead letters older than this are deleted together with their outbox "
        "row, unless one still blocks later rows of its key (`safetynet replay` puts one "
        "back instead).", duration=True, checks=[positive], maximum=365 * DAY,
    )
    source: str = setting(
        "table", "Where the relay reads the outbox: `table` (claims rows and marks them "
        "published: three writes of the messenger's table per event) or `logical` (reads "
        "the inserts from a logical replication slot through pgoutput and writes nothing "
        "to the outbox per event; needs wal_level = logical, the publication and the slot: "
        "docs/operations.md).", checks=[one_of("table", "logical")])
    slot: str = setting(
        "safetynet_outbox", "The logical replication slot the logical source reads (one "
        "per database; lower-case letters, digits and _).", checks=[sql_name])
    publication: str = setting(
        "safetynet_outbox", "The publication of messenger.integration_outbox's inserts "
        "the logical source reads (lower-case letters, digits and _).", checks=[sql_name])
    notify_min_interval: float = setting(
        0.05, "Shortest time between two relay wake-ups from NOTIFY safetynet_outbox; "
        "notifications in between are coalesced into one wake-up at its end (any login may "
        "NOTIFY).", duration=True, checks=[non_negative], maximum=MINUTE,
    )
