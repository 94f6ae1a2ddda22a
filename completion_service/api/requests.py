"""Checks incoming completion and transcript requests: every problem is reported
at once, with the ErrorInfo reason of the first."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from completion_service.api.event_rules import check_event
from completion_service.core.model import FinalStatus, RequestedOutcome, RunOutcome, SettlementStatus
from completion_service.errors import Reason
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.runtime.paging import MAX_PAGE_SIZE
from funnel.runtime.validation import Checker

MIN_LEASE_TTL_SECONDS = 1
MAX_LEASE_TTL_SECONDS = 24 * 3600
MAX_NOTES_LENGTH = 1024 * 1024
MAX_ERROR_LENGTH = 8192
MAX_DETAILS_LENGTH = 8192
MAX_RESULT_LENGTH = 16384
# Events in one AppendTranscript batch.
MAX_BATCH = 1000

_OUTCOMES = [o.value for o in RunOutcome]
_STATUSES = [s.value for s in FinalStatus]
_REQUESTED = [o.value for o in RequestedOutcome]
_VERDICTS = [completion_enums.EVIDENCE_VERDICT_PASSED, completion_enums.EVIDENCE_VERDICT_FAILED]
_SETTLEMENTS = [s.value for s in SettlementStatus]
# The requests _listing_checks checks: each has a workspace_id, a page_size and its id filters.
ListRequest = (
    completion_messages.ListRunsRequest
    | completion_messages.ListEvidenceRequest
    | completion_messages.ListCompletionsRequest
    | completion_messages.ListAuditLogRequest
)


def ttl_micros(checker: Checker, field: str, present: bool, ttl: Duration) -> int:
    checker.require(field, present)
    if not present:
        return 0
    micros = ttl.seconds * 1_000_000 + ttl.nanos // 1000
    if not MIN_LEASE_TTL_SECONDS * 1_000_000 <= micros <= MAX_LEASE_TTL_SECONDS * 1_000_000:
        checker.add(
            "VALUE_OUT_OF_RANGE",
            field,
            f"{field} must be between {MIN_LEASE_TTL_SECONDS}s and {MAX_LEASE_TTL_SECONDS}s",
            minimum=f"{MIN_LEASE_TTL_SECONDS}s",
            maximum=f"{MAX_LEASE_TTL_SECONDS}s",
        )
    return micros


def claim_task(request: completion_messages.ClaimTaskRequest) -> int:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.identifier("agent_id", request.agent_id)
    checker.identifier("request_id", request.request_id, required=False)
    micros = ttl_micros(checker, "lease_ttl", request.HasField("lease_ttl"), request.lease_ttl)
    checker.raise_for(Reason)
    return micros


def renew_lease(request: completion_messages.RenewLeaseRequest) -> int:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("run_id", request.run_id)
    checker.integer("epoch", request.epoch, minimum=1)
    checker.identifier("request_id", request.request_id, required=False)
    micros = ttl_micros(checker, "lease_ttl", request.HasField("lease_ttl"), request.lease_ttl)
    checker.raise_for(Reason)
    return micros


def complete_run(request: completion_messages.CompleteRunRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("run_id", request.run_id)
    checker.enum("outcome", request.outcome, _OUTCOMES)
    for field in ("tokens_input", "tokens_output", "tokens_total"):
        if request.HasField(field):
            checker.integer(field, getattr(request, field), minimum=0)
    checker.text("notes", request.notes, MAX_NOTES_LENGTH)
    checker.text("error", request.error, MAX_ERROR_LENGTH)
    checker.enum("final_status", request.final_status, _STATUSES, required=False)
    checker.identifier("request_id", request.request_id, required=False)
    checker.raise_for(Reason)


def run_key(request: completion_messages.GetRunRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("run_id", request.run_id)
    checker.raise_for(Reason)


def record_evidence(request: completion_messages.RecordEvidenceRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.integer("generation", request.generation, minimum=1)
    checker.identifier("kind", request.kind)
    checker.enum("verdict", request.verdict, _VERDICTS)
    checker.identifier("checkpoint", request.checkpoint, required=False)
    checker.text("details", request.details, MAX_DETAILS_LENGTH)
    checker.identifier("run_id", request.run_id, required=False)
    checker.identifier("request_id", request.request_id, required=False)
    checker.raise_for(Reason)


def attempt_completion(request: completion_messages.AttemptCompletionRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.identifier("run_id", request.run_id)
    checker.integer("epoch", request.epoch, minimum=1)
    checker.enum("outcome", request.outcome, _REQUESTED)
    checker.text("result", request.result, MAX_RESULT_LENGTH)
    if request.HasField("state_version"):
        checker.integer("state_version", request.state_version, minimum=0)
    checker.identifier("request_id", request.request_id, required=False)
    checker.raise_for(Reason)


def get_completion(request: completion_messages.GetCompletionRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.integer("generation", request.generation, minimum=1)
    checker.raise_for(Reason)


def list_evidence(request: completion_messages.ListEvidenceRequest) -> None:
    checker = _listing_checks(request, ())
    checker.identifier("task_id", request.task_id)
    checker.integer("generation", request.generation, minimum=0)
    checker.raise_for(Reason)


def listing(request: ListRequest, *optional_id_fields: str) -> None:
    _listing_checks(request, optional_id_fields).raise_for(Reason)


def list_completions(request: completion_messages.ListCompletionsRequest) -> SettlementStatus | None:
    """The settlement filter of a valid request (None: every completion)."""
    checker = _listing_checks(request, ("task_id",))
    checker.enum("settlement", request.settlement, _SETTLEMENTS, required=False)
    checker.raise_for(Reason)
    return SettlementStatus(request.settlement) if request.settlement else None


def _listing_checks(request: ListRequest, optional_id_fields: tuple[str, ...]) -> Checker:
    """What every List request is checked for: its workspace, its optional id filters, its page size."""
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    for field in optional_id_fields:
        checker.identifier(field, getattr(request, field), required=False)
    checker.integer("page_size", request.page_size, minimum=0, maximum=MAX_PAGE_SIZE)
    return checker


def watch(
    request: completion_messages.WatchCompletionEventsRequest | completion_messages.ListCompletionEventsRequest,
) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id, required=False)
    checker.integer("after_sequence", request.after_sequence, minimum=0, maximum=2**63 - 1)
    if isinstance(request, completion_messages.ListCompletionEventsRequest):
        checker.integer("page_size", request.page_size, minimum=0, maximum=MAX_PAGE_SIZE)
    checker.raise_for(Reason)


# Transcript requests


def append_transcript(request: transcript_messages.AppendTranscriptRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.identifier("request_id", request.request_id, required=False)
    checker.integer("events", len(request.events), minimum=1, maximum=MAX_BATCH)
    if request.HasField("expected_state_version"):
        checker.integer("expected_state_version", request.expected_state_version, minimum=0)
    for index, event in enumerate(request.events[:MAX_BATCH]):
        check_event(checker, f"events[{index}]", event, imported=False)
    checker.raise_for(Reason)


def load_transcript(request: transcript_messages.LoadTranscriptRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.integer("page_size", request.page_size, minimum=0, maximum=MAX_PAGE_SIZE)
    checker.raise_for(Reason)


def task_named(request: transcript_messages.ExportTranscriptRequest | transcript_messages.ResolveResumeRequest) -> None:
    """A request naming only a task (ExportTranscript, ResolveResume)."""
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    checker.raise_for(Reason)


def import_target(first: transcript_messages.ImportTranscriptRequest | None) -> transcript_messages.ImportTarget:
    """The target an import stream's first message must name."""
    checker = Checker()
    checker.require("target", first is not None and first.WhichOneof("part") == "target")
    checker.raise_for(Reason)
    assert first is not None  # raise_for raised otherwise
    target = first.target
    checker.identifier("target.workspace_id", target.workspace_id)
    checker.identifier("target.task_id", target.task_id)
    checker.raise_for(Reason)
    return target
