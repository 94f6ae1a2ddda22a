"""deploy/Dockerfile, as far as this machine allows without a container engine:
hadolint finds nothing, the stages are what the deploy files rely on (a build
stage, a slim runtime of Python 3.11+, a numeric non-root user, a health check
through the gRPC health service, a console script as the command), and the wheel
the build stage makes from the build context that .dockerignore leaves holds
every module and data file of the project."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import dockerfile
import pytest

from tests.deploy.local import BIN

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
INSTRUCTIONS = dockerfile.parse_file(str(DOCKERFILE))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def stages() -> list[list[dockerfile.Command]]:
    found: list[list[dockerfile.Command]] = []
    for instruction in INSTRUCTIONS:
        if instruction.cmd == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def one(stage: list[dockerfile.Command], cmd: str) -> dockerfile.Command:
    matches = [i for i in stage if i.cmd == cmd]
    assert len(matches) == 1, f"{cmd}: {matches}"
    return matches[0]


def test_hadolint_finds_nothing():
    done = subprocess.run([str(BIN / "hadolint"), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_build_stage_and_a_slim_runtime_of_the_same_python():
    build, runtime = stages()
    image = next(i.value[0] for i in INSTRUCTIONS if i.cmd == "ARG" and i.value[0].startswith("PYTHON_IMAGE="))
    match = re.fullmatch(r"PYTHON_IMAGE=python:3\.(\d+)-slim(-\w+)?", image)
    assert match and int(match.group(1)) >= 11, image
    assert build[0].value == ("${PYTHON_IMAGE}", "AS", "build")
    assert runtime[0].value == ("${PYTHON_IMAGE}",)
    copied = [i for i in runtime if i.cmd == "COPY"]
    assert [(i.flags, i.value) for i in copied] == [(("--from=build",), ("/opt/funnel", "/opt/funnel"))]
    assert "pip wheel" in one(build, "RUN").value[0]


def test_the_runtime_runs_as_a_numeric_non_root_user():
    _, runtime = stages()
    user = one(runtime, "USER").value[0]
    uid, gid = (int(part) for part in user.split(":"))
    assert uid >= 1000 and gid >= 1000
    assert f"--uid {uid}" in " ".join(i.value[0] for i in runtime if i.cmd == "RUN")
    assert [i.cmd for i in runtime].index("USER") > max(n for n, i in enumerate(runtime) if i.cmd == "RUN")


def test_the_command_is_a_console_script_and_the_health_check_asks_the_grpc_health_service():
    _, runtime = stages()
    command = one(runtime, "CMD")
    assert command.json and command.value[0] in PROJECT["scripts"]
    health = one(runtime, "HEALTHCHECK")
    assert health.json and health.value == ("CMD", "python", "-m", "funnel.runtime.healthcheck")
    assert set(one(runtime, "EXPOSE").value) == {"50051", "50052", "9451", "9452"}


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    ignored = False
    parts = path.split("/")
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = re.escape(pattern.lstrip("!").rstrip("/")).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The build stage's wheel, from the files its COPY lines take out of the context .dockerignore leaves."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    source = tmp_path_factory.mktemp("context")
    build, _ = stages()
    for copy in (i for i in build if i.cmd == "COPY"):
        *names, _target = copy.value
        for name in names:
            for path in [ROOT / name] if (ROOT / name).is_file() else sorted((ROOT / name).rglob("*")):
                relative = path.relative_to(ROOT).as_posix()
                if path.is_file() and not _ignored(relative, patterns):
                    (source / relative).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, source / relative)
    out = tmp_path_factory.mktemp("wheels")
    # --no-build-isolation: the same setuptools, without installing it again for the build.
    done = subprocess.run(
        [
            str(BIN / "pip"),
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("funnel-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_from_the_build_context_holds_every_module_and_data_file(wheel):
    names = set(wheel.namelist())
    packages = ("funnel", "lifecycle_service", "completion_service", "funnel_cli", "funnel_mcp", "funnel_ui")
    # Modules and [tool.setuptools.package-data] (the dashboard's static files among them).
    suffixes = {".py", ".sql", ".pyi", ".toml", ".json", ".js", ".css"}
    wanted = {
        path.relative_to(ROOT).as_posix()
        for package in packages
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in suffixes
    }
    assert wanted - names == set()
    assert "funnel/runtime/healthcheck.py" in names


def test_the_wheel_declares_the_console_scripts_the_deploy_files_run(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode()
    for script in ("lifecycle-service", "completion-service", "funnel"):
        assert f"{script} = {PROJECT['scripts'][script]}" in scripts


def _closure(requirements: list[str]) -> set[str]:
    """Distributions these requirements install, with their own, transitively (as installed here)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, str]] = set()  # (distribution, extra)
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        for wanted in ["", *requirement.extras]:
            if (name, wanted) not in seen:
                seen.add((name, wanted))
                todo += [(Requirement(r), wanted) for r in metadata.requires(requirement.name) or []]
    return {name for name, _ in seen}


def test_every_third_party_import_is_a_declared_dependency(wheel):
    """The image installs the wheel's dependencies and nothing else (unlike this
    machine's venv, where the test tools are installed too)."""
    import ast
    from importlib import metadata

    from packaging.utils import canonicalize_name

    first_party = {"funnel", "lifecycle_service", "completion_service", "funnel_cli", "funnel_mcp", "funnel_ui"}
    imported: dict[str, str] = {}
    for package in first_party:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    else []
                )
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in first_party:
                        imported.setdefault(top, str(path.relative_to(ROOT)))
    requires = [r for r in wheel_requirements(wheel) if "extra ==" not in r]
    installed = _closure(requires)
    providers = metadata.packages_distributions()
    missing = {
        module: where
        for module, where in imported.items()
        if not {canonicalize_name(d) for d in providers.get(module, [])} & installed
    }
    assert missing == {}, f"imported, but not installed by [project].dependencies: {missing}"


def wheel_requirements(wheel: zipfile.ZipFile) -> list[str]:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return [
        line.split(": ", 1)[1] for line in wheel.read(meta).decode().splitlines() if line.startswith("Requires-Dist: ")
    ]
