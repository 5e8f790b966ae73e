"""An applied migration's text never changes (issue 36 item 2: an edit of the comments of
0001, 0002, 0008-0012 when the package was split into floors made migrate refuse every
database the release of 29e8e5b had migrated). Each released file's checksum is pinned
here; a change fails this test, whose fix is a new migration, or, for an edit that leaves
the SQL alone, the old checksum added to LEGACY_CHECKSUMS (supervision/db/migrate_plan.py)
and the pin updated. Pin a new migration once it is on main."""

from __future__ import annotations

from supervision.db.migrate_plan import LEGACY_CHECKSUMS, migrations

PINNED = {
    1: "137751bdd35c772981a702458a26a2ee1fdd392c7d9c810ae7b98c668664c5b5",
    2: "64d12518f1ff8d254d8ad71bb4de0562690a13a3a71576a8449ee3474c4eade1",
    3: "b08e09005aab86ec6309055729445b20284c644341e40c7c560d6887707b69d3",
    4: "b3c3f0429a86f228119a247d7c66d6b055f810c64c9c0ce81398d0d3b896e68e",
    5: "38c15d91f8ce93911dff6d2073c891e05704a6e37ecae9d09230d7c2872264e0",
    6: "b190c1b324c3fae373830daf028d3fc82db72463911d691de10a047e1b2acc2a",
    7: "c4fdb6b36647f3e453c72c92d84f119745d624c1a1b4fb8cf08666f875660d11",
    8: "733c1e64b563a1af77b43f83bd57bcd229014b552553a52fd955c5db76ce2aa7",
    9: "733c1e64b563a1af77b43f83bd57bcd229014b552553a52fd955c5db76ce2aa7",
    10: "733c1e64b563a1af77b43f83bd57bcd229014b552553a52fd955c5db76ce2aa7",
    11: "3fbf3f966774d58769af27611bf8a7a6325c9d5a260b4e7a8627931a0be14ab4",
    12: "b361e3fedebc1f1c742e085763fe05d19fe40c8e22d01f865307e50dfb97b9e9",
    13: "22763c1f8c78b481ec59aa6ef4937cb2c248093549267fa4d2e3004eb9247872",
    14: "8a6321c8fba52111eb98e980e12fbe4b2a7092c9c1def630c4f35b31c606166b",
    15: "e71115fae51be8de3942036f1a4f3942458af42edc7232c66033b335d582008f",
    17: "8e9991a1c743e47e65958469ec6198f334df436226f69295f1d955bc90d082a1",
}


def test_every_released_migration_keeps_its_text() -> None:
    changed = [m.label for m in migrations()
               if m.version in PINNED and m.checksum != PINNED[m.version]]
    assert changed == [], f"applied migrations edited: {changed} (see this module's doc)"
    assert set(PINNED) <= {m.version for m in migrations()}


def test_the_text_29e8e5b_applied_is_accepted_for_every_version_it_had() -> None:
    """The previous release's checksums (its files differ from today's in comments)."""
    previous = {1: "32d956f340deb1418bcb39b2e86619faa26a0ae87485dac722ec953a721787ca",
                11: "3893ac9973ccfbd8ad7d67a69debe624c5c4da623dbf9bca8c42361fbefd6391",
                12: "a100a0a488fd23f793dbb22a053053840580010792afd8bcc31e45fb58ea9d47"}
    known = {m.version: m for m in migrations()}
    assert all(known[v].accepts(c) and c in LEGACY_CHECKSUMS[v] for v, c in previous.items())
