"""deploy/kubernetes/ must be valid Kubernetes and only use real Ferrum commands and options.

Without a cluster on this machine (``podman kube play`` cannot run them either,
docs/deploy-kubernetes.md), the manifests are checked two ways:

* against the Kubernetes API schemas (kubernetes-validate, strict: unknown
  fields are errors), for the oldest release they promise to fit;
* against Ferrum itself: every container's arguments parse with ``ferrum``'s
  own parser, every FERRUM_* variable is an option Ferrum reads, every probe
  targets a port the container serves, every referenced ConfigMap and Secret
  is defined, and PostgreSQL's init script is deploy/postgres-init's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import build_parser
from services.common.config import option_env_names
from tests.support.kube_validate import KUBERNETES_VERSION, validator

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
FERRUM_WORKLOADS = {"ferrum-api", "conductor", "ferrum-ipxe", "ferrum-objectstore"}


def manifest_files() -> list[Path]:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    return [MANIFESTS / name for name in kustomization["resources"]]


Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Manifests = dict[str, dict[str, dict[str, Any]]]  # kind -> name -> resource


@pytest.fixture(scope="module")
def kinds() -> Manifests:
    found: Manifests = {}
    for path in manifest_files():
        for doc in yaml.load_all(path.read_text(), Loader=Loader):
            if doc:
                found.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return found


def workloads(kinds: Manifests) -> dict[str, dict[str, Any]]:
    return {**kinds["Deployment"], **kinds["StatefulSet"]}


def validate(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(validator()), "--strict", "--quiet", "-k", KUBERNETES_VERSION, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kustomization_lists_every_manifest() -> None:
    listed = {p.name for p in manifest_files()}
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_manifests_match_the_kubernetes_schemas() -> None:
    result = validate(manifest_files())
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_wrong_field(tmp_path: Path) -> None:
    """The validator is strict: a misspelt field and a wrongly typed value both fail."""
    docs = list(yaml.safe_load_all((MANIFESTS / "conductor.yaml").read_text()))
    statefulset = next(d for d in docs if d["kind"] == "StatefulSet")
    statefulset["spec"]["replica"] = statefulset["spec"].pop("replicas")
    bad = tmp_path / "misspelt.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    statefulset["spec"]["replicas"] = "two"
    del statefulset["spec"]["replica"]
    typed = tmp_path / "typed.yaml"
    typed.write_text(yaml.safe_dump_all(docs))
    for path in (bad, typed):
        result = validate([path])
        assert result.returncode != 0, f"{path.name} passed: {result.stdout}"


def ferrum_containers(kinds: Manifests) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, workload in workloads(kinds).items():
        spec = workload["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["image"] == "ferrum":
                found.append((name, container))
    return found


def test_every_ferrum_service_runs_with_real_arguments(kinds: Manifests) -> None:
    parser = build_parser()
    commands: dict[str, set[str]] = {}
    for name, container in ferrum_containers(kinds):
        # $(VAR) is expanded by the kubelet; any value parses the same.
        argv = [a.replace("$(POD_IP)", "10.0.0.7").replace("$(POD_NAME)", "conductor-0") for a in container["args"]]
        args = parser.parse_args(argv)
        commands.setdefault(name, set()).add(args.command)
    assert {n for n in commands if n in FERRUM_WORKLOADS} == FERRUM_WORKLOADS
    assert commands["ferrum-api"] == {"db", "api"} and commands["conductor"] == {"db", "conductor"}


def test_every_ferrum_variable_is_a_real_option(kinds: Manifests) -> None:
    """What Ferrum's containers get (their env, the ConfigMaps and Secrets they load whole) is all options."""
    names: set[str] = set()
    for _, container in ferrum_containers(kinds):
        names |= {e["name"] for e in container.get("env", []) if e["name"].startswith("FERRUM_")}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                names |= set(kinds["ConfigMap"][source["configMapRef"]["name"]]["data"])
            if "secretRef" in source:
                names |= set(kinds["Secret"][source["secretRef"]["name"]]["stringData"])
    unknown = names - set(option_env_names())
    assert not unknown, f"variables Ferrum does not read: {sorted(unknown)}"
    assert {"FERRUM_DATABASE_URL", "FERRUM_OBJECTSTORE_S3_SECRET_KEY", "FERRUM_SECURITY_SECRET_KEY_FILE"} <= names


def test_references_resolve(kinds: Manifests) -> None:
    config_maps, secrets = set(kinds["ConfigMap"]), set(kinds["Secret"])
    for name, workload in workloads(kinds).items():
        spec = workload["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, name
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, name
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in spec.get("volumes", [])} | {
                t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])
            }, name
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, name
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, name


@pytest.mark.parametrize("workload", sorted(FERRUM_WORKLOADS))
def test_probes_target_served_ports(kinds: Manifests, workload: str) -> None:
    container = workloads(kinds)[workload]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    grpc_port = int(args[args.index("--grpc-port") + 1])
    for kind in ("readinessProbe", "livenessProbe"):
        probe = container[kind]
        if "grpc" in probe:
            # gRPC health (grpc.health.v1) answers on every gRPC server without credentials.
            assert probe["grpc"]["port"] == grpc_port, (workload, kind)
        else:
            port = probe["httpGet"]["port"]
            assert ports.get(port, port) in ports.values(), (workload, kind)
            assert probe["httpGet"]["path"] in ("/", "/boot.ipxe"), (workload, kind)


def test_conductors_keep_their_names(kinds: Manifests) -> None:
    conductor = kinds["StatefulSet"]["conductor"]
    args = conductor["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--hostname") + 1] == "$(POD_NAME)"
    assert conductor["spec"]["replicas"] >= 2


def test_postgres_init_is_the_compose_script(kinds: Manifests) -> None:
    inline = kinds["ConfigMap"]["postgres-init"]["data"]["10-ferrum-role.sh"]
    assert inline == (ROOT / "deploy" / "postgres-init" / "10-ferrum-role.sh").read_text()
