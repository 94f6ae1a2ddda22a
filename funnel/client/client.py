"""`FunnelClient`: one object a Python host holds to talk to both services,
with a method per step of the story (register, claim, evidence, attempt,
complete, watch) that answers with the generated protobuf messages.

Every call carries the caller's bearer token and a deadline; every mutating
call carries a request id, made here unless the caller gives one, and the
same id goes out again on each retry (funnel.client.retry), so that a call
whose answer was lost is answered from the service's memory instead of being
applied twice. A failure is raised as FunnelError.

A server that acts for many callers (`funnel mcp`, with each HTTP caller's own
token) holds one client and calls through `client.as_caller(token)`: the same
channels, each call with that token."""

from __future__ import annotations

import asyncio
import copy
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from funnel.auth.client import bearer_interceptors
from funnel.client.credentials import Tls, TokenSource, local_tokens
from funnel.client.errors import FunnelError
from funnel.client.retry import RetryPolicy, watch_cut, with_retries
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

# `funnel up`'s ports.
DEFAULT_LIFECYCLE = "127.0.0.1:50051"
DEFAULT_COMPLETION = "127.0.0.1:50052"
DEFAULT_TIMEOUT = 10.0

# gRPC's reconnect backoff grows to two minutes by default: a channel that lost
# its service would fail every retry of RetryPolicy's few seconds at once
# without trying to connect again. Reconnecting within a second lets a retry
# reach a service that came back.
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]


BreakHook = Callable[[FunnelError, int], Awaitable[None]]
"""Awaited by a watch before it reopens a stream: the failure, and the sequence it resumes after."""


def new_request_id() -> str:
    """A fresh request id: random, so that two calls never share one by accident."""
    return f"py-{uuid.uuid4().hex}"


