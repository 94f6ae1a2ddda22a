"""The dashboard's side of gRPC, through one funnel.client: reads for a page,
watches that resume from their cursor, and the three actions through the
services' normal intents.

Two credentials, one set of channels: every read and watch goes out with the
viewer token (the client's own); only the actions use the action (host or
operator) token (`as_caller`), and without one they do not exist."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from funnel.client import BreakHook, FunnelClient, FunnelError, RetryPolicy, Tls, TokenSource
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.paging import every_page
from funnel_ui import grants, view
from funnel_ui.together import together

CALL_TIMEOUT = 10.0
# A call is not retried: a page shows the failure at once, and a live page's
# stream reads again itself (funnel_ui.streams.RETRY_SECONDS). The request ids of
# the actions make a resend of the same form safe.
CALLS = RetryPolicy(attempts=1)
# A watch resumes for as long as its page is open (the window never closes), every
# half second at most: a restarting service is back within a second or two, and
# polling faster only adds failed connection attempts to its log.
RESUME_DELAY = 0.5
WATCHES = RetryPolicy(attempts=None, window=math.inf, initial_backoff=RESUME_DELAY, max_backoff=RESUME_DELAY)
TRANSCRIPT_LIMIT = 1000
# Each list of the attention page shows at most this many entries (one page of each listing).
ATTENTION_PAGE = 1000
# Of the rejected completions (listed oldest first, from an index of each
# settlement status), the first this many pages are read, and of those the tasks
# of at most ATTENTION_CHECKS (the latest rejected) are asked about.
ATTENTION_REJECTED_PAGES = 10
ATTENTION_CHECKS = 200


@dataclass(frozen=True)
class Settings:
    lifecycle_address: str
    completion_address: str
    tls: Tls | None  # None: plaintext
    viewer_token: TokenSource
    action_token: TokenSource | None = None


class ActionRefused(Exception):
    """No action credential is configured: the dashboard only reads."""


@dataclass
class TaskData:
    task: lifecycle_messages.GetTaskResponse
    events: list[lifecycle_types.LifecycleEvent]
    completion_events: list[completion_types.CompletionEvent]
    completions: list[completion_types.Completion]
    runs: list[completion_types.Run]
    evidence: list[completion_types.Evidence]
    transcript: list[completion_types.SessionEvent]
    transcript_more: bool
    advice: transcript_messages.ResolveResumeResponse | None

    @property
    def cursor(self) -> view.Cursor:
        """The task's watches resume exactly after what the page was rendered from."""
        return view.Cursor(
            self.events[-1].sequence if self.events else 0,
            self.completion_events[-1].sequence if self.completion_events else 0,
        )


@dataclass
class Heads:
    """The latest event sequences seen in a workspace: where a list page's event
    stream starts (the services have no "current sequence" call, and a cursor
    at or below the truth only replays events the page ignores by revision)."""

    lifecycle: int = 0
    completion: int = 0


