"""What ships to deploy safetynet: the Kubernetes manifests (valid for the pinned
Kubernetes, offline; the two Prometheus Operator resources against our schemas of their
CRDs), the PrometheusRule generated from the alert rules, the systemd unit, the image's
configuration and build context."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from supervision.passwords import hash_password

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "kubernetes"
UNIT = ROOT / "deploy" / "systemd" / "safetynet.service"
# The Kubernetes release the manifests are validated against (kubernetes-validate ships
# the JSON schemas of each release; see docs/operations.md, "Kubernetes").
KUBERNETES_VERSION = "1.32.0"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

_spec = importlib.util.spec_from_file_location(
    "generate_prometheusrule", K8S / "generate_prometheusrule.py")
assert _spec is not None and _spec.loader is not None
generate_prometheusrule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate_prometheusrule)

# Our schemas of the two Prometheus Operator CRDs (monitoring.coreos.com/v1), for the
# fields these manifests use, written from the CRDs' openAPIV3Schema. Stricter than the
# CRDs (no unknown field, durations as the operator's pattern), so a misspelt key fails
# here instead of being dropped by the API server.
DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                       r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1},
                           "labels": STRING_MAP, "annotations": STRING_MAP,
                           "namespace": {"type": "string"}},
            "additionalProperties": False}


def _resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"},
                           "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
            "additionalProperties": False}


SERVICE_MONITOR = _resource("ServiceMonitor", {
    "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
    "properties": {
        "selector": {"type": "object", "additionalProperties": False,
                     "properties": {"matchLabels": STRING_MAP}},
        "namespaceSelector": {"type": "object"},
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                           "scheme": {"enum": ["http", "https"]},
                           "interval": DURATION, "scrapeTimeout": DURATION,
                           "honorLabels": {"type": "boolean"}}}},
    }})
PROMETHEUS_RULE = _resource("PrometheusRule", {
    "type": "object", "required": ["groups"], "additionalProperties": False,
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["name", "rules"], "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1}, "interval": DURATION,
            "rules": {"type": "array", "items": {
                "type": "object", "required": ["expr"], "additionalProperties": False,
                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                "properties": {"alert": {"type": "string"}, "record": {"type": "string"},
                               "expr": {"type": "string"}, "for": DURATION,
                               "labels": STRING_MAP, "annotations": STRING_MAP}}}}}}}})
CRD_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def resources() -> dict[tuple[str, str], dict[str, Any]]:
    """Every resource of deploy/kubernetes/*.yaml by (kind, name)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in found, f"two {key}"
                found[key] = doc
    return found


# the daemon's own resources, one of each kind; the console's and the network policies
# are found by name (resources())
DAEMON_NAMES = {"safetynet", "safetynet-config", "safetynet-migrate"}


def manifests() -> dict[str, dict[str, Any]]:
    """The daemon's resources by kind (one of each)."""
    return {kind: doc for (kind, name), doc in resources().items()
            if name in DAEMON_NAMES and kind != "NetworkPolicy"}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any attempt to open a network connection fails the test."""
    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"network access attempted: {address}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield


def pod(kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = manifests()[kind]["spec"]["template"]["spec"]
    return spec


def daemon_config() -> dict[str, Any]:
    return tomllib.loads(manifests()["ConfigMap"]["data"]["config.toml"])


def test_manifests_validate_strictly_against_the_pinned_kubernetes_offline(
        offline: None) -> None:
    """Every built-in resource passes kubernetes-validate's strict schema of the pinned
    release, from the schemas the package ships (no network)."""
    validated = set()
    for (kind, _), doc in resources().items():
        if kind in CRD_KINDS:
            continue
        assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == "1.32"
        validated.add(kind)
    assert validated == {"ConfigMap", "Deployment", "Job", "NetworkPolicy",
                         "PodDisruptionBudget", "Service", "ServiceAccount"}


def test_kubernetes_validate_rejects_a_misspelt_field(offline: None) -> None:
    """The validation bites: a misspelt container field fails it."""
    doc = copy.deepcopy(manifests()["Deployment"])
    context = doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    context["readOnlyRootFileSystem"] = context.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_custom_resources_match_our_schemas_of_their_crds() -> None:
    """ServiceMonitor and PrometheusRule (CRDs, unknown to kubernetes-validate) pass our
    schemas of them, and a misspelt field does not."""
    found = manifests()
    for kind, schema in CRD_SCHEMAS.items():
        jsonschema.Draft202012Validator(schema).validate(found[kind])
    bad = copy.deepcopy(found["ServiceMonitor"])
    bad["spec"]["endpoints"][0]["honorlabels"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SERVICE_MONITOR).validate(bad)
    bad = copy.deepcopy(found["PrometheusRule"])
    bad["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(PROMETHEUS_RULE).validate(bad)


def test_prometheusrule_is_generated_from_the_alert_rules() -> None:
    """The committed PrometheusRule is exactly what the generator prints, and its groups
    are the rule file's (the ones promtool's unit tests prove)."""
    committed = generate_prometheusrule.MANIFEST.read_text()
    assert committed == generate_prometheusrule.render(), \
        "run python deploy/kubernetes/generate_prometheusrule.py"
    alerts = yaml.safe_load(generate_prometheusrule.ALERTS.read_text())
    assert yaml.safe_load(committed)["spec"]["groups"] == alerts["groups"]


def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    """The rule groups as the operator hands them to Prometheus pass `promtool check
    rules`."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed: .ci/run installs Debian's prometheus package")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": manifests()["PrometheusRule"]["spec"]["groups"]}))
    proc = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_deployment_runs_two_hardened_replicas_probed_on_health_endpoints() -> None:
    """2 replicas; startup and liveness on /healthz, readiness on /readyz, at the port
    the ConfigMap's http.listen binds; non-root, read-only root, no capabilities, no
    privilege escalation, resources; the grace period outlasts shutdown_grace."""
    deployment = manifests()["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    spec = pod("Deployment")
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    host, _, port = daemon_config()["http"]["listen"].rpartition(":")
    assert host == "0.0.0.0"  # the kubelet probes the pod IP: loopback would fail them
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports[get["port"]] == int(port), probe
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    grace = daemon_config()["supervision"]["shutdown_grace"]
    assert spec["terminationGracePeriodSeconds"] > int(grace.removesuffix("s"))


def test_service_monitor_and_disruption_budget_select_the_daemon_pods() -> None:
    """Service → pods (unready ones too), ServiceMonitor → Service and its named port,
    PDB → pods; the PDB keeps one of the two replicas through voluntary disruptions."""
    found = manifests()
    pod_labels = found["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = found["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # unready pods (a configuration fault) are scraped too: their metrics raise the alert
    assert service["spec"]["publishNotReadyAddresses"] is True
    monitor = found["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keeps the metrics' own `job` label
    container_ports = {p["name"] for p in pod("Deployment")["containers"][0]["ports"]}
    assert service_ports[endpoint["port"]]["targetPort"] in container_ports
    pdb = found["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 0 < pdb["minAvailable"] < found["Deployment"]["spec"]["replicas"]


def test_migration_job_migrates_with_the_daemons_image_and_config() -> None:
    """The Job runs `migrate` once (no restarts in the pod) with the Deployment's image,
    configuration and hardening, as the schema owner's DSN: a file of a Secret of its
    own, which the daemon's pods do not mount."""
    job, daemon = pod("Job"), pod("Deployment")
    (migrate,), (run,) = job["containers"], daemon["containers"]
    assert migrate["args"][:1] == ["migrate"] and run["args"][:1] == ["run"]
    assert migrate["args"][1:] == run["args"][1:]
    assert migrate["image"] == run["image"]
    assert job["restartPolicy"] == "Never"
    assert job["volumes"][0] == daemon["volumes"][0]  # the same ConfigMap
    assert migrate["securityContext"] == run["securityContext"]
    (env,) = migrate["env"]
    assert env["name"] == "SAFETYNET__POSTGRES__DSN_FILE"
    assert secret_of(job, migrate, env["value"]) == ("safetynet-migrate", "dsn")
    daemon_secrets = {v["secret"]["secretName"] for v in daemon["volumes"] if "secret" in v}
    assert "safetynet-migrate" not in daemon_secrets


def secret_of(spec: dict[str, Any], container: dict[str, Any], path: str
              ) -> tuple[str, str]:
    """(Secret, key) of the file *path* in *container* of the pod *spec*."""
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    folder, _, file = path.rpartition("/")
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[folder])
    item = next(i for i in volume["secret"]["items"] if i["path"] == file)
    return volume["secret"]["secretName"], item["key"]


def stand_in_files(tmp_path: Path, container: dict[str, Any]) -> dict[str, str]:
    """The container's ``*_FILE`` variables pointed at stand-in files written here."""
    env = {}
    for var in container["env"]:
        name, value = var["name"], var["value"]
        assert name.startswith("SAFETYNET__") and name.endswith("_FILE"), name
        text = ("postgresql://safetynet:stand-in@db.internal/messenger?sslmode=verify-full"
                if name.endswith("__DSN_FILE") else hash_password("stand-in")
                if name.endswith("__PASSWORD_HASH_FILE") else "stand-in")
        local = tmp_path / value.rpartition("/")[2]
        local.write_text(text + "\n")
        env[name] = str(local)
    return env


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervision.app", "check-config", "-c", str(path)],
        capture_output=True, text=True, check=False, cwd=ROOT,
        env={"PATH": os.environ.get("PATH", ""), **env})


def test_configmap_passes_check_config_with_the_secrets_the_deployment_passes(
        tmp_path: Path) -> None:
    """`safetynet check-config` accepts the ConfigMap's TOML with every secret file the
    Deployment names (stand-in values), and refuses it without them (the DSN, the Kafka
    SASL password are required); each file is a key of the Secret `safetynet`."""
    config = tmp_path / "config.toml"
    config.write_text(manifests()["ConfigMap"]["data"]["config.toml"])
    spec = pod("Deployment")
    (container,) = spec["containers"]
    env = stand_in_files(tmp_path, container)
    assert {secret_of(spec, container, v["value"])[0] for v in container["env"]} == {
        "safetynet"}
    proc = check_config(config, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stand-in" not in proc.stdout  # printed redacted
    refused = check_config(config, {})
    assert refused.returncode == 78
    assert "postgres.dsn: required" in refused.stderr + refused.stdout
    no_sasl = check_config(config, {k: v for k, v in env.items() if "SASL" not in k})
    assert no_sasl.returncode == 78
    assert "kafka.sasl_password" in no_sasl.stderr + no_sasl.stdout


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip() and not line.startswith("#")]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps *path* out of the build context (Docker's rule: the
    last pattern matching the path or one of its parent directories wins)."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.removeprefix("!").strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negate
    return ignored


def test_image_bakes_no_config_that_fails_its_check(tmp_path: Path) -> None:
    """Every configuration the Dockerfile copies in passes `check-config` as the image
    would run it (no secrets in its environment); the path the image points at is
    either such a file or mounted by the Deployment and the Job."""
    copies: dict[str, str] = {}  # destination -> source
    for op, args in dockerfile_instructions():
        if op in ("COPY", "ADD"):
            *sources, dest = [a for a in args.split() if not a.startswith("--")]
            for source in sources:
                copies[dest.rstrip("/") + ("/" + Path(source).name if dest.endswith("/")
                                          else "")] = source
    configs = {d: s for d, s in copies.items()
               if d.startswith("/etc/safetynet") or s.startswith("config/")}
    for source in configs.values():
        proc = check_config(ROOT / source, {})
        assert proc.returncode == 0, f"{source}: {proc.stdout}{proc.stderr}"
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(a for op, a in dockerfile_instructions()
                                                   if op == "ENV")))
    cmd = next(a for op, a in dockerfile_instructions() if op == "CMD")
    pointed = {env["SAFETYNET_CONFIG"], re.findall(r'"-c", "([^"]+)"', cmd)[0]}
    for path in pointed:
        if path in configs:
            continue
        for kind in ("Deployment", "Job"):
            mounts = {m["mountPath"] for m in pod(kind)["containers"][0]["volumeMounts"]}
            assert path in mounts, f"{path}: neither baked nor mounted by the {kind}"


def test_dockerignore_keeps_the_context_to_what_the_dockerfile_copies() -> None:
    """Each COPY source is in the build context; the venv, git, tests, bench and local
    configuration are not."""
    for op, args in dockerfile_instructions():
        if op == "COPY":
            for source in [a for a in args.split() if not a.startswith("--")][:-1]:
                assert not dockerignored(source), source
                assert not dockerignored(source.rstrip("/") + "/x.py") or "." in source
    for outside in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "bench/scale.py",
                    "config/production.example.toml", "actors/__pycache__/x.pyc",
                    "build/reliability.json"):
        assert dockerignored(outside), outside
    assert not dockerignored("supervision/db/sql/migrations/0001_messenger_schema.sql")


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_is_type_notify_with_a_watchdog() -> None:
    """Type=notify, a WatchdogSec, notifications from the main process only, a stop
    timeout above the default shutdown_grace, no restart on exit 78, SIGHUP reloads."""
    unit = unit_settings()
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]
    assert re.fullmatch(r"\d+s", unit["WatchdogSec"][0])
    assert int(unit["TimeoutStopSec"][0].removesuffix("s")) > 10
    assert "78" in unit["RestartPreventExitStatus"][0].split()
    assert "-HUP" in unit["ExecReload"][0]
    assert " run -c " in unit["ExecStart"][0]
    assert unit["NoNewPrivileges"] == ["yes"] and unit["CapabilityBoundingSet"] == [""]
    assert unit["SystemCallFilter"] == ["@system-service"]
    assert unit["ProtectProc"] == ["invisible"] and unit["ProcSubset"] == ["pid"]


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` finds nothing wrong with the unit (its ExecStart pointed
    at an executable that exists here)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian's systemd package)")
    unit = tmp_path / "safetynet.service"
    unit.write_text(UNIT.read_text().replace("/opt/safetynet/venv/bin/safetynet",
                                             sys.executable))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stdout + proc.stderr

