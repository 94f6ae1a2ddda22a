"""Checks incoming requests and turns them into typed intents.

Every problem of a request is reported at once (one BadRequest field violation
each); the ErrorInfo reason is the first problem's."""

from __future__ import annotations

from typing import Any, Protocol, TypedDict, cast

from funnel.auth.principal import Caller, Role
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.paging import MAX_PAGE_SIZE
from funnel.runtime.timestamps import timestamp_problem, to_micros
from funnel.runtime.validation import MAX_ID_LENGTH, Checker
from lifecycle_service.api.convert import cause_from_proto, parent_from_proto
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    SETTABLE_WORK_STATUSES,
    Cause,
    GenerationState,
    LinkMode,
    Outcome,
    WorkStatus,
)
from lifecycle_service.errors import Reason
from lifecycle_service.storage.port import TaskQuery

MAX_CAUSE_REASON_LENGTH = 1024
MAX_ORIGINATING_IDS = 16
MAX_ORIGINATING_ID_VALUE_LENGTH = 256
MAX_SUBJECT_LENGTH = 256
ROLE_NAMES = frozenset(role.value for role in Role)

_WORK_STATUSES = [status.value for status in WorkStatus]
_SETTABLE = [status.value for status in SETTABLE_WORK_STATUSES]
_LINK_MODES = [mode.value for mode in LinkMode]


class _Mutation(Protocol):
    """The header every mutating request carries."""

    @property
    def workspace_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def expected_revision(self) -> int: ...
    @property
    def cause(self) -> lifecycle_types.Cause: ...
    def HasField(self, field_name: Any) -> bool: ...


class _GenerationMutation(_Mutation, Protocol):
    """A mutating request of one generation: all but RegisterTaskRequest (registration makes generation 1)."""

    @property
    def generation(self) -> int: ...


class _Header(TypedDict):
    """The intent's fields from the request header (see `Intent`)."""

    workspace_id: str
    task_id: str
    request_id: str | None
    expected_revision: int | None
    cause: Cause


def raise_if_invalid(checker: Checker) -> None:
    checker.raise_for(Reason)


def _check_header(checker: Checker, request: _Mutation, *, with_generation: bool = True) -> None:
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    if with_generation:
        # Only register_task, whose request has no generation, passes with_generation=False.
        checker.integer("generation", cast(_GenerationMutation, request).generation, minimum=1)
    checker.identifier("request_id", request.request_id, required=False)
    if request.HasField("expected_revision"):
        checker.integer("expected_revision", request.expected_revision, minimum=0)
    cause = request.cause
    checker.text("cause.source", cause.source, MAX_ID_LENGTH)
    checker.text("cause.reason", cause.reason, MAX_CAUSE_REASON_LENGTH)
    if len(cause.originating_ids) > MAX_ORIGINATING_IDS:
        checker.integer("cause.originating_ids", len(cause.originating_ids), minimum=0, maximum=MAX_ORIGINATING_IDS)
    for key, value in sorted(cause.originating_ids.items()):
        checker.identifier(f"cause.originating_ids[{key!r}]", key)
        checker.text(f"cause.originating_ids[{key!r}]", value, MAX_ORIGINATING_ID_VALUE_LENGTH)


def _header(request: _Mutation) -> _Header:
    return {
        "workspace_id": request.workspace_id,
        "task_id": request.task_id,
        "request_id": request.request_id or None,
        "expected_revision": request.expected_revision if request.HasField("expected_revision") else None,
        "cause": cause_from_proto(request.cause),
    }


def _settable_status(checker: Checker, field: str, value: int, *, required: bool) -> None:
    if value in (WorkStatus.DONE.value, WorkStatus.CANCELLED.value):
        checker.add(
            "WORK_STATUS_RESERVED", field, f"{field} {WorkStatus(value).name} is reached only through a settlement"
        )
    else:
        checker.enum(field, value, _SETTABLE, required=required)


def register_task(request: lifecycle_messages.RegisterTaskRequest) -> i.RegisterTask:
    checker = Checker()
    _check_header(checker, request, with_generation=False)
    parent = None
    if request.HasField("parent"):
        link = request.parent
        checker.identifier("parent.task_id", link.task_id)
        checker.integer("parent.generation", link.generation, minimum=1)
        checker.enum("parent.mode", link.mode, _LINK_MODES)
        if link.task_id and link.task_id == request.task_id:
            checker.malformed("parent.task_id", "a task cannot be its own parent")
        parent = parent_from_proto(link) if not checker.violations else None
    raise_if_invalid(checker)
    return i.RegisterTask(parent=parent, **_header(request))


def activate_generation(request: lifecycle_messages.ActivateGenerationRequest) -> i.ActivateGeneration:
    checker = Checker()
    _check_header(checker, request)
    _settable_status(checker, "work_status", request.work_status, required=False)
    raise_if_invalid(checker)
    status = WorkStatus(request.work_status) if request.work_status else None
    return i.ActivateGeneration(generation=request.generation, work_status=status, **_header(request))


