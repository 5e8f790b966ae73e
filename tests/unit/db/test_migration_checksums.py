"""An applied migration's text never changes, not even a comment (issue 36 item 2: an edit
of the comments of 0001, 0002, 0008-0012, paths renamed when the package was split into
floors, made migrate refuse every database the release of 29e8e5b had migrated; the files
are back byte for byte). Each released file's checksum is pinned here: a change fails this
test, and its fix is a new migration. Pin a new migration once it is on main."""

from __future__ import annotations

from supervision.db.migrate_plan import migrations

PINNED = {
    1: "32d956f340deb1418bcb39b2e86619faa26a0ae87485dac722ec953a721787ca",
    2: "2bd5c4bbd4c79f5c1c106a26b659bcfbde78b515cb49488f156796d4770e4c4b",
    3: "b08e09005aab86ec6309055729445b20284c644341e40c7c560d6887707b69d3",
    4: "b3c3f0429a86f228119a247d7c66d6b055f810c64c9c0ce81398d0d3b896e68e",
    5: "38c15d91f8ce93911dff6d2073c891e05704a6e37ecae9d09230d7c2872264e0",
    6: "b190c1b324c3fae373830daf028d3fc82db72463911d691de10a047e1b2acc2a",
    7: "c4fdb6b36647f3e453c72c92d84f119745d624c1a1b4fb8cf08666f875660d11",
    8: "0dd7a1229104680746c6f784a0e7df6262887c1e0ce78e88e5aee08d26f436f8",
    9: "0dd7a1229104680746c6f784a0e7df6262887c1e0ce78e88e5aee08d26f436f8",
    10: "0dd7a1229104680746c6f784a0e7df6262887c1e0ce78e88e5aee08d26f436f8",
    11: "3893ac9973ccfbd8ad7d67a69debe624c5c4da623dbf9bca8c42361fbefd6391",
    12: "a100a0a488fd23f793dbb22a053053840580010792afd8bcc31e45fb58ea9d47",
    13: "22763c1f8c78b481ec59aa6ef4937cb2c248093549267fa4d2e3004eb9247872",
    14: "8a6321c8fba52111eb98e980e12fbe4b2a7092c9c1def630c4f35b31c606166b",
    15: "e71115fae51be8de3942036f1a4f3942458af42edc7232c66033b335d582008f",
    16: "3979b120de18f5554d5034b505cbc54811e8123480874a80a1c9713453a51353",
    17: "8e9991a1c743e47e65958469ec6198f334df436226f69295f1d955bc90d082a1",
    18: "e491c29af76f6910cc10c2929284cd92f94c9bcdef8fd6b76bed66adde25b342",
}


def test_every_released_migration_keeps_its_text() -> None:
    changed = [m.label for m in migrations()
               if m.version in PINNED and m.checksum != PINNED[m.version]]
    assert changed == [], f"applied migrations edited: {changed} (see this module's doc)"
    assert set(PINNED) <= {m.version for m in migrations()}


def test_the_text_29e8e5b_applied_is_todays_for_every_version_it_had() -> None:
    """The previous release's files are today's, byte for byte (so its ledger's checksums
    match without any exception list)."""
    previous = {1: "32d956f340deb1418bcb39b2e86619faa26a0ae87485dac722ec953a721787ca",
                11: "3893ac9973ccfbd8ad7d67a69debe624c5c4da623dbf9bca8c42361fbefd6391",
                12: "a100a0a488fd23f793dbb22a053053840580010792afd8bcc31e45fb58ea9d47"}
    known = {m.version: m for m in migrations()}
    assert all(known[v].checksum == c for v, c in previous.items())
