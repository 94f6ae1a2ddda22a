"""What happens when the server boundary (funnel.runtime.boundary) reports that
an RPC started and how it finished: the per-RPC metrics (funnel.runtime.metrics)
and one structured log line per request, denied calls included (with who was
denied and why)."""

from __future__ import annotations

import logging
from typing import Any

from funnel.runtime import logs
from funnel.runtime.metrics import MethodMetrics, RpcMetrics

log = logging.getLogger("funnel.request")

# Codes that say the caller was turned away at the door.
DENIED = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED"})
# Codes that say the service failed, not the caller.
FAULTS = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE"})


class CallObserver:
    def __init__(self, rpc: RpcMetrics | None) -> None:
        self._rpc = rpc

    def method(self, path: str, rpc_type: str) -> ObservedMethod:
        """What observes the calls of one method (`/package.Service/Method`), made
        once when the method is registered."""
        service, method = path.rsplit("/", 2)[-2:]
        return ObservedMethod(service, method, self._rpc.method(service, method, rpc_type) if self._rpc else None)


class ObservedMethod:
    """The per-RPC metrics and the request's log line of one method."""

    def __init__(self, service: str, method: str, rpc: MethodMetrics | None) -> None:
        self.method = method
        self._rpc = rpc
        self._lines = logs.PreparedLines(log, event="rpc", service=service, method=method)

    def started(self) -> None:
        if self._rpc is not None:
            self._rpc.start()

    def finished(
        self,
        code: str,
        reason: str,
        detail: str,
        seconds: float,
        subject: str | None,
        role: str | None,
        peer: str,
        request: Any,
    ) -> None:
        """`code`: the status code's name (OK, PERMISSION_DENIED, …) and `reason` the
        ErrorInfo reason ("" for OK); `detail` the status message the caller got;
        `subject` and `role` who called (None when authentication failed or the call
        was denied before a role was chosen); `request` the request (a client
        stream's first message) if it was decoded."""
        if self._rpc is not None:
            self._rpc.finish(code, reason, seconds)
        level = logging.INFO
        if code in DENIED:
            level = logging.WARNING
        elif code in FAULTS:
            level = logging.ERROR
        if not log.isEnabledFor(level):
            return
        workspace, task, run = request_scope(request)
        self._lines.log(
            level,
            f"{self.method} {code} {reason}" if reason else f"{self.method} {code}",
            code=code,
            reason=reason,
            detail=detail,
            subject=subject,
            role=role,
            # Without a subject, the address is all there is to say who called.
            peer=peer if subject is None else None,
            workspace=workspace,
            task=task,
            run=run,
            duration_ms=round(seconds * 1000, 3),
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
