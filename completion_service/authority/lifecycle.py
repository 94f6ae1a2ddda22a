"""Reading the lifecycle service's record of a task, and its failures as this
service's errors."""

from __future__ import annotations

from completion_service.clients.lifecycle_client import LifecycleClient, LifecycleRejected, LifecycleUnavailable
from completion_service.core.model import RunRecord
from completion_service.errors import Reason
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime.errors import ServiceError, reject


async def read_task(lifecycle: LifecycleClient, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
    """The lifecycle record of a task, with lifecycle errors mapped to this service's."""
    try:
        return await lifecycle.get_task(workspace_id, task_id)
    except LifecycleRejected as exc:
        raise rejected(exc, task_id) from None
    except LifecycleUnavailable as exc:
        raise unavailable(exc) from None


def unavailable(exc: LifecycleUnavailable) -> ServiceError:
    return ServiceError(
        reject(Reason.LIFECYCLE_UNAVAILABLE, f"the lifecycle service did not answer: {exc}; nothing was applied here")
    )


def rejected(exc: LifecycleRejected, task_id: str) -> ServiceError:
    if exc.reason == "TASK_NOT_FOUND":
        return ServiceError(reject(Reason.TASK_NOT_FOUND, exc.message, task_id=task_id))
    return ServiceError(
        reject(Reason.LIFECYCLE_REJECTED, f"the lifecycle service refused: {exc.message}", lifecycle_reason=exc.reason)
    )


def close_refused(exc: LifecycleRejected, run: RunRecord) -> ServiceError:
    return ServiceError(
        reject(
            Reason.LIFECYCLE_REJECTED,
            f"the lifecycle service refused what closing run {run.run_id} needs ({exc.reason}: {exc.message}); "
            "the run stays open: close it with another outcome (STALLED leaves the task as it is)",
            lifecycle_reason=exc.reason,
            run_id=run.run_id,
        )
    )
