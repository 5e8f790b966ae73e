"""``safetynet accept-missing``: an operator accepts Missing verdicts without evidence.

>>> accept_missing(conn, "call-recordings", "call-recordings/", 3600, "INC-42", operator())
Accepted(accepted_at=..., accepted_until=..., accepted_by='ops@host', reason='INC-42')

recording-finalize withholds a Missing (Failed/Timeout) verdict when nothing shows that
its configuration points where the binaries are (issue #25, ``actors.finalize.evidence``).
When the operator has checked that the incident is genuine — nothing was ever uploaded
under the prefix, e.g. the recorder failed on a fresh install — this records, in
``safetynet.missing_verdict_acceptances`` (migration 0013), that 404s under this bucket
and prefix mean "not uploaded" until a time at most :data:`MAX_ACCEPT` away. Every
replica's next cycle reads it; it never outlives its expiry and does not follow a change
of ``s3.bucket`` or ``s3.key_prefix``. ``--revoke`` ends it early.
"""

from __future__ import annotations

import datetime as dt

import attrs
import psycopg

from actors.finalize.queries import FINALIZE_QUERIES

MAX_ACCEPT = 24 * 3600.0  # an acceptance is for an incident, not a standing setting


@attrs.frozen
class Accepted:
    accepted_at: dt.datetime
    accepted_until: dt.datetime
    accepted_by: str
    reason: str


def accept_missing(conn: psycopg.Connection, bucket: str, key_prefix: str, seconds: float,
                   reason: str, by: str) -> Accepted:
    """Accept Missing verdicts under *bucket*/*key_prefix* for *seconds* from now
    (replacing an acceptance already there)."""
    if not 0 < seconds <= MAX_ACCEPT:
        raise ValueError(f"must be > 0 and <= {MAX_ACCEPT / 3600:g}h, got {seconds:g}s")
    row = conn.execute(FINALIZE_QUERIES["missing_verdict_acceptances_put"], {
        "bucket": bucket, "key_prefix": key_prefix, "reason": reason, "seconds": seconds,
        "accepted_by": by}).fetchone()
    assert row is not None
    return Accepted(*row)


def revoke_missing(conn: psycopg.Connection, bucket: str, key_prefix: str
                   ) -> Accepted | None:
    """End the acceptance for *bucket*/*key_prefix*: the one it ended while in force,
    else None."""
    row = conn.execute(FINALIZE_QUERIES["missing_verdict_acceptances_revoke"],
                       {"bucket": bucket, "key_prefix": key_prefix}).fetchone()
    if row is None or not row[0]:
        return None
    return Accepted(*row[1:])