def set_work_status(request: lifecycle_messages.SetWorkStatusRequest) -> i.SetWorkStatus:
    checker = Checker()
    _check_header(checker, request)
    _settable_status(checker, "work_status", request.work_status, required=True)
    raise_if_invalid(checker)
    return i.SetWorkStatus(
        generation=request.generation, work_status=WorkStatus(request.work_status), **_header(request)
    )


def settle_completion(request: lifecycle_messages.SettleCompletionRequest) -> i.SettleCompletion:
    checker = Checker()
    _check_header(checker, request)
    checker.identifier("completion_id", request.completion_id)
    checker.require("authoritative_time", request.HasField("authoritative_time"))
    if request.HasField("authoritative_time"):
        problem = timestamp_problem(request.authoritative_time)
        if problem:
            checker.malformed("authoritative_time", f"authoritative_time has {problem}")
    raise_if_invalid(checker)
    return i.SettleCompletion(
        generation=request.generation,
        completion_id=request.completion_id,
        authoritative_at=to_micros(request.authoritative_time),
        **_header(request),
    )


# Items of one SettleCompletions call: what the completion service sends together
# under load, bounded like one group of the store's writer.
MAX_SETTLE_ITEMS = 64


def check_settle_completions(request: lifecycle_messages.SettleCompletionsRequest) -> None:
    """The call's own fields; each item is checked as SettleCompletion checks it,
    and answered on its own (service.SettleCompletions)."""
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.require("items", len(request.items) > 0)
    if len(request.items) > MAX_SETTLE_ITEMS:
        checker.add(
            "VALUE_OUT_OF_RANGE",
            "items",
            f"items holds {len(request.items)}, at most {MAX_SETTLE_ITEMS}",
            maximum=MAX_SETTLE_ITEMS,
        )
    for n, item in enumerate(request.items):
        if item.workspace_id != request.workspace_id:
            checker.malformed(f"items[{n}].workspace_id", "every item is of the call's workspace_id")
    raise_if_invalid(checker)


def plain_intent(intent_type: type[i.Intent], request: _GenerationMutation) -> i.Intent:
    """Intents that carry only the common fields."""
    checker = Checker()
    _check_header(checker, request)
    raise_if_invalid(checker)
    return intent_type(generation=request.generation, **_header(request))


def resume_with_generation(request: lifecycle_messages.ResumeWithGenerationRequest) -> tuple[i.Intent, Caller | None]:
    """The resume intent, and the caller it is resumed for (`on_behalf_of`), if named."""
    checker = Checker()
    _check_header(checker, request)
    named = None
    if request.HasField("on_behalf_of"):
        named = request.on_behalf_of
        checker.text("on_behalf_of.subject", named.subject, MAX_SUBJECT_LENGTH, required=True)
        if named.role not in ROLE_NAMES:
            checker.malformed("on_behalf_of.role", f"on_behalf_of.role must be one of {', '.join(sorted(ROLE_NAMES))}")
    raise_if_invalid(checker)
    intent = i.ResumeWithGeneration(generation=request.generation, **_header(request))
    return intent, Caller(named.subject, named.role) if named is not None else None


def task_key(request: lifecycle_messages.GetTaskRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    raise_if_invalid(checker)


def page(checker: Checker, page_size: int) -> None:
    checker.integer("page_size", page_size, minimum=0, maximum=MAX_PAGE_SIZE)


def list_tasks(request: lifecycle_messages.ListTasksRequest) -> tuple[TaskQuery, bool]:
    """The listing's filters, and whether it is in last-change order."""
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("parent_task_id", request.parent_task_id, required=False)
    page(checker, request.page_size)
    checker.enum("state", request.state, [s.value for s in GenerationState], required=False)
    checker.enum("outcome", request.outcome, [o.value for o in Outcome], required=False)
    checker.enum("work_status", request.work_status, _WORK_STATUSES, required=False)
    checker.identifier("task_id_prefix", request.task_id_prefix, required=False)
    checker.enum("order", request.order, list(lifecycle_enums.TaskOrder.values()), required=False)
    raise_if_invalid(checker)
    query = TaskQuery(
        parent_task_id=request.parent_task_id or None,
        state=GenerationState(request.state) if request.state else None,
        outcome=Outcome(request.outcome) if request.outcome else None,
        work_status=WorkStatus(request.work_status) if request.work_status else None,
        task_id_prefix=request.task_id_prefix,
    )
    return query, request.order == lifecycle_enums.TASK_ORDER_LAST_CHANGE


def count_tasks(request: lifecycle_messages.CountTasksRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    raise_if_invalid(checker)


def list_events(request: lifecycle_messages.ListLifecycleEventsRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id)
    page(checker, request.page_size)
    raise_if_invalid(checker)


def watch(request: lifecycle_messages.WatchLifecycleEventsRequest) -> None:
    checker = Checker()
    checker.identifier("workspace_id", request.workspace_id)
    checker.identifier("task_id", request.task_id, required=False)
    if request.from_head and request.after_sequence:
        checker.add(
            "VALUE_OUT_OF_RANGE",
            "after_sequence",
            "after_sequence must be 0 with from_head: the stream starts at the head",
            minimum=0,
            maximum=0,
        )
    else:
        checker.integer("after_sequence", request.after_sequence, minimum=0, maximum=2**63 - 1)
    raise_if_invalid(checker)
