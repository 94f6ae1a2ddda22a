"""The typed intents: the only way to change a task record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from funnel.auth.principal import Caller
from lifecycle_service.core.model import Cause, IntentKind, ParentLink, WorkStatus


@dataclass(frozen=True, kw_only=True)
class Intent:
    kind: ClassVar[IntentKind]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str | None = None
    expected_revision: int | None = None
    cause: Cause = Cause()
    # Who submitted it, as authenticated; recorded on its event.
    caller: Caller = Caller()


@dataclass(frozen=True, kw_only=True)
class RegisterTask(Intent):
    kind = IntentKind.REGISTER_TASK
    generation: int = 1
    parent: ParentLink | None = None


@dataclass(frozen=True, kw_only=True)
class ActivateGeneration(Intent):
    kind = IntentKind.ACTIVATE_GENERATION
    work_status: WorkStatus | None = None


@dataclass(frozen=True, kw_only=True)
class SuspendGeneration(Intent):
    kind = IntentKind.SUSPEND_GENERATION


@dataclass(frozen=True, kw_only=True)
class ResumeWithGeneration(Intent):
    kind = IntentKind.RESUME_WITH_GENERATION


@dataclass(frozen=True, kw_only=True)
class RequestCancellation(Intent):
    kind = IntentKind.REQUEST_CANCELLATION


@dataclass(frozen=True, kw_only=True)
class SettleCancellation(Intent):
    kind = IntentKind.SETTLE_CANCELLATION


@dataclass(frozen=True, kw_only=True)
class SettleCompletion(Intent):
    kind = IntentKind.SETTLE_COMPLETION
    completion_id: str
    # The completion's durable commit time; None (no proof) can never pass a fence.
    authoritative_at: int | None


@dataclass(frozen=True, kw_only=True)
class SettleFailure(Intent):
    kind = IntentKind.SETTLE_FAILURE


@dataclass(frozen=True, kw_only=True)
class SettleTimeout(Intent):
    kind = IntentKind.SETTLE_TIMEOUT


@dataclass(frozen=True, kw_only=True)
class PropagateParentTermination(Intent):
    kind = IntentKind.PROPAGATE_PARENT_TERMINATION


@dataclass(frozen=True, kw_only=True)
class SetWorkStatus(Intent):
    kind = IntentKind.SET_WORK_STATUS
    work_status: WorkStatus


BY_KIND: dict[IntentKind, type[Intent]] = {
    cls.kind: cls
    for cls in (
        RegisterTask,
        ActivateGeneration,
        SuspendGeneration,
        ResumeWithGeneration,
        RequestCancellation,
        SettleCancellation,
        SettleCompletion,
        SettleFailure,
        SettleTimeout,
        PropagateParentTermination,
        SetWorkStatus,
    )
}
