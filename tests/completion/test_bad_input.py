"""Bad input on every completion RPC, over gRPC with both real servers: each case
gets the documented code, exactly one ErrorInfo (reason, domain
`completion_service`), the offending field named in ErrorInfo and BadRequest,
and leaves both databases exactly as they were. Resources of another workspace
are NOT_FOUND. No request, not even undecodable bytes, yields UNKNOWN."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio
from google.protobuf.duration_pb2 import Duration

from completion_service.server import CompletionConfig
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.clock import ManualClock
from funnel.runtime.grpc_errors import error_info, field_violations
from funnel.runtime.paging import encode_token
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.e2e_support import (
    CALL_TIMEOUT,
    CLOCK_START_MICROS,
    DOMAIN,
    ENGINES,
    LIFECYCLE_TIMEOUT,
    OTHER_WS,
    WS,
    Code,
    Funnel,
    completion_database,
    rejected,
    table_dump,
)

TOO_LONG_ID = "x" * 129
MIB = 1024 * 1024


@dataclass
class World:
    f: Funnel
    run: completion_types.Run  # open, WS, task-1, epoch 1
    other_run: completion_types.Run  # open, WS, task-2
    foreign_run: completion_types.Run  # OTHER_WS, task-x, with a settled completion
    runs_token: str  # a ListRuns page token of WS

    def snapshot(self) -> tuple:
        return table_dump(self.f.completion_db), table_dump(self.f.lifecycle_config.database)


# Every case asserts that it changed nothing, so the cases of this module share
# one world (one pair of servers) instead of starting their own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=ENGINES)
async def world(request, tmp_path_factory) -> World:
    tmp = tmp_path_factory.mktemp("bad-input")
    completion_db = await completion_database(request.param, tmp, "completion")
    f = Funnel(
        ManualClock(CLOCK_START_MICROS),
        tmp,
        LifecycleConfig(listen="127.0.0.1:0", database=str(tmp / "lifecycle.sqlite3"), health_interval=5.0),
        CompletionConfig(
            listen="127.0.0.1:0",
            database=completion_db,
            lifecycle_timeout=LIFECYCLE_TIMEOUT,
            settle_interval=0.05,
            health_interval=5.0,
        ),
        {},
    )
    await f.start()
    try:
        first = await f.registered_and_claimed("task-1", ttl_seconds=24 * 3600)
        second = await f.registered_and_claimed("task-2", ttl_seconds=24 * 3600)
        foreign = await f.registered_and_claimed("task-x", workspace=OTHER_WS)
        assert (await f.attempt(foreign)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
        page = await f.cs.ListRuns(
            completion_messages.ListRunsRequest(workspace_id=WS, page_size=1), timeout=CALL_TIMEOUT
        )
        assert page.next_page_token
        yield World(f, first.run, second.run, foreign.run, page.next_page_token)
    finally:
        await f.close()


def ttl(seconds: int = 60, nanos: int = 0) -> Duration:
    return Duration(seconds=seconds, nanos=nanos)


# -- request builders: a valid request, changed by the case ----------------------------


def claim(w: World, **kw) -> completion_messages.ClaimTaskRequest:
    fields = dict(workspace_id=WS, task_id="task-3", agent_id="agent-9", lease_ttl=ttl())
    fields.update(kw)
    return completion_messages.ClaimTaskRequest(**{k: v for k, v in fields.items() if v is not None})


def renew(w: World, **kw) -> completion_messages.RenewLeaseRequest:
    fields = dict(workspace_id=WS, run_id=w.run.run_id, epoch=w.run.epoch, lease_ttl=ttl())
    fields.update(kw)
    return completion_messages.RenewLeaseRequest(**{k: v for k, v in fields.items() if v is not None})


def complete(w: World, **kw) -> completion_messages.CompleteRunRequest:
    fields = dict(workspace_id=WS, run_id=w.run.run_id, outcome=completion_enums.RUN_OUTCOME_FAILED)
    fields.update(kw)
    return completion_messages.CompleteRunRequest(**fields)


def get_run(w: World, **kw) -> completion_messages.GetRunRequest:
    return completion_messages.GetRunRequest(**{"workspace_id": WS, "run_id": w.run.run_id, **kw})


def list_runs(w: World, **kw) -> completion_messages.ListRunsRequest:
    return completion_messages.ListRunsRequest(**{"workspace_id": WS, **kw})


def evidence(w: World, **kw) -> completion_messages.RecordEvidenceRequest:
    fields = dict(
        workspace_id=WS, task_id="task-1", generation=1, kind="tests", verdict=completion_enums.EVIDENCE_VERDICT_PASSED
    )
    fields.update(kw)
    return completion_messages.RecordEvidenceRequest(**fields)


def list_evidence(w: World, **kw) -> completion_messages.ListEvidenceRequest:
    return completion_messages.ListEvidenceRequest(**{"workspace_id": WS, "task_id": "task-1", **kw})


EVIDENCE_TOKEN = encode_token(["evidence", WS, "task-1", "0"], [1, "evd_1"])


def attempt(w: World, **kw) -> completion_messages.AttemptCompletionRequest:
    fields = dict(
        workspace_id=WS,
        task_id="task-1",
        run_id=w.run.run_id,
        epoch=w.run.epoch,
        outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
        result="done",
    )
    fields.update(kw)
    return completion_messages.AttemptCompletionRequest(**fields)


def get_completion(w: World, **kw) -> completion_messages.GetCompletionRequest:
    return completion_messages.GetCompletionRequest(**{"workspace_id": WS, "task_id": "task-1", "generation": 1, **kw})


def list_completions(w: World, **kw) -> completion_messages.ListCompletionsRequest:
    return completion_messages.ListCompletionsRequest(**{"workspace_id": WS, **kw})


def list_audit(w: World, **kw) -> completion_messages.ListAuditLogRequest:
    return completion_messages.ListAuditLogRequest(**{"workspace_id": WS, **kw})


def watch(w: World, **kw) -> completion_messages.WatchCompletionEventsRequest:
    return completion_messages.WatchCompletionEventsRequest(**{"workspace_id": WS, **kw})


def list_events(w: World, **kw) -> completion_messages.ListCompletionEventsRequest:
    return completion_messages.ListCompletionEventsRequest(**{"workspace_id": WS, **kw})


INVALID = Code.INVALID_ARGUMENT
NOT_FOUND = Code.NOT_FOUND


def id_cases(rpc: str, build: Callable, field: str, *, required: bool = True) -> list:
    """The ways an id field can be malformed."""
    cases = [
        (rpc, lambda w: build(w, **{field: "has space"}), INVALID, "FIELD_MALFORMED", field),
        (rpc, lambda w: build(w, **{field: "tab\there"}), INVALID, "FIELD_MALFORMED", field),
        (rpc, lambda w: build(w, **{field: "e\u0301"}), INVALID, "FIELD_MALFORMED", field),  # not NFC
        (rpc, lambda w: build(w, **{field: "zero\u200bwidth"}), INVALID, "FIELD_MALFORMED", field),
        (rpc, lambda w: build(w, **{field: TOO_LONG_ID}), INVALID, "FIELD_TOO_LONG", field),
    ]
    if required:
        cases.append((rpc, lambda w: build(w, **{field: ""}), INVALID, "FIELD_REQUIRED", field))
    return cases


CASES = [
    # ClaimTask
    *id_cases("ClaimTask", claim, "workspace_id"),
    *id_cases("ClaimTask", claim, "task_id"),
    *id_cases("ClaimTask", claim, "agent_id"),
    *id_cases("ClaimTask", claim, "request_id", required=False),
    ("ClaimTask", lambda w: claim(w, lease_ttl=None), INVALID, "FIELD_REQUIRED", "lease_ttl"),
    ("ClaimTask", lambda w: claim(w, lease_ttl=ttl(0, 999_999_000)), INVALID, "VALUE_OUT_OF_RANGE", "lease_ttl"),
    ("ClaimTask", lambda w: claim(w, lease_ttl=ttl(0)), INVALID, "VALUE_OUT_OF_RANGE", "lease_ttl"),
    ("ClaimTask", lambda w: claim(w, lease_ttl=ttl(-60)), INVALID, "VALUE_OUT_OF_RANGE", "lease_ttl"),
    ("ClaimTask", lambda w: claim(w, lease_ttl=ttl(24 * 3600 + 1)), INVALID, "VALUE_OUT_OF_RANGE", "lease_ttl"),
    ("ClaimTask", lambda w: claim(w, task_id="no-such-task"), NOT_FOUND, "TASK_NOT_FOUND", None),
    ("ClaimTask", lambda w: claim(w, task_id="task-x"), NOT_FOUND, "TASK_NOT_FOUND", None),  # another workspace's
    # RenewLease
    *id_cases("RenewLease", renew, "workspace_id"),
    *id_cases("RenewLease", renew, "run_id"),
    ("RenewLease", lambda w: renew(w, epoch=0), INVALID, "VALUE_OUT_OF_RANGE", "epoch"),
    ("RenewLease", lambda w: renew(w, epoch=-1), INVALID, "VALUE_OUT_OF_RANGE", "epoch"),
    ("RenewLease", lambda w: renew(w, lease_ttl=None), INVALID, "FIELD_REQUIRED", "lease_ttl"),
    ("RenewLease", lambda w: renew(w, lease_ttl=ttl(0, 500_000_000)), INVALID, "VALUE_OUT_OF_RANGE", "lease_ttl"),
    ("RenewLease", lambda w: renew(w, lease_ttl=ttl(10**6)), INVALID, "VALUE_OUT_OF_RANGE", "lease_ttl"),
    ("RenewLease", lambda w: renew(w, run_id=w.foreign_run.run_id), NOT_FOUND, "RUN_NOT_FOUND", None),
    ("RenewLease", lambda w: renew(w, run_id="run_unknown"), NOT_FOUND, "RUN_NOT_FOUND", None),
    ("RenewLease", lambda w: renew(w, workspace_id=OTHER_WS), NOT_FOUND, "RUN_NOT_FOUND", None),
    # CompleteRun
    *id_cases("CompleteRun", complete, "workspace_id"),
    *id_cases("CompleteRun", complete, "run_id"),
    *id_cases("CompleteRun", complete, "request_id", required=False),
    (
        "CompleteRun",
        lambda w: complete(w, outcome=completion_enums.RUN_OUTCOME_UNSPECIFIED),
        INVALID,
        "ENUM_UNSPECIFIED",
        "outcome",
    ),
    ("CompleteRun", lambda w: complete(w, outcome=99), INVALID, "ENUM_UNSPECIFIED", "outcome"),
    ("CompleteRun", lambda w: complete(w, tokens_input=-1), INVALID, "VALUE_OUT_OF_RANGE", "tokens_input"),
    ("CompleteRun", lambda w: complete(w, tokens_output=-5), INVALID, "VALUE_OUT_OF_RANGE", "tokens_output"),
    ("CompleteRun", lambda w: complete(w, tokens_total=-1), INVALID, "VALUE_OUT_OF_RANGE", "tokens_total"),
    ("CompleteRun", lambda w: complete(w, tokens_total=2**53), INVALID, "VALUE_OUT_OF_RANGE", "tokens_total"),
    ("CompleteRun", lambda w: complete(w, notes="n" * (MIB + 1)), INVALID, "FIELD_TOO_LONG", "notes"),
    ("CompleteRun", lambda w: complete(w, error="e" * 8193), INVALID, "FIELD_TOO_LONG", "error"),
    ("CompleteRun", lambda w: complete(w, final_status=99), INVALID, "ENUM_UNSPECIFIED", "final_status"),
    ("CompleteRun", lambda w: complete(w, run_id=w.foreign_run.run_id), NOT_FOUND, "RUN_NOT_FOUND", None),
    ("CompleteRun", lambda w: complete(w, run_id="run_unknown"), NOT_FOUND, "RUN_NOT_FOUND", None),
    # GetRun
    *id_cases("GetRun", get_run, "workspace_id"),
    *id_cases("GetRun", get_run, "run_id"),
    ("GetRun", lambda w: get_run(w, run_id=w.foreign_run.run_id), NOT_FOUND, "RUN_NOT_FOUND", None),
    ("GetRun", lambda w: get_run(w, workspace_id=OTHER_WS), NOT_FOUND, "RUN_NOT_FOUND", None),
    # ListRuns
    *id_cases("ListRuns", list_runs, "workspace_id"),
    *id_cases("ListRuns", list_runs, "task_id", required=False),
    ("ListRuns", lambda w: list_runs(w, page_size=-1), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListRuns", lambda w: list_runs(w, page_size=1001), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListRuns", lambda w: list_runs(w, page_token="not a token!"), INVALID, "FIELD_MALFORMED", "page_token"),
    ("ListRuns", lambda w: list_runs(w, page_token=w.runs_token[:-3]), INVALID, "FIELD_MALFORMED", "page_token"),
    # A token is bound to its listing: another workspace, another filter.
    (
        "ListRuns",
        lambda w: list_runs(w, workspace_id=OTHER_WS, page_token=w.runs_token),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListRuns",
        lambda w: list_runs(w, task_id="task-1", page_token=w.runs_token),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListRuns",
        lambda w: list_runs(w, page_token=encode_token(["runs", WS, ""], [1, 2])),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListRuns",
        lambda w: list_runs(w, page_token=encode_token(["runs", WS, ""], 5)),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    # Forged cursors with integers no database column can hold are malformed, not a fault.
    (
        "ListRuns",
        lambda w: list_runs(w, page_token=encode_token(["runs", WS, ""], [10**30, "run"])),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    # ListEvidence
    *id_cases("ListEvidence", list_evidence, "workspace_id"),
    *id_cases("ListEvidence", list_evidence, "task_id"),
    ("ListEvidence", lambda w: list_evidence(w, generation=-1), INVALID, "VALUE_OUT_OF_RANGE", "generation"),
    ("ListEvidence", lambda w: list_evidence(w, page_size=1001), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListEvidence", lambda w: list_evidence(w, page_token="not a token!"), INVALID, "FIELD_MALFORMED", "page_token"),
    # A token is bound to its listing: another task, another generation.
    (
        "ListEvidence",
        lambda w: list_evidence(w, task_id="task-2", page_token=EVIDENCE_TOKEN),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListEvidence",
        lambda w: list_evidence(w, generation=1, page_token=EVIDENCE_TOKEN),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListEvidence",
        lambda w: list_evidence(w, page_token=encode_token(["evidence", WS, "task-1", "0"], 5)),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    # RecordEvidence
    *id_cases("RecordEvidence", evidence, "workspace_id"),
    *id_cases("RecordEvidence", evidence, "task_id"),
    *id_cases("RecordEvidence", evidence, "kind"),
    *id_cases("RecordEvidence", evidence, "checkpoint", required=False),
    *id_cases("RecordEvidence", evidence, "run_id", required=False),
    *id_cases("RecordEvidence", evidence, "request_id", required=False),
    ("RecordEvidence", lambda w: evidence(w, generation=0), INVALID, "VALUE_OUT_OF_RANGE", "generation"),
    ("RecordEvidence", lambda w: evidence(w, generation=-2), INVALID, "VALUE_OUT_OF_RANGE", "generation"),
    (
        "RecordEvidence",
        lambda w: evidence(w, verdict=completion_enums.EVIDENCE_VERDICT_UNSPECIFIED),
        INVALID,
        "ENUM_UNSPECIFIED",
        "verdict",
    ),
    ("RecordEvidence", lambda w: evidence(w, verdict=42), INVALID, "ENUM_UNSPECIFIED", "verdict"),
    ("RecordEvidence", lambda w: evidence(w, details="d" * 8193), INVALID, "FIELD_TOO_LONG", "details"),
    # AttemptCompletion
    *id_cases("AttemptCompletion", attempt, "workspace_id"),
    *id_cases("AttemptCompletion", attempt, "task_id"),
    *id_cases("AttemptCompletion", attempt, "run_id"),
    *id_cases("AttemptCompletion", attempt, "request_id", required=False),
    ("AttemptCompletion", lambda w: attempt(w, epoch=0), INVALID, "VALUE_OUT_OF_RANGE", "epoch"),
    ("AttemptCompletion", lambda w: attempt(w, epoch=-7), INVALID, "VALUE_OUT_OF_RANGE", "epoch"),
    (
        "AttemptCompletion",
        lambda w: attempt(w, outcome=completion_enums.REQUESTED_OUTCOME_UNSPECIFIED),
        INVALID,
        "ENUM_UNSPECIFIED",
        "outcome",
    ),
    ("AttemptCompletion", lambda w: attempt(w, outcome=3), INVALID, "ENUM_UNSPECIFIED", "outcome"),
    ("AttemptCompletion", lambda w: attempt(w, result="r" * 16385), INVALID, "FIELD_TOO_LONG", "result"),
    ("AttemptCompletion", lambda w: attempt(w, state_version=-1), INVALID, "VALUE_OUT_OF_RANGE", "state_version"),
    ("AttemptCompletion", lambda w: attempt(w, task_id="no-such-task"), NOT_FOUND, "TASK_NOT_FOUND", None),
    (
        "AttemptCompletion",
        lambda w: attempt(w, task_id="task-x", run_id=w.foreign_run.run_id),
        NOT_FOUND,
        "TASK_NOT_FOUND",
        None,
    ),
    ("AttemptCompletion", lambda w: attempt(w, run_id=w.foreign_run.run_id), NOT_FOUND, "RUN_NOT_FOUND", None),
    ("AttemptCompletion", lambda w: attempt(w, run_id="run_unknown"), NOT_FOUND, "RUN_NOT_FOUND", None),
    # A run of another task of the same workspace is not this task's run.
    ("AttemptCompletion", lambda w: attempt(w, run_id=w.other_run.run_id), NOT_FOUND, "RUN_NOT_FOUND", None),
    # GetCompletion
    *id_cases("GetCompletion", get_completion, "workspace_id"),
    *id_cases("GetCompletion", get_completion, "task_id"),
    ("GetCompletion", lambda w: get_completion(w, generation=0), INVALID, "VALUE_OUT_OF_RANGE", "generation"),
    ("GetCompletion", lambda w: get_completion(w, generation=-1), INVALID, "VALUE_OUT_OF_RANGE", "generation"),
    ("GetCompletion", lambda w: get_completion(w, generation=2**53), INVALID, "VALUE_OUT_OF_RANGE", "generation"),
    ("GetCompletion", lambda w: get_completion(w, task_id="task-x"), NOT_FOUND, "COMPLETION_NOT_FOUND", None),
    (
        "GetCompletion",
        lambda w: get_completion(w, task_id="task-x", generation=2, workspace_id=OTHER_WS),
        NOT_FOUND,
        "COMPLETION_NOT_FOUND",
        None,
    ),
    # ListCompletions
    *id_cases("ListCompletions", list_completions, "workspace_id"),
    *id_cases("ListCompletions", list_completions, "task_id", required=False),
    ("ListCompletions", lambda w: list_completions(w, page_size=-3), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListCompletions", lambda w: list_completions(w, page_size=5000), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListCompletions", lambda w: list_completions(w, page_token="%%%"), INVALID, "FIELD_MALFORMED", "page_token"),
    (
        "ListCompletions",
        lambda w: list_completions(w, page_token=w.runs_token),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListCompletions",
        lambda w: list_completions(w, page_token=encode_token(["completions", WS, ""], [-(10**30), "c"])),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    ("ListCompletions", lambda w: list_completions(w, settlement=99), INVALID, "ENUM_UNSPECIFIED", "settlement"),
    # The settlement filter is part of the listing: an unfiltered token does not page the outbox.
    (
        "ListCompletions",
        lambda w: list_completions(
            w,
            settlement=completion_enums.SETTLEMENT_STATUS_PENDING,
            page_token=encode_token(["completions", WS, ""], [1, "c"]),
        ),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    # ListAuditLog
    *id_cases("ListAuditLog", list_audit, "workspace_id"),
    *id_cases("ListAuditLog", list_audit, "task_id", required=False),
    *id_cases("ListAuditLog", list_audit, "run_id", required=False),
    ("ListAuditLog", lambda w: list_audit(w, page_size=-1), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListAuditLog", lambda w: list_audit(w, page_size=1001), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListAuditLog", lambda w: list_audit(w, page_token="garbage"), INVALID, "FIELD_MALFORMED", "page_token"),
    ("ListAuditLog", lambda w: list_audit(w, page_token=w.runs_token), INVALID, "FIELD_MALFORMED", "page_token"),
    (
        "ListAuditLog",
        lambda w: list_audit(w, page_token=encode_token(["audit", WS, "", ""], "7")),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    (
        "ListAuditLog",
        lambda w: list_audit(w, page_token=encode_token(["audit", WS, "", ""], 2**64)),
        INVALID,
        "FIELD_MALFORMED",
        "page_token",
    ),
    # ListCompletionEvents
    *id_cases("ListCompletionEvents", list_events, "workspace_id"),
    *id_cases("ListCompletionEvents", list_events, "task_id", required=False),
    (
        "ListCompletionEvents",
        lambda w: list_events(w, after_sequence=-1),
        INVALID,
        "VALUE_OUT_OF_RANGE",
        "after_sequence",
    ),
    ("ListCompletionEvents", lambda w: list_events(w, page_size=-1), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    ("ListCompletionEvents", lambda w: list_events(w, page_size=1001), INVALID, "VALUE_OUT_OF_RANGE", "page_size"),
    # WatchCompletionEvents
    *id_cases("WatchCompletionEvents", watch, "workspace_id"),
    *id_cases("WatchCompletionEvents", watch, "task_id", required=False),
    ("WatchCompletionEvents", lambda w: watch(w, after_sequence=-1), INVALID, "VALUE_OUT_OF_RANGE", "after_sequence"),
]


def case_id(case) -> str:
    rpc, _, _, reason, field = case
    return f"{rpc}-{field or 'resource'}-{reason}"


async def call(f: Funnel, rpc: str, request):
    method = getattr(f.cs, rpc)
    if rpc == "WatchCompletionEvents":
        stream = method(request, timeout=CALL_TIMEOUT)
        async for _ in stream:  # an error ends the stream before any event
            pytest.fail("the stream delivered an event")
        return None
    return await method(request, timeout=CALL_TIMEOUT)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
async def test_bad_input_is_rejected_with_its_reason_and_changes_nothing(world, case):
    rpc, build, code, reason, field = case
    request = build(world)
    before = world.snapshot()
    await rejected(call(world.f, rpc, request), code, reason, field=field)
    assert world.snapshot() == before


RPCS = [
    "ClaimTask",
    "RenewLease",
    "CompleteRun",
    "GetRun",
    "ListRuns",
    "RecordEvidence",
    "ListEvidence",
    "AttemptCompletion",
    "GetCompletion",
    "ListCompletions",
    "ListAuditLog",
    "ListCompletionEvents",
    "WatchCompletionEvents",
]


async def test_every_rpc_of_the_contract_has_bad_input_cases():
    # A new RPC of the contract must come with its bad-input cases.
    rpcs = {m.name for m in completion_service_pb2.DESCRIPTOR.services_by_name["CompletionService"].methods}
    assert rpcs == set(RPCS) == {case[0] for case in CASES}


async def test_every_violation_of_a_request_is_listed_and_the_first_is_named(world):
    error = await rejected(
        world.f.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(workspace_id=WS, agent_id="a b"), timeout=CALL_TIMEOUT
        ),
        INVALID,
        "FIELD_REQUIRED",
        field="task_id",
    )
    assert [name for name, _ in field_violations(error)] == ["task_id", "agent_id", "lease_ttl"]
    assert all(description for _, description in field_violations(error))


async def test_the_workspace_is_checked_first_and_alone(world):
    # The boundary checks (and authorizes) the workspace before the request is read.
    error = await rejected(
        world.f.cs.ClaimTask(completion_messages.ClaimTaskRequest(agent_id="a b"), timeout=CALL_TIMEOUT),
        INVALID,
        "FIELD_REQUIRED",
        field="workspace_id",
    )
    assert [name for name, _ in field_violations(error)] == ["workspace_id"]


async def test_another_workspace_sees_nothing(world):
    f = world.f
    foreign = world.foreign_run
    runs = await f.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS), timeout=CALL_TIMEOUT)
    assert foreign.run_id not in [r.run_id for r in runs.runs] and len(runs.runs) == 2
    completions = await f.cs.ListCompletions(
        completion_messages.ListCompletionsRequest(workspace_id=WS), timeout=CALL_TIMEOUT
    )
    assert list(completions.completions) == []
    # This workspace's own two claims, nothing of the other's.
    assert {e.run_id for e in await f.completion_events(workspace=WS)} == {r.run_id for r in runs.runs}
    assert [
        r.run_id
        for r in (
            await f.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=OTHER_WS), timeout=CALL_TIMEOUT)
        ).runs
    ] == [foreign.run_id]


async def test_a_request_above_the_message_limit_is_resource_exhausted(world):
    before = world.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await world.f.cs.CompleteRun(
            completion_messages.CompleteRunRequest(
                workspace_id=WS,
                run_id=world.run.run_id,
                outcome=completion_enums.RUN_OUTCOME_FAILED,
                notes="n" * (5 * MIB),
            ),
            timeout=CALL_TIMEOUT,
        )
    assert caught.value.code() == Code.RESOURCE_EXHAUSTED, caught.value.details()
    assert world.snapshot() == before


def _raw_methods(channel: grpc.aio.Channel, rpc: str):
    path = f"/funnel.completion.v1.CompletionService/{rpc}"
    if rpc == "WatchCompletionEvents":
        return channel.unary_stream(path)
    return channel.unary_unary(path)


async def _raw_call(channel, rpc: str, payload: bytes) -> grpc.aio.AioRpcError | None:
    method = _raw_methods(channel, rpc)
    try:
        if rpc == "WatchCompletionEvents":
            stream = method(payload, timeout=1.0)
            try:
                async for _ in stream:
                    break
            except grpc.aio.AioRpcError as error:
                # A request that decoded into a valid watch simply waits for events.
                if error.code() == Code.DEADLINE_EXCEEDED and error_info(error) is None:
                    return None
                raise
            finally:
                stream.cancel()
            return None
        await method(payload, timeout=CALL_TIMEOUT)
        return None
    except grpc.aio.AioRpcError as error:
        return error


@pytest.mark.parametrize("rpc", RPCS)
async def test_undecodable_requests_are_invalid_argument_not_unknown(world, rpc):
    before = world.snapshot()
    async with credentials.insecure_channel(world.f.completion.address) as channel:
        # A truncated length-delimited field: no protobuf parser accepts it.
        error = await _raw_call(channel, rpc, b"\x0a\x05ab")
    assert error is not None
    assert error.code() == Code.INVALID_ARGUMENT, (error.code(), error.details())
    info = error_info(error)
    assert (info.reason, info.domain) == ("FIELD_MALFORMED", DOMAIN)
    assert world.snapshot() == before


async def test_random_bytes_never_yield_unknown(world):
    rng = random.Random(20240601)
    async with credentials.insecure_channel(world.f.completion.address) as channel:
        for rpc in RPCS:
            for _ in range(8):
                payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
                error = await _raw_call(channel, rpc, payload)
                if error is None:
                    continue
                assert error.code() not in (Code.UNKNOWN, Code.INTERNAL), (rpc, payload, error.code(), error.details())
                info = error_info(error)
                assert info is not None and info.domain == DOMAIN, (rpc, payload, error.details())
