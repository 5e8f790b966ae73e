"""The floor plan holds: the runtime stands alone, the app is the only code that knows both.

    supervision/app/   composition root: tree, daemon wiring, CLI and its verbs
    actors/            one actor per module (actors/s3/: the S3 client they use)
    supervision/dev/   dev tooling: the embedded stack, the outage proxy
    supervision/       the generic runtime: specs, supervisor, database, config, SQL

Every import (module level or inside a function) is read from the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (layer of the importing module, layer it must never import)
FORBIDDEN = {
    ("runtime", "actors"), ("runtime", "app"), ("runtime", "dev"),
    ("dev", "actors"), ("dev", "app"),
    ("actors", "app"), ("actors", "dev"),
}


def layer(module: str) -> str | None:
    """The layer a dotted module name belongs to (None: not ours)."""
    parts = module.split(".")
    if parts[0] == "actors":
        return "actors"
    if parts[0] != "supervision":
        return None
    if len(parts) > 1 and parts[1] in ("app", "dev"):
        return parts[1]
    return "runtime"


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
        if (own, theirs) in FORBIDDEN:
            out.append(f"{module} ({own}) imports {target} ({theirs})")
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private and target != module:
            out.append(f"{module} imports private {target}.{', '.join(private)}")
    return out


def sources() -> list[Path]:
    return sorted(p for top in ("actors", "supervision") for p in (ROOT / top).rglob("*.py"))


def test_no_module_imports_across_the_floor_plan() -> None:
    """No runtime module imports an actor, the app or dev tooling; no actor imports the
    app; nobody imports another module's private names."""
    found = [v for p in sources() for v in violations(module_name(p), p.read_text())]
    assert found == []


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("supervision.database", "from actors.lock_keeper import LockedJob",
     "supervision.database (runtime) imports actors.lock_keeper (actors)"),
    ("supervision.config", "def f():\n    import supervision.app.cli",
     "supervision.config (runtime) imports supervision.app.cli (app)"),
    ("actors.outbox_relay", "from supervision.dev.stack import DevStack",
     "actors.outbox_relay (actors) imports supervision.dev.stack (dev)"),
    ("supervision.dev.stack", "from actors.s3 import wire",
     "supervision.dev.stack (dev) imports actors.s3 (actors)"),
    ("supervision.app.daemon", "from actors.lock_keeper import _Private",
     "supervision.app.daemon imports private actors.lock_keeper._Private"),
])
def test_the_layer_check_flags_each_kind_of_violation(
        module: str, source: str, expected: str) -> None:
    """The check above is not vacuous: each forbidden direction is reported."""
    assert violations(module, source) == [expected]


def test_the_app_may_import_everything() -> None:
    """The composition root is allowed to know the runtime, the actors and dev tooling."""
    source = ("from actors.lock_keeper import LockedJob\n"
              "from supervision.dev.stack import DevStack\n"
              "from supervision.database import Database\n")
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
