"""deploy/compose.yaml: valid against the Compose specification's schema (as
vendored by check-jsonschema), the services and profiles the README promises, and
the embedded pair run as local processes exactly as the file configures them,
through its health checks and `funnel demo`."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

from completion_service.policy import load_policy
from funnel.auth.pki import ensure_local_pki
from tests.deploy.local import BIN, Localizer, Process

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
FUNNEL = {"lifecycle": ("lifecycle-service", 50051, 9451), "completion": ("completion-service", 50052, 9452)}


def test_the_file_is_valid_against_the_compose_specification():
    done = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(DEPLOY / "compose.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_embedded_pair_runs_by_default_and_the_postgres_profile_adds_replicas_on_postgresql_16():
    default = {name for name, service in SERVICES.items() if not service.get("profiles")}
    assert default == {"secrets-init", "lifecycle", "completion"}
    postgres = {name for name, service in SERVICES.items() if "postgres" in service.get("profiles", [])}
    assert postgres == {"postgres", "lifecycle-pg", "completion-pg"}
    assert SERVICES["postgres"]["image"].startswith("postgres:16")
    for name in ("lifecycle-pg", "completion-pg"):
        assert SERVICES[name]["deploy"]["replicas"] == 2
        service = name.removesuffix("-pg")
        url = SERVICES[name]["environment"][f"FUNNEL_{service.upper()}_DATABASE"]
        assert url.startswith("postgresql://") and "@postgres:5432/" in url
        assert SERVICES[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert not any(volume.endswith(":/var/lib/funnel") for volume in SERVICES[name]["volumes"])
    assert SERVICES["completion-pg"]["environment"]["FUNNEL_COMPLETION_LIFECYCLE_ADDRESS"] == "lifecycle-pg:50051"


@pytest.mark.parametrize("name", ["lifecycle", "completion", "lifecycle-pg", "completion-pg"])
def test_each_service_runs_the_image_as_its_user_with_a_grpc_health_check_and_metrics(name):
    service = SERVICES[name]
    script, port, metrics = FUNNEL[name.removesuffix("-pg")]
    assert service["image"] == f"funnel:{VERSION}"
    assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert "user" not in service, "the image's non-root user"
    assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    assert service["command"][0] == script
    assert f"--listen=0.0.0.0:{port}" in service["command"]
    assert f"--metrics-listen=0.0.0.0:{metrics}" in service["command"]
    published = {entry.rsplit(":", 1)[1] for entry in service["ports"]}
    assert published == {str(port), str(metrics)}
    assert service["healthcheck"]["test"] == ["CMD", "python", "-m", "funnel.runtime.healthcheck"]
    assert service["environment"]["FUNNEL_HEALTHCHECK_ADDRESS"] == f"127.0.0.1:{port}"
    assert "secrets-init" in service["depends_on"]


def test_the_policy_mounted_into_the_completion_service_loads():
    source, target = next(v.split(":")[:2] for v in SERVICES["completion"]["volumes"] if "policy" in v)
    assert f"--policy-file={target}" in SERVICES["completion"]["command"]
    assert load_policy(str(DEPLOY / source)).for_workspace("demo").required_evidence == ("tests",)


@pytest.fixture(scope="module")
def embedded_pair(tmp_path_factory):
    """`lifecycle` and `completion` as compose.yaml starts them, as processes: the
    secrets volumes filled as `secrets-init` fills them, from the local PKI that
    `funnel pki init` makes in ./funnel-data/tls."""
    directory = tmp_path_factory.mktemp("compose")
    pki = ensure_local_pki(directory / "funnel-data" / "tls")
    init = SERVICES["secrets-init"]
    assert init["volumes"][0] == "${FUNNEL_PKI_DIR:-../funnel-data/tls}:/pki:ro"
    volumes = {}
    for entry in init["volumes"][1:]:
        volume, inside = entry.split(":")
        volumes[volume] = directory / volume
        volumes[volume].mkdir()
        files = init["environment"][f"{inside.rsplit('/', 1)[1].upper()}_FILES"].split()
        for file in files:
            shutil.copy(pki.path(file), volumes[volume] / file)
    processes = {}
    localizer = Localizer({}, set(SERVICES))
    try:
        for name in ("lifecycle", "completion"):
            service = SERVICES[name]
            for entry in service["volumes"]:
                source, inside = entry.split(":")[:2]
                if source.startswith("."):  # a file of this repository
                    localizer.mounts[inside] = DEPLOY / source
                else:  # a named volume
                    localizer.mounts[inside] = volumes.setdefault(source, directory / source)
                    localizer.mounts[inside].mkdir(exist_ok=True)
            env = {**localizer.env(service["environment"]), "PATH": str(BIN)}
            process = Process(localizer.argv(service["command"]), env, directory / f"{name}.log")
            processes[name] = process
            process.wait_ready(service["healthcheck"]["test"][1:], env)
            processes[name].env = env
        yield directory, localizer, processes
    finally:
        codes = {name: process.stop() for name, process in processes.items()}
    assert codes == {"lifecycle": 0, "completion": 0}


@pytest.mark.parametrize("name", ["lifecycle", "completion"])
def test_the_health_check_command_passes_on_the_running_pair(embedded_pair, name):
    _, _, processes = embedded_pair
    test = SERVICES[name]["healthcheck"]["test"]
    done = subprocess.run(
        [sys.executable, *test[2:]], env=processes[name].env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(": SERVING\n")


def test_funnel_demo_walks_the_story_through_both_containers(embedded_pair):
    directory, localizer, _ = embedded_pair
    command = (
        f"{BIN / 'funnel'} demo --data-dir {directory / 'funnel-data'} "
        f"--lifecycle 127.0.0.1:{localizer.ports[50051]} --completion 127.0.0.1:{localizer.ports[50052]}"
    )
    done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "settlement SETTLED" in done.stdout and "final status DONE" in done.stdout
    for name, (_, _, metrics) in FUNNEL.items():
        with urllib.request.urlopen(f"http://127.0.0.1:{localizer.ports[metrics]}/metrics", timeout=10) as response:
            scrape = response.read().decode()
        assert "grpc_server_handled_total{" in scrape, name
