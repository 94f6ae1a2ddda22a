"""The static checks CI runs before the tests (scripts/check.py, called by
scripts/test.sh): each step fails on a tree with a defect of its kind, names
itself, and the other steps still run. The checks of the real tree are that
CI step itself, not a test here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check.py"
TIMEOUT_SECONDS = 600
# What a checked tree needs: pyproject.toml's packages, the protos and buf's files.
COPIED = (
    "pyproject.toml",
    "buf.yaml",
    "protos",
    "third_party",
    "contract",
    "funnel",
    "lifecycle_service",
    "completion_service",
    "funnel_cli",
    "funnel_mcp",
    "funnel_ui",
    "funnel_sim",
    "bench",
    "examples",
    "scripts",
    "tests",
)
LIFECYCLE_PROTO = "protos/funnel/lifecycle/v1/types.proto"


def tree_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    copy.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
        else:
            shutil.copy2(source, copy / name)
    return copy


def check(root: Path, *steps: str) -> subprocess.CompletedProcess[str]:
    only = [arg for step in steps for arg in ("--only", step)]
    return subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root), *only],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )


def _unused_import(root: Path) -> None:
    (root / "funnel" / "runtime" / "unused_import.py").write_text('"""A planted defect."""\n\nimport os\n')


def _unformatted(root: Path) -> None:
    (root / "funnel" / "runtime" / "unformatted.py").write_text('"""A planted defect."""\n\nVALUE = {  "a":1 }\n')


def _untyped(root: Path) -> None:
    # Clean for ruff, wrong only for --strict: a function without annotations.
    untyped = '"""A planted defect."""\n\n\ndef twice(x):\n    return 2 * x\n'
    (root / "funnel" / "runtime" / "untyped.py").write_text(untyped)


def _lint_finding(root: Path) -> None:
    proto = root / LIFECYCLE_PROTO
    proto.write_text(proto.read_text() + "\nmessage lower_case_message {}\n")


def _wire_break(root: Path) -> None:
    proto = root / LIFECYCLE_PROTO
    text = proto.read_text()
    # A field of the last release renumbered: a binary client reads another field.
    field = re.search(r"^(  string workspace_id = )(\d+)((?: \[[^\]]*\])?;)", text, re.M)
    assert field, f"no `string workspace_id = N;` field in {proto}: update this test to the protos"
    proto.write_text(text[: field.start()] + field.group(1) + "536870911" + field.group(3) + text[field.end() :])


@pytest.mark.parametrize(
    ("step", "plant", "finding"),
    [
        ("ruff check", _unused_import, "F401"),
        ("ruff format", _unformatted, "unformatted.py"),
        ("mypy", _untyped, "untyped.py"),
        ("buf lint", _lint_finding, "lower_case_message"),
        ("buf breaking", _wire_break, "was deleted without reserving the number"),
    ],
)
def test_each_step_fails_on_a_planted_defect_and_names_itself(tmp_path, step, plant, finding):
    root = tree_copy(tmp_path)
    plant(root)
    result = check(root, step)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert finding in output, output
    assert f"checks failed: {step}" in output, output


def test_a_failed_step_does_not_hide_the_steps_after_it(tmp_path):
    root = tree_copy(tmp_path)
    _unused_import(root)
    _lint_finding(root)
    result = check(root, "ruff check", "buf lint")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "F401" in output and "lower_case_message" in output, output
    assert "checks failed: ruff check, buf lint" in output, output
