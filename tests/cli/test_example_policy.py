"""deploy/policy.example.toml does what it says: a task of workspace `acme`
reaches ALLOW with passing tests and lint evidence and the approval of the
reference review gate (examples/review_gate.py), run as real processes with TLS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests import credentials
from tests.reliability.harness import Pair, unused_port

ROOT = Path(__file__).resolve().parents[2]
T = 10.0


def start_gate(port: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as stderr:  # the child keeps its own copy of the descriptor
        gate = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "examples" / "review_gate.py"),
                "--listen",
                f"127.0.0.1:{port}",
                "--tls-cert",
                str(credentials.PKI.cert("gate")),
                "--tls-key",
                str(credentials.PKI.key("gate")),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=ROOT,
        )
    line = gate.stdout.readline().decode()
    assert "review_gate serving on" in line, log.read_text()
    return gate


async def test_the_example_policy_reaches_allow_for_acme(tmp_path):
    gate_port = unused_port()
    policy = tmp_path / "policy.toml"
    policy.write_text(
        (ROOT / "deploy" / "policy.example.toml").read_text().replace("127.0.0.1:7000", f"127.0.0.1:{gate_port}")
    )
    gate = start_gate(gate_port, tmp_path / "gate.log")
    pair = await Pair(tmp_path / "pair", completion_args=["--policy-file", str(policy)]).start()
    try:
        await pair.lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(workspace_id="acme", task_id="t-1"), timeout=T
        )
        claim = await pair.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id="acme", task_id="t-1", agent_id="agent-1", lease_ttl=Duration(seconds=600)
            ),
            timeout=T,
        )

        async def attempt(result: str) -> completion_types.Decision:
            return (
                await pair.cs.AttemptCompletion(
                    completion_messages.AttemptCompletionRequest(
                        workspace_id="acme",
                        task_id="t-1",
                        run_id=claim.run.run_id,
                        epoch=claim.lease.epoch,
                        outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                        result=result,
                    ),
                    timeout=T,
                )
            ).decision

        missing = await attempt("Fixed the login bug.")
        assert list(missing.details.missing_evidence_kinds) == ["tests", "lint"]
        for kind in ("tests", "lint"):
            await pair.cs.RecordEvidence(
                completion_messages.RecordEvidenceRequest(
                    workspace_id="acme",
                    task_id="t-1",
                    generation=1,
                    kind=kind,
                    verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                    run_id=claim.run.run_id,
                ),
                timeout=T,
            )
        refused = await attempt("Fixed the login bug. TODO: the logout bug.")
        assert (refused.next_action, refused.details.decisive_gate) == (
            completion_enums.AGENT_ACTION_ADDRESS_GATE_FEEDBACK,
            "acme.review",
        )
        assert "TODO" in refused.details.gate_feedback
        allowed = await attempt("Fixed the login bug.")
        assert (allowed.verdict, allowed.next_action) == (
            completion_enums.VERDICT_ALLOW,
            completion_enums.AGENT_ACTION_REPORT_COMPLETE,
        )
        assert [t.status for t in allowed.trace if t.gate_id == "acme.review"] == [completion_enums.GATE_STATUS_PASSED]
    finally:
        await pair.stop()
        gate.terminate()
        gate.wait(10)
        gate.stdout.close()


def test_the_example_gate_refuses_to_serve_without_tls_or_insecure():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "review_gate.py")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0 and "--tls-cert" in result.stderr
