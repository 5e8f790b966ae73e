"""The floor plan holds: each floor imports only the floors below it.

    bench/                benchmarks: may use everything, but no private name
    supervision/app/      composition root: tree, daemon wiring, CLI, console; its own SQL
    supervision/dev/      dev tooling: the embedded stack, the outage proxy, uploads
    actors/<job>/         one package per job: finalize, reaper, outbox, audit
    actors/<service>/     what jobs share: leases (lock keeper, scan leader), kafka, s3
    actors/*.py           the actors' common ground: envelope, cycle frame, gauges, tracing
    supervision/db/       the database layer: connections, Database, migrations, the
                          schema contract, the query loader and its SQL
    supervision/tree/     the supervision tree proper: specs, supervisor, shielding,
                          runtime, ticker, wakeup, bridge, health, backoff, systemd notify
    supervision/config/   the config framework: loader, fields, sections, checks
    supervision/*.py      the base: errors, jobs, durations, secrets, logs, metrics, tls

The tree and the config framework stand on the base alone; the database layer on those
three; the actors and the dev tooling on everything below them and never on each other; the
app on all of it. Inside ``actors/`` a job never imports another job's package: what two jobs
share lives in a service package or in the common modules, which import no job. Each job's
config section lives in its ``actors/<job>/settings.py`` (the runtime defines none; the app's
``supervision/app/settings.py`` gathers them), which imports the config framework only.

Every import (module level or inside a function, under ``TYPE_CHECKING`` too) is read from
the source with ``ast``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# each floor and the floors it may import (its own included); bench is unconstrained
ALLOWED = {
    "base": {"base"},
    "tree": {"base", "tree"},
    "config": {"base", "config"},
    "db": {"base", "tree", "config", "db"},
    "actors": {"base", "tree", "config", "db", "actors"},
    "dev": {"base", "tree", "config", "db", "dev"},
    "app": {"base", "tree", "config", "db", "actors", "dev", "app"},
}
FLOORS = ("tree", "config", "db", "app", "dev")
# loose modules at supervision/'s root: the base floor stays small
MAX_LOOSE_MODULES = 10


JOBS = frozenset({"finalize", "reaper", "outbox", "audit"})
SERVICES = frozenset({"leases", "kafka", "s3"})


def layer(module: str) -> str | None:
    """The floor a dotted module name belongs to (None: not ours)."""
    parts = module.split(".")
    if parts[0] in ("bench", "actors"):
        return parts[0]
    if parts[0] != "supervision":
        return None
    if len(parts) > 1 and parts[1] in FLOORS:
        return parts[1]
    return "base"


def actor_room(module: str) -> str | None:
    """The package of ``actors`` a module belongs to: a job, a service or ``common``."""
    parts = module.split(".")
    if parts[0] != "actors":
        return None
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in JOBS | SERVICES):
        return parts[1]
    return "common"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) for every absolute import in *source*."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def violations(module: str, source: str) -> list[str]:
    """Each import of *module* that breaks the floor plan, as one line."""
    own = layer(module)
    out = []
    for target, names in imports(source):
        theirs = layer(target)
        if theirs is None:
            continue
        if own in ALLOWED and theirs not in ALLOWED[own]:
            out.append(f"{module} ({own}) imports {target} ({theirs})")
        mine, other = actor_room(module), actor_room(target)
        if mine is not None and other is not None and mine != other and (
                other in JOBS or (mine in SERVICES | {"common"} and other not in SERVICES)):
            out.append(f"{module} ({mine}) imports {target} ({other})")
        private = [n for n in names if is_private(n)]
        if private and target != module:
            out.append(f"{module} imports private {target}.{', '.join(private)}")
    out.extend(f"{module} uses private {target}.{attr}"
               for target, attr in private_attributes(source) if target != module)
    return out


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_attributes(source: str) -> list[tuple[str, str]]:
    """(module, name) for each ``alias._name`` read through an imported module of ours
    (``from supervision.app import cli`` then ``cli._load``)."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and layer(node.module) is not None:
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names
                          if a.asname and layer(a.name) is not None})
    return [(bound[node.value.id], node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in bound and is_private(node.attr)]


def sources() -> list[Path]:
    return sorted(p for top in ("actors", "supervision", "bench")
                  for p in (ROOT / top).rglob("*.py"))


def test_no_module_imports_across_the_floor_plan() -> None:
    """Each floor imports only the floors below it (the tree and the config framework the
    base alone, the database layer no actor, no actor the app or dev tooling); no job imports
    another job; nobody (benchmarks included) imports another module's private names."""
    found = [v for p in sources() for v in violations(module_name(p), p.read_text())]
    assert found == []


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("supervision.db.database", "from actors.leases.lock_keeper import LockedJob",
     "supervision.db.database (db) imports actors.leases.lock_keeper (actors)"),
    ("supervision.config", "def f():\n    import supervision.app.cli",
     "supervision.config (config) imports supervision.app.cli (app)"),
    ("supervision.tree.supervisor", "from supervision.db.database import Database",
     "supervision.tree.supervisor (tree) imports supervision.db.database (db)"),
    ("supervision.tree.runtime", "from supervision.config import Config",
     "supervision.tree.runtime (tree) imports supervision.config (config)"),
    ("supervision.tree.health", "from actors.envelope import TOPICS",
     "supervision.tree.health (tree) imports actors.envelope (actors)"),
    ("supervision.config.sections", "from supervision.tree.backoff import Backoff",
     "supervision.config.sections (config) imports supervision.tree.backoff (tree)"),
    ("supervision.errors", "from supervision.config import Config",
     "supervision.errors (base) imports supervision.config (config)"),
    ("supervision.db.migrate", "from supervision.app.trail import record",
     "supervision.db.migrate (db) imports supervision.app.trail (app)"),
    ("actors.outbox.relay", "from supervision.dev.stack import DevStack",
     "actors.outbox.relay (actors) imports supervision.dev.stack (dev)"),
    ("supervision.dev.stack", "from actors.s3 import wire",
     "supervision.dev.stack (dev) imports actors.s3 (actors)"),
    ("supervision.app.daemon", "from actors.leases.lock_keeper import _Private",
     "supervision.app.daemon imports private actors.leases.lock_keeper._Private"),
    ("actors.audit.invariants", "from actors.finalize.store import claim_due",
     "actors.audit.invariants (audit) imports actors.finalize.store (finalize)"),
    ("actors.kafka.producer", "from actors.outbox.rows import Row",
     "actors.kafka.producer (kafka) imports actors.outbox.rows (outbox)"),
    ("actors.envelope", "from actors.reaper.messages import PHASES",
     "actors.envelope (common) imports actors.reaper.messages (reaper)"),
    ("actors.audit.settings", "from actors.finalize.settings import RecordingFinalizeConfig",
     "actors.audit.settings (audit) imports actors.finalize.settings (finalize)"),
    ("bench.scale", "from supervision.dev.stack import _pg_bin_dir",
     "bench.scale imports private supervision.dev.stack._pg_bin_dir"),
    ("supervision.app.console.commands",
     "def f():\n    from supervision.app import cli\n    return cli._load([])",
     "supervision.app.console.commands uses private supervision.app.cli._load"),
])
def test_the_layer_check_flags_each_kind_of_violation(
        module: str, source: str, expected: str) -> None:
    """The check above is not vacuous: each forbidden direction is reported."""
    assert violations(module, source) == [expected]


