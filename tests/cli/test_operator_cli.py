"""The operator's commands against real services (`funnel up --demo`), as a
script uses them: JSON output checked, exit codes relied on."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests import credentials
from tests.funnel_up import funnel_up
from tests.reliability.harness import CALL_TIMEOUT, Pair, unused_port

FUNNEL = Path(sys.executable).parent / "funnel"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`funnel up --demo`: one task of workspace demo walked to COMPLETED."""
    directory = tmp_path_factory.mktemp("operator")
    with funnel_up(directory, "--demo", "--data-dir", str(directory / "data"), ready="Demo finished", wait=90) as up:
        task = next(line.split()[3] for line in up.lines if line.startswith("1. register"))
        yield {"dir": directory, "lifecycle": up.lifecycle_port, "completion": up.completion_port, "task": task}


def funnel(demo, *args: str, json_output: bool = True) -> tuple[int, object, str]:
    command = [str(FUNNEL), *args]
    if args[0] not in ("check", "backup"):
        command += [
            "--data-dir",
            str(demo["dir"] / "data"),
            "--lifecycle",
            f"127.0.0.1:{demo['lifecycle']}",
            "--completion",
            f"127.0.0.1:{demo['completion']}",
        ]
    if json_output:
        command += ["-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if json_output and done.stdout and args[:2] != ("task", "watch"):
        return done.returncode, json.loads(done.stdout), done.stderr
    return done.returncode, done.stdout, done.stderr


def test_reading_tasks_runs_and_completions(demo):
    task = demo["task"]
    code, listed, _ = funnel(demo, "task", "list")
    assert code == 0 and [t["task_id"] for t in listed["tasks"]] == [task]
    code, got, _ = funnel(demo, "task", "get", task)
    assert (got["task"]["state"], got["task"]["outcome"]) == ("GENERATION_STATE_TERMINAL", "TERMINAL_OUTCOME_COMPLETED")
    code, history, _ = funnel(demo, "task", "events", task)
    intents = [e["intent"] for e in history["events"]]
    assert intents[0] == "INTENT_REGISTER_TASK" and intents[-1] == "INTENT_SETTLE_COMPLETION"
    code, runs, _ = funnel(demo, "run", "list", "--task", task)
    (run,) = runs["runs"]
    code, one, _ = funnel(demo, "run", "get", run["run_id"])
    assert one["run"]["outcome"] == "RUN_OUTCOME_SUCCEEDED"
    code, completion, _ = funnel(demo, "completion", "get", task)
    assert completion["completion"]["settlement"] == "SETTLEMENT_STATUS_SETTLED"
    code, pending, _ = funnel(demo, "completion", "list", "--pending")
    assert code == 0 and pending == {"completions": []}
    code, stream, _ = funnel(demo, "task", "watch", "--count", "3")
    assert code == 0 and [json.loads(line)["sequence"] for line in stream.splitlines()] == ["1", "2", "3"]
    code, table, _ = funnel(demo, "task", "list", json_output=False)
    assert table.splitlines()[0].split()[:4] == ["TASK", "GEN", "REV", "STATE"] and task in table


def test_resume_then_cancel_moves_the_task_through_a_new_generation(demo):
    task = demo["task"]
    code, resumed, _ = funnel(demo, "task", "resume", task, "--generation", "2", "--request-id", "op-resume-1")
    assert code == 0 and resumed["events"][0]["generation"] == "2"
    code, again, _ = funnel(demo, "task", "resume", task, "--generation", "2", "--request-id", "op-resume-1")
    assert code == 0 and again == resumed  # a retry: the first answer
    code, _, err = funnel(demo, "task", "resume", task)
    assert code == 1 and "GENERATION" in err  # generation 2 is not terminal: nothing to resume
    code, cancelled, _ = funnel(demo, "task", "cancel", task, "--settle")
    assert code == 0 and [e["intent"] for e in cancelled["events"]] == [
        "INTENT_REQUEST_CANCELLATION",
        "INTENT_SETTLE_CANCELLATION",
    ]
    code, got, _ = funnel(demo, "task", "get", task)
    assert (got["task"]["generation"], got["task"]["outcome"]) == ("2", "TERMINAL_OUTCOME_CANCELLED")


def test_exit_codes_scripts_can_rely_on(demo):
    code, _, err = funnel(demo, "task", "get", "no-such-task")
    assert code == 3 and "TASK_NOT_FOUND (NOT_FOUND)" in err
    viewer = subprocess.run(
        [
            str(FUNNEL),
            "token",
            "issue",
            "--workspace",
            "demo",
            "--role",
            "viewer",
            "--data-dir",
            str(demo["dir"] / "data"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    code, _, err = funnel(demo, "task", "cancel", demo["task"], "--token", viewer.stdout.strip())
    assert code == 4 and "ROLE_NOT_PERMITTED (PERMISSION_DENIED)" in err
    done = subprocess.run(
        [
            str(FUNNEL),
            "task",
            "list",
            "--data-dir",
            str(demo["dir"] / "data"),
            "--lifecycle",
            f"127.0.0.1:{unused_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 5 and "UNAVAILABLE" in done.stderr


def table_pages_in_the_middle(path: Path) -> list[int]:
    """Pages (1-based) in the middle of the file that hold table or index b-tree data
    (cells: the unused area of an empty b-tree's page is never read, so damage there
    is not damage)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages = [
            row[0]
            for row in db.execute(
                "SELECT pageno FROM dbstat WHERE name NOT LIKE 'sqlite_%' AND ncell > 0 ORDER BY pageno"
            )
        ]
    finally:
        db.close()
    assert len(pages) >= 4, pages
    middle = len(pages) // 2
    return pages[middle : middle + 2]


def test_check_and_backup_of_a_live_database(demo, tmp_path):
    database = demo["dir"] / "data" / "completion.sqlite3"
    code, report, _ = funnel(demo, "check", str(database))
    assert code == 0 and report["ok"] is True and report["pages"] > 0
    copy = tmp_path / "completion-backup.sqlite3"
    code, made, _ = funnel(demo, "backup", str(database), str(copy))
    assert code == 0 and made["bytes"] == copy.stat().st_size
    code, _, err = funnel(demo, "backup", str(database), str(copy))
    assert code == 1 and "not overwriting" in err
    code, report, _ = funnel(demo, "check", str(copy))
    assert code == 0 and report["ok"]
    damaged = bytearray(copy.read_bytes())
    page_size = int.from_bytes(damaged[16:18], "big")
    for page in table_pages_in_the_middle(copy):
        # Overwrite the page's cells (from its cell content area to its end): the
        # unused middle of a page that is not full is never read, so not damage.
        start = (page - 1) * page_size
        content = int.from_bytes(damaged[start + 5 : start + 7], "big") or 65536
        damaged[start + content : start + page_size] = b"\xa5" * (page_size - content)
    copy.write_bytes(bytes(damaged))
    code, report, _ = funnel(demo, "check", str(copy))
    assert code == 1 and report["ok"] is False and report["problems"]


# -- the settlement outbox: a pair whose lifecycle service dies at the settlement --


def outbox(pair: Pair, *args: str, command: tuple[str, ...] = ("outbox",)) -> tuple[int, object, str]:
    """`funnel outbox` (or `command`) against the pair's processes, with the test PKI's client certificate."""
    pki = credentials.PKI
    done = subprocess.run(
        [
            str(FUNNEL),
            *command,
            "--workspace",
            "ws",
            "--lifecycle",
            pair.lifecycle.address,
            "--completion",
            pair.completion.address,
            "--ca",
            str(pki.ca),
            "--cert",
            str(pki.cert("client")),
            "--key",
            str(pki.key("client")),
            "--token",
            credentials.SUPERUSER,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, json.loads(done.stdout) if "json" in args else done.stdout, done.stderr


def poll(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return found


async def test_the_outbox_shows_a_pending_settlement_until_the_lifecycle_answers(tmp_path):
    pair = await Pair(tmp_path).start()
    try:
        code, empty, _ = outbox(pair, "-o", "json")
        assert code == 0 and (empty["count"], empty["completions"], empty["oldest_age_seconds"]) == (0, [], None)
        assert outbox(pair)[1].strip() == "no pending settlements in workspace 'ws'"

        await pair.lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(workspace_id="ws", task_id="t-1"), timeout=CALL_TIMEOUT
        )
        claim = await pair.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id="ws", task_id="t-1", agent_id="agent-1", lease_ttl=Duration(seconds=600)
            ),
            timeout=CALL_TIMEOUT,
        )
        await pair.cs.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id="ws",
                task_id="t-1",
                generation=1,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                run_id=claim.run.run_id,
            ),
            timeout=CALL_TIMEOUT,
        )
        # The lifecycle service's next write is the settlement: it dies before committing it.
        pair.lifecycle.arm("lifecycle.before_commit:crash:1")
        answer = await pair.cs.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id="ws",
                task_id="t-1",
                run_id=claim.run.run_id,
                epoch=claim.lease.epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="done",
            ),
            timeout=CALL_TIMEOUT,
        )
        assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
        assert poll(lambda: not pair.lifecycle.alive())

        # The outbox retries while the lifecycle service is down; the operator sees it.
        def retried():
            code, listed, _ = outbox(pair, "-o", "json")
            assert code == 0
            return listed if listed["count"] == 1 and int(listed["completions"][0]["settle_attempts"]) >= 2 else None

        listed = poll(retried)
        (pending,) = listed["completions"]
        assert (pending["task_id"], pending["generation"], pending["completion_id"], pending["settlement"]) == (
            "t-1",
            "1",
            answer.completion.completion_id,
            "SETTLEMENT_STATUS_PENDING",
        )
        assert pending["next_settle_time"] and "UNAVAILABLE" in pending["last_settle_error"]
        assert listed["oldest_commit_time"] == pending["commit_time"] and listed["oldest_age_seconds"] >= 0
        assert listed["more"] is False
        code, table, _ = outbox(pair)
        lines = table.splitlines()
        assert code == 0 and lines[0].split()[:6] == ["TASK", "GEN", "COMPLETION", "COMMITTED", "ATTEMPTS", "NEXT"]
        assert lines[1].split()[:3] == ["t-1", "1", answer.completion.completion_id] and "UNAVAILABLE" in lines[1]
        assert lines[-1].startswith("1 pending settlement; the oldest committed ")
        code, listed, _ = outbox(pair, "-o", "json", command=("completion", "list", "--pending"))
        assert code == 0 and [c["completion_id"] for c in listed["completions"]] == [pending["completion_id"]]
        code, _, err = outbox(pair, "--completion", f"127.0.0.1:{unused_port()}")
        assert code == 5 and "UNAVAILABLE" in err

        # The lifecycle service is back (same port, same database): the outbox drains.
        await pair.ensure_alive()
        poll(lambda: outbox(pair, "-o", "json")[1]["count"] == 0)
        settled = await pair.cs.GetCompletion(
            completion_messages.GetCompletionRequest(workspace_id="ws", task_id="t-1", generation=1),
            timeout=CALL_TIMEOUT,
        )
        assert settled.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
        assert settled.completion.last_settle_error == "" and not settled.completion.HasField("next_settle_time")
    finally:
        await pair.stop()