class Backend:
    """Entered (`async with`) for the dashboard's lifetime: its client of the
    services, and the one TaskGroup that owns its background watches (the
    workspaces' heads). Made inside the event loop (gRPC binds channels to it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = FunnelClient(
            settings.lifecycle_address,
            settings.completion_address,
            tls=settings.tls,
            token=settings.viewer_token,
            timeout=CALL_TIMEOUT,
            retry=CALLS,
        )
        self._heads: dict[str, Heads] = {}
        self._owner = asyncio.TaskGroup()
        self._followers: list[asyncio.Task[None]] = []

    @property
    def can_act(self) -> bool:
        return self.settings.action_token is not None

    def permitted(self, workspace: str) -> frozenset[str]:
        """The actions to offer in `workspace`: those its action token grants there
        (none without one, or while its file cannot be read)."""
        if self.settings.action_token is None:
            return grants.NONE
        try:
            return grants.permitted(self.settings.action_token(), workspace)
        except OSError:
            return grants.NONE

    async def __aenter__(self) -> Backend:
        await self._owner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._followers:
            task.cancel()
        try:
            await self._owner.__aexit__(None, None, None)
        finally:
            await self.client.close()

    # -- the task list ---------------------------------------------------

    async def list_page(
        self, workspace: str, filter_: view.Filter, token: str, size: int
    ) -> tuple[list[view.Lifecycle], str]:
        """One page of the list and the token of the next ("" on the last): one
        ListTasks call, filtered and ordered by the service."""
        listed = await self.client.call(self.client.lifecycle.ListTasks, filter_.list_request(workspace, size, token))
        return [view.lifecycle_from_task(task) for task in listed.tasks], listed.next_page_token

    async def attention(
        self, workspace: str, long_run_seconds: float
    ) -> tuple[view.Attention, list[completion_types.Run]]:
        """The attention page's facts (each list its first ATTENTION_PAGE entries) and
        the open runs read for it (whose leases say when it changes next)."""
        pending, rejected, open_runs = await together(
            self._completions_by(workspace, "SETTLEMENT_STATUS_PENDING"),
            self._completions_by(workspace, "SETTLEMENT_STATUS_REJECTED", ATTENTION_REJECTED_PAGES),
            self.client.call(
                self.client.completion.ListRuns,
                completion_messages.ListRunsRequest(workspace_id=workspace, open_only=True, page_size=ATTENTION_PAGE),
            ),
        )
        expired, long_open = view.open_runs_needing_attention(open_runs.runs, time.time(), long_run_seconds)
        # Rejections stay on record after their task moved on: each task's latest is
        # asked about, for the tasks rejected last.
        recent = view.latest_rejections(rejected, pending, ATTENTION_CHECKS)
        standing, unknown = [], ""
        try:
            tasks = {t.task_id: t for t in await self.tasks(workspace, sorted({c.task_id for c in recent}))}
            standing = [c for c in recent if view.still_rejected(c, tasks.get(c.task_id))]
        except FunnelError as error:
            unknown = f"the lifecycle service did not answer ({error.code.name}): which still stand is unknown"
        return view.Attention(tuple(pending), expired, long_open, tuple(standing), unknown), list(open_runs.runs)

    async def _completions_by(
        self, workspace: str, settlement: str, pages: int = 1
    ) -> list[completion_types.Completion]:
        """Oldest commit first: the first `pages` pages of that settlement's listing (from its index)."""
        found: list[completion_types.Completion] = []
        token = ""
        for _ in range(pages):
            listed = await self.client.call(
                self.client.completion.ListCompletions,
                completion_messages.ListCompletionsRequest(
                    workspace_id=workspace, settlement=settlement, page_size=ATTENTION_PAGE, page_token=token
                ),
            )
            found += listed.completions
            token = listed.next_page_token
            if not token:
                break
        return found

    async def counts(self, workspace: str) -> lifecycle_messages.CountTasksResponse:
        counted: lifecycle_messages.CountTasksResponse = await self.client.call(
            self.client.lifecycle.CountTasks, lifecycle_messages.CountTasksRequest(workspace_id=workspace)
        )
        return counted

    async def settlements(
        self, workspace: str, tasks: Sequence[view.Lifecycle]
    ) -> dict[str, dict[str, view.Settlement]]:
        """Completion facts for the tasks that can have an unsettled completion: a
        completion is only committed under a lease, so only for an ACTIVE or
        SUSPENDED generation; a terminal badge never needs them."""
        open_tasks = [task.task_id for task in tasks if task.state in ("ACTIVE", "SUSPENDED")]
        found = await together(*(self.completions(workspace, task_id) for task_id in open_tasks))
        return {
            task_id: {c.completion_id: view.settlement_from_completion(c) for c in completions}
            for task_id, completions in zip(open_tasks, found, strict=True)
        }

    async def tasks(self, workspace: str, task_ids: Sequence[str]) -> list[view.Lifecycle]:
        async def one(task_id: str) -> view.Lifecycle | None:
            try:
                got = await self.client.get_task(workspace, task_id)
            except FunnelError as error:
                if error.code == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
            return view.lifecycle_from_task(got.task)

        return [task for task in await together(*(one(t) for t in task_ids)) if task is not None]

    def heads(self, workspace: str) -> Heads:
        """Follows the workspace's two event streams in the background (from the
        first call on) only to know their latest sequences."""
        heads = self._heads.get(workspace)
        if heads is None:
            heads = self._heads[workspace] = Heads()

            # A watch that cannot go on (the viewer token refused) leaves its head where
            # it is: a cursor below the truth only replays what a page ignores.
            async def follow_lifecycle() -> None:
                with contextlib.suppress(FunnelError):
                    async for event in self.watch_lifecycle(workspace, "", 0):
                        heads.lifecycle = event.sequence

            async def follow_completion() -> None:
                with contextlib.suppress(FunnelError):
                    async for event in self.watch_completion(workspace, "", 0):
                        heads.completion = event.sequence

            self._followers += [
                self._owner.create_task(follow_lifecycle(), name=f"heads-lifecycle-{workspace}"),
                self._owner.create_task(follow_completion(), name=f"heads-completion-{workspace}"),
            ]
        return heads

    # -- one task --------------------------------------------------------

    async def task_data(self, workspace: str, task_id: str) -> TaskData:
        task = await self.client.get_task(workspace, task_id)
        (events, completion_events, completions), (runs, evidence), ((transcript, more), advice) = await together(
            together(
                self._lifecycle_events(workspace, task_id),
                self._completion_events(workspace, task_id),
                self.completions(workspace, task_id),
            ),
            together(self.runs(workspace, task_id), self.evidence(workspace, task_id)),
            together(self._transcript(workspace, task_id), self.advice(workspace, view.lifecycle_from_task(task.task))),
        )
        return TaskData(task, events, completion_events, completions, runs, evidence, transcript, more, advice)

    async def _lifecycle_events(self, workspace: str, task_id: str) -> list[lifecycle_types.LifecycleEvent]:
        return await self.client.list_lifecycle_events(workspace, task_id)

    async def _completion_events(self, workspace: str, task_id: str) -> list[completion_types.CompletionEvent]:
        events: list[completion_types.CompletionEvent] = []
        while True:
            page = await self.client.call(
                self.client.completion.ListCompletionEvents,
                completion_messages.ListCompletionEventsRequest(
                    workspace_id=workspace,
                    task_id=task_id,
                    page_size=1000,
                    after_sequence=events[-1].sequence if events else 0,
                ),
            )
            events += page.events
            if not page.has_more:
                return events

    async def completions(self, workspace: str, task_id: str) -> list[completion_types.Completion]:
        return await every_page(
            lambda token: self.client.call(
                self.client.completion.ListCompletions,
                completion_messages.ListCompletionsRequest(
                    workspace_id=workspace, task_id=task_id, page_size=1000, page_token=token
                ),
            ),
            "completions",
        )

    async def runs(self, workspace: str, task_id: str) -> list[completion_types.Run]:
        return await every_page(
            lambda token: self.client.call(
                self.client.completion.ListRuns,
                completion_messages.ListRunsRequest(
                    workspace_id=workspace, task_id=task_id, page_size=1000, page_token=token
                ),
            ),
            "runs",
        )

    async def evidence(self, workspace: str, task_id: str) -> list[completion_types.Evidence]:
        return await every_page(
            lambda token: self.client.call(
                self.client.completion.ListEvidence,
                completion_messages.ListEvidenceRequest(
                    workspace_id=workspace, task_id=task_id, page_size=1000, page_token=token
                ),
            ),
            "evidence",
        )

    async def _transcript(self, workspace: str, task_id: str) -> tuple[list[completion_types.SessionEvent], bool]:
        # The first page repairs an interrupted final turn durably: the page then
        # shows the synthetic closers the service wrote, marked as such.
        page = await self.client.call(
            self.client.transcripts.LoadTranscript,
            transcript_messages.LoadTranscriptRequest(
                workspace_id=workspace, task_id=task_id, page_size=TRANSCRIPT_LIMIT
            ),
        )
        return list(page.events), bool(page.next_page_token)

    async def advice(
        self, workspace: str, lifecycle: view.Lifecycle
    ) -> transcript_messages.ResolveResumeResponse | None:
        """What to offer on a terminal task (ResolveResume), asked only when
        something could be offered: a terminal generation, and an action token
        that grants resuming or a new chat in the workspace."""
        if not self.permitted(workspace) & view.TERMINAL_ACTIONS or lifecycle.state != view.TERMINAL:
            return None
        advice: transcript_messages.ResolveResumeResponse = await self.client.call(
            self.client.transcripts.ResolveResume,
            transcript_messages.ResolveResumeRequest(workspace_id=workspace, task_id=lifecycle.task_id),
        )
        return advice

    # -- watches ---------------------------------------------------------

    def watch_lifecycle(
        self, workspace: str, task_id: str, after: int, on_break: BreakHook | None = None
    ) -> AsyncIterator[lifecycle_types.LifecycleEvent]:
        """Every lifecycle event after `after`, resumed from its cursor while the
        service is away (WATCHES); `on_break` is told before each resumption.
        Raises FunnelError once it cannot go on (the viewer token refused)."""
        return self.client.watch_lifecycle_events(
            workspace, task_id=task_id, after_sequence=after, retry=WATCHES, on_break=on_break
        )

    def watch_completion(
        self, workspace: str, task_id: str, after: int, on_break: BreakHook | None = None
    ) -> AsyncIterator[completion_types.CompletionEvent]:
        """As watch_lifecycle, of the completion service's events."""
        return self.client.watch_completion_events(
            workspace, task_id=task_id, after_sequence=after, retry=WATCHES, on_break=on_break
        )

    # -- actions ---------------------------------------------------------

    def _actor(self) -> FunnelClient:
        """The client's channels with the action token, read now (a rotated file
        takes effect at the next click)."""
        if self.settings.action_token is None:
            raise ActionRefused("this dashboard has no action credential")
        return self.client.as_caller(self.settings.action_token())

    async def resume(self, workspace: str, task_id: str, generation: int, revision: int, request_id: str) -> int:
        """ResumeWithGeneration into `generation` + 1, guarded by the revision the
        page showed: a click on a stale page cannot act on a state nobody saw."""
        actor = self._actor()
        resumed: lifecycle_messages.ResumeWithGenerationResponse = await actor.call(
            actor.lifecycle.ResumeWithGeneration,
            lifecycle_messages.ResumeWithGenerationRequest(
                workspace_id=workspace,
                task_id=task_id,
                generation=generation + 1,
                expected_revision=revision,
                request_id=request_id,
                cause=_cause("Resume task"),
            ),
        )
        return resumed.task.generation

    async def new_chat(self, workspace: str, task_id: str, request_id: str) -> str:
        """ "New chat" registers a new task that names the one it continues from. Its id
        comes from the form's request id, so a form sent twice replays one registration
        (a fresh id each time would make the second send REQUEST_ID_REUSED)."""
        new_id = f"{task_id[:100]}-chat-{hashlib.sha256(request_id.encode()).hexdigest()[:8]}"
        await self._actor().register_task(
            workspace,
            new_id,
            request_id=request_id,
            cause=lifecycle_types.Cause(source="funnel-ui", reason="New chat", originating_ids={"task_id": task_id}),
        )
        return new_id

    async def cancel(self, workspace: str, task_id: str, generation: int, revision: int, request_id: str) -> None:
        actor = self._actor()
        await actor.call(
            actor.lifecycle.RequestCancellation,
            lifecycle_messages.RequestCancellationRequest(
                workspace_id=workspace,
                task_id=task_id,
                generation=generation,
                expected_revision=revision,
                request_id=request_id,
                cause=_cause("Request cancellation"),
            ),
        )


def _cause(reason: str) -> lifecycle_types.Cause:
    return lifecycle_types.Cause(source="funnel-ui", reason=reason)
