"""What happens when the server boundary (funnel.runtime.boundary) reports that
an RPC started and how it finished: the per-RPC metrics (funnel.runtime.metrics)
and one structured log line per request, denied calls included (with who was
denied and why)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from funnel.runtime.logs import fields
from funnel.runtime.metrics import RpcMetrics

log = logging.getLogger("funnel.request")

# Codes that say the caller was turned away at the door.
DENIED = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED"})
# Codes that say the service failed, not the caller.
FAULTS = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE"})


@dataclass(frozen=True)
class FinishedCall:
    # The full gRPC method, `/package.Service/Method`.
    path: str
    # unary, server_stream or client_stream (go-grpc-prometheus's grpc_type).
    rpc_type: str
    # The status code's name (OK, PERMISSION_DENIED, …) and the ErrorInfo reason ("" for OK).
    code: str
    reason: str
    # The status message the caller got ("" for OK).
    detail: str
    seconds: float
    # Who called: the authenticated subject and the role the call was admitted under
    # (None when authentication failed or the call was denied before a role was chosen).
    subject: str | None
    role: str | None
    peer: str
    # The request (a client stream's first message), if it was decoded.
    request: Any

    @property
    def service(self) -> str:
        return self.path.rsplit("/", 2)[-2]

    @property
    def method(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class CallObserver:
    def __init__(self, rpc: RpcMetrics | None) -> None:
        self._rpc = rpc

    def started(self, path: str, rpc_type: str) -> None:
        if self._rpc is not None:
            service, method = path.rsplit("/", 2)[-2:]
            self._rpc.started(service, method, rpc_type)

    def finished(self, call: FinishedCall) -> None:
        if self._rpc is not None:
            self._rpc.finished(call.service, call.method, call.rpc_type, call.code, call.reason, call.seconds)
        level = logging.INFO
        if call.code in DENIED:
            level = logging.WARNING
        elif call.code in FAULTS:
            level = logging.ERROR
        if not log.isEnabledFor(level):
            return
        workspace, task, run = request_scope(call.request)
        summary = f"{call.method} {call.code}" + (f" {call.reason}" if call.reason else "")
        log.log(
            level,
            summary,
            extra=fields(
                event="rpc",
                service=call.service,
                method=call.method,
                code=call.code,
                reason=call.reason,
                detail=call.detail,
                subject=call.subject,
                role=call.role,
                # Without a subject, the address is all there is to say who called.
                peer=call.peer if call.subject is None else None,
                workspace=workspace,
                task=task,
                run=run,
                duration_ms=round(call.seconds * 1000, 3),
            ),
        )


def request_scope(request: Any) -> tuple[str | None, str | None, str | None]:
    """(workspace, task, run) a request names, where it has those fields (a
    transcript import's first message names them in `target`)."""
    if request is None:
        return None, None, None
    if hasattr(request, "HasField") and not hasattr(request, "workspace_id"):
        try:
            if request.HasField("target"):
                request = request.target
        except ValueError:  # a message without a `target` field
            pass
    return (
        getattr(request, "workspace_id", None) or None,
        getattr(request, "task_id", None) or None,
        getattr(request, "run_id", None) or None,
    )
