"""buf guards the contract: every module compiles, the protos follow buf's STANDARD
lint rules (the exceptions are justified in buf.yaml and hide nothing else), and no
change breaks a binary client of the last release (`buf breaking` against the newest
image in contract/releases/, under the WIRE rules of buf.yaml). `buf lint` and `buf
breaking` of the tree itself are steps of scripts/check.py, before the tests; here,
what their configuration catches and lets through.

buf comes from the npm registry: the root package-lock.json pins @bufbuild/buf and
tests/node_tools.py installs it (npm ci) for the first test that needs it. Every buf
call runs offline (no Buf Schema Registry) and under a timeout; tests that change
protos do so in a copy under tmp_path, so they run in parallel (xdist) safely.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.node_tools import ensure_packages

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "contract" / "releases"
BUF_TIMEOUT = 120  # seconds, per buf call; each takes about one locally
SCRIPT_TIMEOUT = 300

# The files of buf.yaml's exceptions (each holds the excepted element and nothing of
# its kind besides), and one file of messages and one of services to change.
LIFECYCLE_ERRORS = "protos/funnel/lifecycle/v1/errors.proto"
COMPLETION_ERRORS = "protos/funnel/completion/v1/errors.proto"
GATE_SERVICE = "protos/funnel/completion/v1/gate_service.proto"
LIFECYCLE_MESSAGES = "protos/funnel/lifecycle/v1/messages.proto"
TRANSCRIPT_SERVICE = "protos/funnel/completion/v1/transcript_service.proto"

# buf.yaml's protos module with no exception at all: what the exceptions may hide.
STRICT_CONFIG = json.dumps(
    {
        "version": "v2",
        "modules": [
            {"path": "protos", "lint": {"use": ["STANDARD"]}},
            {"path": "third_party/googleapis", "lint": {"ignore": ["third_party/googleapis"]}},
        ],
    }
)


# --- running buf ---------------------------------------------------------------


@pytest.fixture(scope="session")
def buf() -> Path:
    path = ensure_packages(ROOT) / ".bin" / "buf"
    assert path.exists(), f"npm ci installed no {path}: is @bufbuild/buf in package-lock.json?"
    return path


def _run(argv: list[str], cwd: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs argv in its own process group, killed whole on timeout: node_modules/.bin/buf
    is a node wrapper around the buf binary, which would outlive a killed wrapper."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"`{' '.join(argv)}` (in {cwd}) did not finish in {timeout} s\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def run_buf(buf: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return _run([str(buf), *args], cwd, BUF_TIMEOUT)


def explain(result: subprocess.CompletedProcess) -> str:
    return (
        f"`buf {' '.join(result.args[1:])}` exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}--- stderr ---\n{result.stderr}"
    )


def assert_passes(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, explain(result)


def findings(result: subprocess.CompletedProcess) -> list[dict]:
    """The violations of a `--error-format=json` lint or breaking run (one JSON object
    a line: path, start_line, type = the rule, message)."""
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def assert_fails_with(result: subprocess.CompletedProcess, rule: str, path: str) -> None:
    assert result.returncode != 0, f"expected {rule} in {path}, but buf passed\n" + explain(result)
    found = findings(result)
    assert any(f["type"] == rule and f["path"] == path for f in found), (
        f"expected {rule} in {path}, got {[(f['type'], f['path']) for f in found]}\n" + explain(result)
    )


# --- the release images ----------------------------------------------------------


def _version(image: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in image.stem.split("."))


def release_images() -> list[Path]:
    return sorted(RELEASES.glob("*.binpb"), key=_version)


def release_commits() -> dict[str, str]:
    """version -> commit, from the table of contract/releases/README.md."""
    rows = re.findall(r"^\| *(\d+\.\d+\.\d+) *\| *`([0-9a-f]{40})` *\|", (RELEASES / "README.md").read_text(), re.M)
    return dict(rows)


def workspace_copy(tmp_path: Path) -> Path:
    """The buf workspace (buf.yaml, protos/, third_party/googleapis/) copied, to change."""
    copy = tmp_path / "workspace"
    copy.mkdir()
    shutil.copy2(ROOT / "buf.yaml", copy / "buf.yaml")
    shutil.copytree(ROOT / "protos", copy / "protos")
    shutil.copytree(ROOT / "third_party" / "googleapis", copy / "third_party" / "googleapis")
    return copy


def edit(path: Path, pattern: str, replacement: str) -> str:
    """Replaces the first match of pattern (multiline) in path; returns the match."""
    text = path.read_text()
    match = re.search(pattern, text, re.M)
    assert match, f"{pattern!r} not found in {path}: update this test to the protos"
    path.write_text(text[: match.start()] + match.expand(replacement) + text[match.end() :])
    return match.group(0)


# A top-level message field on one line: `  [optional|repeated] type name = N [options];`.
FIELD = r"^(  (?:(?:optional|repeated) )?[\w.]+ )(\w+)( = )(\d+)((?: \[[^\]]*\])?;)"


# --- the modules compile ---------------------------------------------------------


def test_buf_build(buf):
    assert_passes(run_buf(buf, "build"))


# --- the lint exceptions hide only what buf.yaml justifies ----------------------


def unjustified_lint_findings(buf: Path, workspace: Path) -> list[dict]:
    """Lints with STANDARD and no exception; returns every finding that the
    exceptions of buf.yaml do not justify: ENUM_VALUE_PREFIX on the values of the
    two `ErrorReason` enums, SERVICE_SUFFIX on `CompletionGate`."""
    result = run_buf(buf, "lint", "--error-format=json", "--config", STRICT_CONFIG, cwd=workspace)
    assert result.returncode in (0, 100), explain(result)  # 100: findings
    unjustified = []
    for f in findings(result):
        error_reason_value = (
            f["type"] == "ENUM_VALUE_PREFIX"
            and f["path"] in (LIFECYCLE_ERRORS, COMPLETION_ERRORS)
            and f["message"].endswith('should be prefixed with "ERROR_REASON_".')
        )
        completion_gate = (
            f["type"] == "SERVICE_SUFFIX"
            and f["path"] == GATE_SERVICE
            and f["message"].startswith('Service name "CompletionGate" ')
        )
        if not (error_reason_value or completion_gate):
            unjustified.append(f)
    return unjustified


def test_lint_exceptions_hide_only_the_justified_findings(buf):
    assert unjustified_lint_findings(buf, ROOT) == []


def test_an_unprefixed_enum_in_an_excepted_file_is_still_found(buf, tmp_path):
    workspace = workspace_copy(tmp_path)
    errors = workspace / LIFECYCLE_ERRORS
    errors.write_text(
        errors.read_text() + "\n// A probe.\nenum ProbeKind {\n  PROBE_KIND_UNSPECIFIED = 0;\n  WRONG = 1;\n}\n"
    )
    assert_passes(run_buf(buf, "lint", cwd=workspace))  # buf.yaml alone cannot tell...
    unjustified = unjustified_lint_findings(buf, workspace)  # ...this check can
    assert [(f["type"], f["path"]) for f in unjustified] == [("ENUM_VALUE_PREFIX", LIFECYCLE_ERRORS)], unjustified


# --- the gates fail when they should --------------------------------------------

PROBE = "protos/funnel/lifecycle/v1/probe.proto"
PROBES = {
    "ENUM_VALUE_PREFIX": (
        "// A probe.\nenum ProbeReason {\n  PROBE_REASON_UNSPECIFIED = 0;\n  SOMETHING_WRONG = 1;\n}\n"
    ),
    "SERVICE_SUFFIX": (
        "// A probe.\nservice Probe {\n  // Pings.\n  rpc Ping(PingRequest) returns (PingResponse);\n}\n"
        "// A ping.\nmessage PingRequest {}\n// A pong.\nmessage PingResponse {}\n"
    ),
}


@pytest.mark.parametrize("rule", sorted(PROBES))
def test_lint_fails_on_the_excepted_rules_in_any_other_file(buf, tmp_path, rule):
    workspace = workspace_copy(tmp_path)
    (workspace / PROBE).write_text('syntax = "proto3";\n\npackage funnel.lifecycle.v1;\n\n' + PROBES[rule])
    assert_fails_with(run_buf(buf, "lint", "--error-format=json", cwd=workspace), rule, PROBE)


def _renumber_a_field(workspace: Path) -> None:
    edit(workspace / LIFECYCLE_MESSAGES, FIELD, r"\1\2\g<3>536870911\5")  # the highest field number


def _delete_an_rpc(workspace: Path) -> None:
    edit(workspace / TRANSCRIPT_SERVICE, r"^  rpc \w+\(.*\) returns \(.*\);\n", "")


def _rename_completion_gate(workspace: Path) -> None:
    edit(workspace / GATE_SERVICE, r"^service CompletionGate \{", "service CompletionGateService {")


@pytest.mark.parametrize(
    ("change", "rule", "path"),
    [
        (_renumber_a_field, "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED", LIFECYCLE_MESSAGES),
        (_delete_an_rpc, "RPC_NO_DELETE", TRANSCRIPT_SERVICE),
        (_rename_completion_gate, "PACKAGE_SERVICE_NO_DELETE", GATE_SERVICE),
    ],
    ids=["field-number-changed", "rpc-deleted", "service-renamed"],
)
def test_breaking_fails_on_a_wire_break(buf, tmp_path, change, rule, path):
    workspace = workspace_copy(tmp_path)
    before = tmp_path / "before.binpb"
    assert_passes(run_buf(buf, "build", "protos", "-o", str(before), cwd=workspace))
    change(workspace)
    result = run_buf(buf, "breaking", "protos", "--against", str(before), "--error-format=json", cwd=workspace)
    assert_fails_with(result, rule, path)


def test_breaking_allows_a_json_only_change(buf, tmp_path):
    """WIRE, not WIRE_JSON: before 1.0 a field may be renamed (with a CHANGELOG.md
    entry); binary clients do not see it."""
    workspace = workspace_copy(tmp_path)
    before = tmp_path / "before.binpb"
    assert_passes(run_buf(buf, "build", "protos", "-o", str(before), cwd=workspace))
    edit(workspace / LIFECYCLE_MESSAGES, FIELD, r"\1\2_renamed\3\4\5")
    assert_passes(run_buf(buf, "breaking", "protos", "--against", str(before), cwd=workspace))


# --- the release images are what contract/releases/README.md says -------------


def test_every_release_image_has_its_commit_listed():
    assert sorted(release_commits()) == sorted(image.stem for image in release_images())


@pytest.mark.parametrize("version", sorted(release_commits()))
def test_release_image_rebuilds_from_its_commit(buf, tmp_path, version):
    commit = release_commits()[version]
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True, timeout=60)
    if known.returncode != 0:
        pytest.skip(f"commit {commit} of release {version} is not in this clone (shallow?)")
    out = tmp_path / f"{version}.binpb"
    script = ROOT / "scripts" / "release_contract_image.sh"
    result = _run(
        ["bash", str(script), commit, version, str(out)], ROOT, SCRIPT_TIMEOUT, env={**os.environ, "BUF": str(buf)}
    )
    assert result.returncode == 0, f"{script.name} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert out.read_bytes() == (RELEASES / f"{version}.binpb").read_bytes(), (
        f"contract/releases/{version}.binpb is not the image of {commit}"
    )