class FunnelClient:
    """Channels to the lifecycle and completion services for one caller.

    `tls` None means plaintext (services started with `--insecure`, loopback
    only). `token` is the bearer token, or a TokenSource called before every
    call; None sends none (services started with `--no-auth`). `timeout` is
    the deadline of each call, in seconds, per attempt; `retry` says which
    failures are retried and how often.

    Make it inside the event loop that uses it (gRPC binds channels to it), and
    close it (`await client.close()`, or `async with`): that ends its
    channels and every call still open on them, its callers' (`as_caller`) too."""

    def __init__(
        self,
        lifecycle: str,
        completion: str,
        *,
        tls: Tls | None,
        token: str | TokenSource | None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        tokens: TokenSource | None = (lambda: token) if isinstance(token, str) else token
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._channels = [_channel(address, tls, tokens) for address in (lifecycle, completion)]
        # Sent with every call; the channels' token interceptor leaves a call that
        # carries an authorization header as it is (as_caller).
        self._metadata: tuple[tuple[str, str], ...] | None = None
        # The generated stubs, for the RPCs without a method here (through `call`).
        # grpcio-tools leaves their constructors unannotated.
        self.lifecycle = lifecycle_grpc.TaskLifecycleServiceStub(self._channels[0])  # type: ignore[no-untyped-call]
        self.completion = completion_grpc.CompletionServiceStub(self._channels[1])  # type: ignore[no-untyped-call]
        self.transcripts = transcript_grpc.TranscriptServiceStub(self._channels[1])  # type: ignore[no-untyped-call]

    @classmethod
    def from_data_dir(
        cls,
        data_dir: str | Path = "funnel-data",
        *,
        token: str | TokenSource | None = None,
        subject: str | None = None,
        permissions: Sequence[str] = (),
        lifecycle: str | None = None,
        completion: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> FunnelClient:
        """A client of the services `funnel up` runs from `data_dir`: its local
        CA and client certificate, and either `token` or, with `subject` and
        `permissions` (e.g. `["acme:host"]`), tokens signed by its local key
        (funnel.client.credentials.local_tokens). The addresses not given are
        FUNNEL_LIFECYCLE and FUNNEL_COMPLETION, as for `funnel mcp` and `funnel
        ui`, else `funnel up`'s ports; `timeout` and `retry` as for the
        constructor. Raises ValueError when it is given neither a token nor a
        subject, OSError when the files are missing, and
        `funnel.auth.tokens.SigningKeyError` for an unusable signing key."""
        if token is None:
            if subject is None or not permissions:
                raise ValueError("pass a token, or a subject and permissions for a token of the local key")
            token = local_tokens(data_dir, subject, permissions)
        return cls(
            lifecycle or os.environ.get("FUNNEL_LIFECYCLE", DEFAULT_LIFECYCLE),
            completion or os.environ.get("FUNNEL_COMPLETION", DEFAULT_COMPLETION),
            tls=Tls.from_data_dir(data_dir),
            token=token,
            timeout=timeout,
            retry=retry,
        )

    def as_caller(self, token: str, *, retry: RetryPolicy | None = None) -> FunnelClient:
        """A client on this one's channels whose calls carry `token` (the bearer
        token, without `Bearer `) instead of this client's own token or token
        source, and follow `retry` when given (else this client's policy). It
        costs no connection, so a server can make one per call of its callers.
        Closing it closes nothing: the channels are this client's, and end with it."""
        caller = copy.copy(self)
        caller._metadata = (("authorization", f"Bearer {token}"),)
        caller._channels = []
        caller.retry = retry or self.retry
        return caller

    async def close(self) -> None:
        """Closes both channels; calls still open on them end as CANCELLED."""
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self) -> FunnelClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def call(self, method: Callable[..., Any], request: Any, timeout: float | None = None) -> Any:
        """Calls one unary RPC of a stub (e.g. `client.lifecycle.ListTasks`) with
        the client's deadline and retries, and returns its response. A request
        of a mutating RPC should carry its request id already (new_request_id):
        a retry sends this same request. Raises FunnelError."""
        deadline = self.timeout if timeout is None else timeout
        return await with_retries(lambda: method(request, timeout=deadline, metadata=self._metadata), self.retry)

    # -- the host's lifecycle calls -------------------------------------------

    async def register_task(
        self,
        workspace_id: str,
        task_id: str,
        *,
        cause: lifecycle_types.Cause | None = None,
        parent: lifecycle_types.ParentLink | None = None,
        request_id: str | None = None,
    ) -> lifecycle_messages.RegisterTaskResponse:
        """Registers `task_id` (generation 1, `REGISTERED`). Raises FunnelError,
        e.g. `TASK_ALREADY_EXISTS` for a task registered by another request."""
        request = lifecycle_messages.RegisterTaskRequest(
            workspace_id=workspace_id,
            task_id=task_id,
            cause=cause,
            parent=parent,
            request_id=request_id or new_request_id(),
        )
        response: lifecycle_messages.RegisterTaskResponse = await self.call(self.lifecycle.RegisterTask, request)
        return response

    async def get_task(self, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
        """The task as the lifecycle service has it (the truth about terminality).
        Raises FunnelError (`TASK_NOT_FOUND`, ...)."""
        request = lifecycle_messages.GetTaskRequest(workspace_id=workspace_id, task_id=task_id)
        response: lifecycle_messages.GetTaskResponse = await self.call(self.lifecycle.GetTask, request)
        return response

    async def list_lifecycle_events(self, workspace_id: str, task_id: str) -> list[lifecycle_types.LifecycleEvent]:
        """Every lifecycle event of the task, in commit order (all pages).
        Raises FunnelError."""
        events: list[lifecycle_types.LifecycleEvent] = []
        page_token = ""
        while True:
            request = lifecycle_messages.ListLifecycleEventsRequest(
                workspace_id=workspace_id, task_id=task_id, page_size=1000, page_token=page_token
            )
            page: lifecycle_messages.ListLifecycleEventsResponse = await self.call(
                self.lifecycle.ListLifecycleEvents, request
            )
            events += page.events
            page_token = page.next_page_token
            if not page_token:
                return events

    def watch_lifecycle_events(
        self,
        workspace_id: str,
        *,
        task_id: str = "",
        after_sequence: int = 0,
        retry: RetryPolicy | None = None,
        on_break: BreakHook | None = None,
    ) -> AsyncIterator[lifecycle_types.LifecycleEvent]:
        """The workspace's (or one task's) lifecycle events after `after_sequence`:
        the backlog, then live ones as they commit, without end. A stream broken
        by UNAVAILABLE (a stopping server, a lost connection), cancelled by the
        far side, or ended by WATCH_OVERFLOW (the reader fell behind), is opened
        again after the last event delivered, within `retry` (else the client's
        policy), so none is missed or repeated; `on_break(error, after)` is
        awaited before each such reopening, e.g. to tell a reader that events are
        late. Raises FunnelError when it cannot go on."""
        return self._watch(
            lambda after: self.lifecycle.WatchLifecycleEvents(
                lifecycle_messages.WatchLifecycleEventsRequest(
                    workspace_id=workspace_id, task_id=task_id, after_sequence=after
                ),
                metadata=self._metadata,
            ),
            after_sequence,
            retry or self.retry,
            on_break,
        )

    # -- the agent's and host's completion calls ------------------------------

    async def claim_task(
        self,
        workspace_id: str,
        task_id: str,
        agent_id: str,
        *,
        lease_ttl: float = 60.0,
        request_id: str | None = None,
    ) -> completion_messages.ClaimTaskResponse:
        """Opens a run of `agent_id` holding the task's lease for `lease_ttl`
        seconds; the lifecycle service then shows the task ACTIVE, IN_PROGRESS.
        Keep `run.run_id`, `run.generation` and `lease.epoch` for the later calls.
        Raises FunnelError (`LEASE_HELD` while another run holds it, ...)."""
        request = completion_messages.ClaimTaskRequest(
            workspace_id=workspace_id,
            task_id=task_id,
            agent_id=agent_id,
            lease_ttl=_duration(lease_ttl),
            request_id=request_id or new_request_id(),
        )
        response: completion_messages.ClaimTaskResponse = await self.call(self.completion.ClaimTask, request)
        return response

    async def get_run(self, workspace_id: str, run_id: str) -> completion_messages.GetRunResponse:
        """The run as the completion service has it: its task, generation, lease
        epoch and expiry, and whether it is closed. Raises FunnelError
        (`RUN_NOT_FOUND`, ...)."""
        request = completion_messages.GetRunRequest(workspace_id=workspace_id, run_id=run_id)
        response: completion_messages.GetRunResponse = await self.call(self.completion.GetRun, request)
        return response

    async def renew_lease(
        self, workspace_id: str, run_id: str, epoch: int, *, lease_ttl: float = 60.0, request_id: str | None = None
    ) -> completion_messages.RenewLeaseResponse:
        """Moves the lease's expiry to now + `lease_ttl` seconds. Raises FunnelError
        (`LEASE_NOT_CURRENT` once another claim fenced this one, ...)."""
        request = completion_messages.RenewLeaseRequest(
            workspace_id=workspace_id,
            run_id=run_id,
            epoch=epoch,
            lease_ttl=_duration(lease_ttl),
            request_id=request_id or new_request_id(),
        )
        response: completion_messages.RenewLeaseResponse = await self.call(self.completion.RenewLease, request)
        return response

    async def record_evidence(
        self,
        workspace_id: str,
        task_id: str,
        generation: int,
        kind: str,
        verdict: completion_enums.EvidenceVerdict,
        *,
        checkpoint: str = "",
        details: str = "",
        run_id: str = "",
        request_id: str | None = None,
    ) -> completion_messages.RecordEvidenceResponse:
        """Stores one fact (e.g. kind `tests`, `EVIDENCE_VERDICT_PASSED`) about the
        task generation at `checkpoint`, for the evidence gate. Raises FunnelError."""
        request = completion_messages.RecordEvidenceRequest(
            workspace_id=workspace_id,
            task_id=task_id,
            generation=generation,
            kind=kind,
            verdict=verdict,
            checkpoint=checkpoint,
            details=details,
            run_id=run_id,
            request_id=request_id or new_request_id(),
        )
        response: completion_messages.RecordEvidenceResponse = await self.call(self.completion.RecordEvidence, request)
        return response

    async def attempt_completion(
        self,
        workspace_id: str,
        task_id: str,
        run_id: str,
        epoch: int,
        *,
        result: str,
        outcome: completion_enums.RequestedOutcome = completion_enums.REQUESTED_OUTCOME_COMPLETED,
        state_version: int | None = None,
        request_id: str | None = None,
    ) -> completion_messages.AttemptCompletionResponse:
        """Asks the gates to judge the run's completion. A block is an answer,
        not an error: read `decision.verdict` and `decision.next_action`. An
        `ALLOW` commits the completion and settles it with the lifecycle
        service (`completion.settlement`). Raises FunnelError for a refused call."""
        request = completion_messages.AttemptCompletionRequest(
            workspace_id=workspace_id,
            task_id=task_id,
            run_id=run_id,
            epoch=epoch,
            outcome=outcome,
            result=result,
            state_version=state_version,
            request_id=request_id or new_request_id(),
        )
        response: completion_messages.AttemptCompletionResponse = await self.call(
            self.completion.AttemptCompletion, request
        )
        return response

    async def complete_run(
        self,
        workspace_id: str,
        run_id: str,
        outcome: completion_enums.RunOutcome,
        *,
        notes: str = "",
        error: str = "",
        tokens_input: int | None = None,
        tokens_output: int | None = None,
        tokens_total: int | None = None,
        final_status: completion_enums.FinalStatus = completion_enums.FINAL_STATUS_UNSPECIFIED,
        request_id: str | None = None,
    ) -> completion_messages.CompleteRunResponse:
        """Closes the run (seed 001's `complete_task`) and applies its final
        status through the lifecycle service; `task_effect` says what that did
        to the task. Raises FunnelError (`RUN_ALREADY_FINISHED`, ...)."""
        request = completion_messages.CompleteRunRequest(
            workspace_id=workspace_id,
            run_id=run_id,
            outcome=outcome,
            notes=notes,
            error=error,
            tokens_input=tokens_input,
            tokens_output=tokens_output,
            tokens_total=tokens_total,
            final_status=final_status,
            request_id=request_id or new_request_id(),
        )
        response: completion_messages.CompleteRunResponse = await self.call(self.completion.CompleteRun, request)
        return response

    def watch_completion_events(
        self,
        workspace_id: str,
        *,
        task_id: str = "",
        after_sequence: int = 0,
        retry: RetryPolicy | None = None,
        on_break: BreakHook | None = None,
    ) -> AsyncIterator[completion_types.CompletionEvent]:
        """The workspace's (or one task's) completion events (decisions,
        settlements, closed runs) after `after_sequence`, backlog then live, resumed
        like watch_lifecycle_events. Raises FunnelError when it cannot go on."""
        return self._watch(
            lambda after: self.completion.WatchCompletionEvents(
                completion_messages.WatchCompletionEventsRequest(
                    workspace_id=workspace_id, task_id=task_id, after_sequence=after
                ),
                metadata=self._metadata,
            ),
            after_sequence,
            retry or self.retry,
            on_break,
        )

    async def _watch(
        self, open_stream: Callable[[int], Any], after: int, policy: RetryPolicy, on_break: BreakHook | None
    ) -> AsyncIterator[Any]:
        clock = asyncio.get_running_loop().time
        started = clock()
        retry = 0
        while True:
            stream = open_stream(after)
            try:
                async for message in stream:
                    # The policy bounds retries in a row, not over the stream's life.
                    retry, started = 0, clock()
                    after = message.event.sequence
                    yield message.event
                return  # the server ended the stream without an error
            except grpc.aio.AioRpcError as failed:
                error = FunnelError.from_rpc_error(failed)
                retry += 1
                elapsed = clock() - started
                wait = policy.backoff(retry, elapsed) if watch_cut(error) else policy.delay(error, retry, elapsed)
                if wait is None:
                    raise error from failed
            finally:
                stream.cancel()  # a no-op on a call that ended; ends it when the caller stopped reading
            if on_break is not None:
                await on_break(error, after)
            await asyncio.sleep(wait)


def _channel(address: str, tls: Tls | None, tokens: TokenSource | None) -> grpc.aio.Channel:
    interceptors = bearer_interceptors(tokens) if tokens is not None else []
    if tls is None:
        return grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    options: list[tuple[str, str | int]] = [*_CHANNEL_OPTIONS]
    if tls.server_name is not None:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


def _duration(seconds: float) -> Duration:
    duration = Duration()
    duration.FromMicroseconds(round(seconds * 1_000_000))
    return duration