JOB_SECTION = re.compile(r"(Finalize|Reaper|OutboxRelay|Audit|Jobs)Config$")
# what a job's settings module may import: the config framework, never an actor
SETTINGS_IMPORTS = ("__future__", "collections.abc", "typing", "attrs",
                    "supervision.config", "supervision.durations")


def classes_defined(path: Path) -> list[str]:
    return [node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)]


def test_no_job_section_is_defined_below_the_app() -> None:
    """Each job's config section lives with its job (``actors/<job>/settings.py``) and the
    root that gathers them in the app: no module of the lower floors defines one."""
    runtime = [p for p in (ROOT / "supervision").rglob("*.py")
               if layer(module_name(p)) in ("base", "tree", "config", "db")]
    job_sections = {name for job in JOBS
                    for name in classes_defined(ROOT / "actors" / job / "settings.py")}
    assert job_sections >= {"RecordingFinalizeConfig", "ConferenceReaperConfig",
                            "OutboxRelayConfig", "AuditConfig"}
    found = [f"{module_name(p)}.{name}" for p in runtime for name in classes_defined(p)
             if name in job_sections or JOB_SECTION.search(name)]
    assert found == []


def test_a_jobs_settings_module_imports_only_the_config_framework() -> None:
    """Loading the configuration imports each job's settings module and nothing else of
    the job: a settings module imports attrs, the standard typing helpers and the
    runtime's config building blocks only."""
    found = [f"actors.{job}.settings imports {target}" for job in sorted(JOBS)
             for target, _ in imports((ROOT / "actors" / job / "settings.py").read_text())
             if not any(target == ok or target.startswith(f"{ok}.") for ok in SETTINGS_IMPORTS)]
    assert found == []
    assert all((ROOT / "actors" / job / "__init__.py").read_text().strip() == ""
               for job in JOBS)


def test_supervisions_root_holds_only_the_small_base() -> None:
    """The floors are sub-packages; at most ten loose modules stay at ``supervision/``'s root
    (the base every floor may use), and every floor named in the plan exists."""
    loose = sorted(p.name for p in (ROOT / "supervision").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    assert all((ROOT / "supervision" / floor / "__init__.py").is_file() for floor in FLOORS)


def test_the_app_may_import_everything() -> None:
    """The composition root is allowed to know the runtime, the actors and dev tooling."""
    source = ("from actors.leases.lock_keeper import LockedJob\n"
              "from supervision.dev.stack import DevStack\n"
              "from supervision.db.database import Database\n")
    assert violations("supervision.app.devrun", source) == []


def test_only_safetynet_provides_its_top_level_import_names() -> None:
    """``actors`` and ``supervision`` are generic names (a computer-vision distribution on
    PyPI is also called ``supervision``): no other installed distribution may provide
    them, or one would shadow the other. safetynet belongs in its own virtualenv/image."""
    from importlib.metadata import packages_distributions

    providers = packages_distributions()
    for name in ("actors", "supervision"):
        others = sorted(set(providers.get(name, [])) - {"safetynet"})
        assert others == [], f"{name!r} is also provided by {others}"


def test_only_the_scan_leader_sets_the_leader_gauges_standby() -> None:
    """The database-wide gauges are the scan leader's: no other module of the house
    assigns ``LEADER_GAUGES.standby`` (the tree asks the scan leader to stand by)."""
    assigning = re.compile(r"LEADER_GAUGES\.standby\s*=")
    found = [module_name(p) for p in sources() if assigning.search(p.read_text())]
    assert found == ["actors.leases.scan_leader"]
