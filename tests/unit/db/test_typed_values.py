"""Job names, lease states and phases are enums whose values are exactly the SQL's text."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from actors.leases.lease import PreviousState
from actors.reaper.messages import PHASES, PhaseName
from supervision.app.cli import main
from supervision.jobs import Job

MIGRATIONS = Path(__file__).parents[3] / "supervision" / "db" / "sql" / "migrations"


def newest_definition(function: str) -> str:
    """The SQL of the newest migration that (re)defines ``safetynet.<function>``."""
    pattern = re.compile(rf"CREATE (?:OR REPLACE )?FUNCTION safetynet\.{function}\(")
    text = ""
    for path in sorted(MIGRATIONS.glob("*.sql")):
        sql = path.read_text()
        match = pattern.search(sql)
        if match:
            text = sql[match.start():]
            text = text[:text.index("$$;") if "$$;" in text else text.index("END;\nEND;")]
    assert text, function
    return text


def test_previous_states_are_exactly_the_texts_lease_acquire_returns() -> None:
    """``lease_acquire``'s ``previous_state`` CASE yields the enum's values and no other,
    so a taken-over lease is never mistaken for a released one."""
    sql = newest_definition("lease_acquire")
    case = sql[sql.index("previous_state := CASE"):]
    case = case[:case.index("END;")]
    texts = {a or b for a, b in re.findall(r"THEN '([a-z_]+)'|ELSE '([a-z_]+)'", case)}
    assert texts == {state.value for state in PreviousState}


def test_reaper_phase_names_are_exactly_the_texts_conference_phase_returns() -> None:
    """``safetynet.conference_phase`` (what ``plan`` lists) names the reaper's phases by
    the enum's values, and the cycle runs one phase per name."""
    sql = newest_definition("conference_phase")
    texts = set(re.findall(r"THEN '([a-z-]+)'", sql))
    assert texts == {name.value for name in PhaseName}
    assert [phase.name for phase in PHASES] == list(PhaseName)


def test_cli_offers_every_job_by_its_contract_name_and_refuses_others() -> None:
    """``--job`` choices come from the Job enum: each value is accepted by the parser,
    an unknown name is refused with the list of the enum's values."""
    result = CliRunner().invoke(main, ["pause", "--job", "recording_finalize"])
    assert result.exit_code == 2
    for job in Job:
        assert f"'{job.value}'" in result.output
    assert "RECORDING_FINALIZE" not in result.output
