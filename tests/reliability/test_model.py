"""Model-based test (issue 5, item 5): a hypothesis state machine drives both real
services over gRPC (started once per run, SQLite files, one manual clock) with
random intents — registrations of top-level, attached and detached tasks, claims
with lease lifetimes while the clock moves, transcript appends (valid and not),
loads that repair, evidence, completion attempts (COMPLETED and FAILED), lifecycle
intents (cancellation requested and settled, failure, timeout, suspension,
activation, resumption, work status, parent termination), CompleteRun closes and
resumes by user feedback after a completion — against a small reference model.

The model predicts every answer it can (the code and reason of a rejection, the
verdict and decisive gate of an attempt, whether a close settles) and the service
must agree; it then checks after every step:

  * one terminal outcome per generation, never changed once set;
  * revisions gapless and increasing: ListLifecycleEvents yields revisions
    1..task.revision with strictly increasing sequences;
  * events equal committed transitions: every accepted intent (direct, made by the
    completion service, or propagated to children) adds exactly one event and a
    rejected one none, so the task's revision is the model's count;
  * a SETTLED completion implies the lifecycle event that made its generation
    terminal (COMPLETED with its completion id, or FAILED) at the recorded revision
    and sequence; a REJECTED completion has no COMPLETION_SETTLED event; completion
    events equal the model's count;
  * runs, leases and transcript tails are what the model says;
  * no call ever ends with UNKNOWN or INTERNAL.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from completion_service.server import CompletionConfig
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import ManualClock
from funnel.runtime.grpc_errors import error_info
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.e2e_support import CLOCK_START_MICROS, Funnel

WS = "ws-m"
TASKS = [f"m{i}" for i in range(6)]
CALL_TIMEOUT = 15.0
SECOND = 1_000_000
BREAKER_THRESHOLD = 3
POLICY = {"workspaces": {WS: {"required_evidence": ["tests"], "breaker_threshold": BREAKER_THRESHOLD}}}

REGISTERED, ACTIVE, SUSPENDED, TERMINAL = "REGISTERED", "ACTIVE", "SUSPENDED", "TERMINAL"
COMPLETED, CANCELLED, FAILED, TIMED_OUT = "COMPLETED", "CANCELLED", "FAILED", "TIMED_OUT"
# Intents, named as the lifecycle service names them.
ACTIVATE, SUSPEND, RESUME, REQUEST_CANCEL, SETTLE_CANCEL = (
    "ACTIVATE_GENERATION",
    "SUSPEND_GENERATION",
    "RESUME_WITH_GENERATION",
    "REQUEST_CANCELLATION",
    "SETTLE_CANCELLATION",
)
SETTLE_COMPLETION, SETTLE_FAILURE, SETTLE_TIMEOUT, PROPAGATE, SET_STATUS = (
    "SETTLE_COMPLETION",
    "SETTLE_FAILURE",
    "SETTLE_TIMEOUT",
    "PROPAGATE_PARENT_TERMINATION",
    "SET_WORK_STATUS",
)
SETTLEMENT_OUTCOME = {
    SETTLE_CANCEL: (CANCELLED, "CANCELLED"),
    SETTLE_COMPLETION: (COMPLETED, "DONE"),
    SETTLE_FAILURE: (FAILED, "BLOCKED"),
    SETTLE_TIMEOUT: (TIMED_OUT, "BLOCKED"),
    PROPAGATE: (CANCELLED, "CANCELLED"),
}
OK = "OK"
# What the runs exercised, (call, answer) -> count; printed at the end.
STATS: collections.Counter = collections.Counter()
EXAMPLES = int(os.environ.get("FUNNEL_MODEL_EXAMPLES", "20"))
STEPS = int(os.environ.get("FUNNEL_MODEL_STEPS", "30"))


# -- the reference model -------------------------------------------------------------------------


@dataclasses.dataclass
class MTail:
    open_turn: str | None = None
    open_step: str | None = None
    open_calls: tuple = ()
    checkpoint: str = ""
    last_sequence: int = 0


@dataclasses.dataclass
class MCompletion:
    completion_id: str
    generation: int
    outcome: str  # COMPLETED | FAILED
    identity: tuple
    checkpoint: str
    settlement: str  # SETTLED | REJECTED
    error_reason: str = ""  # the lifecycle's refusal of a REJECTED one


@dataclasses.dataclass
class MTask:
    task_id: str
    parent: tuple | None  # (parent task, parent generation, "ATTACHED" | "DETACHED")
    generation: int = 1
    revision: int = 1
    state: str = REGISTERED
    outcome: str | None = None
    fenced: bool = False
    work_status: str = "READY"
    completion_id: str | None = None
    outcomes: dict = dataclasses.field(default_factory=dict)  # generation -> terminal outcome, forever
    # transcript
    tail: MTail = dataclasses.field(default_factory=MTail)
    state_version: int = 0
    checkpoints: dict = dataclasses.field(default_factory=dict)  # id -> sequence that first created it
    # lease and completion
    lease: tuple | None = None  # (run id, epoch, expires at)
    epoch: int = 0
    completions: dict = dataclasses.field(default_factory=dict)  # generation -> MCompletion
    blocked: list = dataclasses.field(default_factory=list)  # (generation, checkpoint, result) of blocked attempts
    evidence: list = dataclasses.field(default_factory=list)  # (generation, kind, passed, checkpoint)

    @property
    def terminal(self) -> bool:
        return self.state == TERMINAL

    @property
    def attached(self) -> tuple | None:
        return self.parent if self.parent and self.parent[2] == "ATTACHED" else None


@dataclasses.dataclass
class MRun:
    run_id: str
    task_id: str
    generation: int
    epoch: int
    open: bool = True


class Model:
    def __init__(self) -> None:
        self.tasks: dict[str, MTask] = {}
        self.runs: dict[str, MRun] = {}
        # Evidence is recorded without checking the task (RecordEvidence's contract):
        # what names a task not registered yet counts once the task is.
        self.early_evidence: dict[str, list] = {}
        self.completion_events = 0
        self.now = CLOCK_START_MICROS

    # lifecycle rules, written from the contract

    def children(self, t: MTask) -> list[MTask]:
        """Attached children of t's current generation that are not terminal."""
        return sorted(
            (
                c
                for c in self.tasks.values()
                if c.attached and c.attached[0] == t.task_id and c.attached[1] == t.generation and not c.terminal
            ),
            key=lambda c: c.task_id,
        )

    def parent_admits_work(self, generation: int, parent: MTask | None) -> str | None:
        if parent is None:
            return "PARENT_NOT_FOUND"
        if generation != parent.generation:
            return "PARENT_GENERATION_MISMATCH"
        if parent.terminal:
            return "PARENT_TERMINAL"
        if parent.fenced:
            return "PARENT_CANCELLATION_FENCED"
        if parent.state != ACTIVE:
            return "PARENT_NOT_ACTIVE"
        return None

    def attached_parent_problem(self, t: MTask) -> str | None:
        link = t.attached
        return None if link is None else self.parent_admits_work(link[1], self.tasks.get(link[0]))

    def judge(self, intent: str, task_id: str, generation: int, completion_id: str | None = None) -> str:
        """OK, ALREADY (a repeated settlement: OK without an event) or the rejection reason."""
        t = self.tasks.get(task_id)
        if t is None:
            return "TASK_NOT_FOUND"
        if intent == RESUME and t.terminal and generation == t.generation + 1:
            return ("ACTIVE_ATTACHED_CHILD" if self.children(t) else None) or self.attached_parent_problem(t) or OK
        if generation < t.generation:
            return "STALE_GENERATION"
        if generation > t.generation:
            return "FUTURE_GENERATION"
        if t.terminal:
            repeat = SETTLEMENT_OUTCOME.get(intent)
            if repeat and repeat[0] == t.outcome and (intent != SETTLE_COMPLETION or completion_id == t.completion_id):
                return "ALREADY"
            return "GENERATION_TERMINAL"
        link = t.attached
        parent = self.tasks.get(link[0]) if link else None
        if intent == ACTIVATE:
            return (
                ("CANCELLATION_FENCED" if t.fenced else None)
                or ("INVALID_TRANSITION" if t.state != REGISTERED else None)
                or self.attached_parent_problem(t)
                or OK
            )
        if intent == SUSPEND:
            return (
                ("CANCELLATION_FENCED" if t.fenced else None)
                or ("INVALID_TRANSITION" if t.state != ACTIVE else None)
                or OK
            )
        if intent == RESUME:
            return (
                ("CANCELLATION_FENCED" if t.fenced else None)
                or ("INVALID_TRANSITION" if t.state != SUSPENDED else None)
                or self.attached_parent_problem(t)
                or OK
            )
        if intent == REQUEST_CANCEL:
            return "CANCELLATION_ALREADY_REQUESTED" if t.fenced else OK
        if intent == SETTLE_CANCEL:
            return OK if t.fenced else "CANCELLATION_NOT_REQUESTED"
        if intent in (SETTLE_FAILURE, SETTLE_TIMEOUT):
            if t.fenced:
                return "CANCELLATION_FENCED"
            if link and parent and parent.generation == link[1]:
                if parent.fenced:
                    return "CANCELLATION_FENCED"
                if parent.terminal:
                    return "PARENT_TERMINAL"
            return OK
        if intent == SETTLE_COMPLETION:
            if t.fenced:  # the completion's commit time never predates the fence here
                return "CANCELLATION_FENCED"
            if link:
                if parent is None:
                    return "PARENT_NOT_FOUND"
                if parent.generation != link[1]:
                    return "PARENT_GENERATION_MISMATCH"
                if parent.terminal:
                    return "PARENT_TERMINAL"
                if parent.fenced:
                    return "CANCELLATION_FENCED"
            return "ACTIVE_ATTACHED_CHILD" if self.children(t) else OK
        if intent == PROPAGATE:
            if link is None:
                return "NOT_ATTACHED_CHILD"
            if parent is None:
                return "PARENT_NOT_FOUND"
            if parent.generation == link[1] and not parent.terminal:
                return "PARENT_NOT_TERMINAL"
            return OK
        if intent == SET_STATUS:
            return "CANCELLATION_FENCED" if t.fenced else OK
        raise AssertionError(intent)

    def apply(
        self,
        intent: str,
        task_id: str,
        generation: int,
        *,
        work_status: str | None = None,
        completion_id: str | None = None,
    ) -> str:
        """Judges and, when accepted, applies one intent with its propagations (delivered
        in commit order, as the service's propagation worker does)."""
        verdict = self.judge(intent, task_id, generation, completion_id)
        if verdict != OK:
            return verdict
        queue = [self._transition(intent, task_id, work_status, completion_id)]
        while queue:
            for child, child_generation, child_intent in queue.pop(0):
                if self.judge(child_intent, child, child_generation) == OK:
                    queue.append(self._transition(child_intent, child, None, None))
        return OK

    def _transition(self, intent: str, task_id: str, work_status: str | None, completion_id: str | None) -> list:
        t = self.tasks[task_id]
        propagate = {
            REQUEST_CANCEL: REQUEST_CANCEL,
            SETTLE_CANCEL: SETTLE_CANCEL,
            SETTLE_FAILURE: PROPAGATE,
            SETTLE_TIMEOUT: PROPAGATE,
            PROPAGATE: PROPAGATE,
        }.get(intent)
        owed = [(c.task_id, c.generation, propagate) for c in self.children(t)] if propagate else []
        t.revision += 1
        if intent == RESUME and t.terminal:
            t.generation += 1
            t.state, t.outcome, t.fenced, t.work_status, t.completion_id = ACTIVE, None, False, "READY", None
        elif intent == ACTIVATE:
            t.state = ACTIVE
            t.work_status = work_status or t.work_status
        elif intent == SUSPEND:
            t.state = SUSPENDED
        elif intent == RESUME:
            t.state = ACTIVE
        elif intent == REQUEST_CANCEL:
            t.fenced = True
        elif intent == SET_STATUS:
            t.work_status = work_status
        else:
            t.outcome, t.work_status = SETTLEMENT_OUTCOME[intent]
            t.state = TERMINAL
            assert t.generation not in t.outcomes, "a generation got a second terminal outcome in the model"
            t.outcomes[t.generation] = t.outcome
            if intent == SETTLE_COMPLETION:
                t.completion_id = completion_id
        return owed

    # leases

    def live_lease(self, t: MTask) -> bool:
        """A lease owned by an open run of the same epoch that has not expired."""
        if t.lease is None:
            return False
        run_id, epoch, expires = t.lease
        run = self.runs[run_id]
        return run.open and run.epoch == epoch and expires > self.now

    # transcripts

    def repair(self, t: MTask) -> bool:
        tail = t.tail
        if tail.open_turn is None:
            return False
        closers = len(tail.open_calls) + (1 if tail.open_step else 0) + 1
        t.tail = MTail(None, None, (), tail.checkpoint, tail.last_sequence + closers)
        t.state_version += 1
        return True


def grammar(tail: MTail, events: list[tuple], checkpoints: dict) -> MTail | str:
    """The transcript grammar of transcript_service.proto, over (kind, ref) pairs."""
    known = dict(checkpoints)
    for kind, ref in events:
        turn, step_, calls = tail.open_turn, tail.open_step, tail.open_calls
        if kind == "turn_start":
            if turn is not None:
                return "NESTED_TURN"
            tail = dataclasses.replace(tail, open_turn=ref)
        elif kind == "turn_end":
            if turn is None:
                return "TURN_END_WITHOUT_TURN"
            if ref != turn:
                return "TURN_MISMATCH"
            if step_ is not None:
                return "TURN_END_WITH_OPEN_STEP"
            tail = dataclasses.replace(tail, open_turn=None)
        elif kind == "step_start":
            if turn is None:
                return "STEP_OUTSIDE_TURN"
            if step_ is not None:
                return "NESTED_STEP"
            tail = dataclasses.replace(tail, open_step=ref)
        elif kind == "step_end":
            if step_ is None:
                return "STEP_END_WITHOUT_STEP"
            if ref != step_:
                return "STEP_MISMATCH"
            if calls:
                return "STEP_END_WITH_OPEN_CALLS"
            tail = dataclasses.replace(tail, open_step=None)
        elif kind == "tool_call":
            if step_ is None:
                return "TOOL_CALL_OUTSIDE_STEP"
            if ref in calls:
                return "DUPLICATE_CALL_ID"
            tail = dataclasses.replace(tail, open_calls=calls + (ref,))
        elif kind == "tool_result":
            if ref not in calls:
                return "RESULT_FOR_UNKNOWN_CALL"
            tail = dataclasses.replace(tail, open_calls=tuple(c for c in calls if c != ref))
        elif kind == "assistant_message":
            if turn is None:
                return "ASSISTANT_MESSAGE_OUTSIDE_TURN"
        elif kind in ("user_message", "user_feedback", "prompt_resend"):
            if turn is not None:
                return "USER_INPUT_INSIDE_TURN"
        elif kind == "checkpoint":
            if step_ is not None:
                return "CHECKPOINT_INSIDE_STEP"
            known.setdefault(ref, tail.last_sequence + 1)
            tail = dataclasses.replace(tail, checkpoint=ref)
        elif kind == "checkpoint_restore":
            if turn is not None:
                return "RESTORE_INSIDE_TURN"
            if ref not in known:
                return "UNKNOWN_CHECKPOINT"
            tail = dataclasses.replace(tail, checkpoint=ref)
        tail = dataclasses.replace(tail, last_sequence=tail.last_sequence + 1)
    return tail


def to_event(kind: str, ref: str) -> completion_types.SessionEvent:
    event = completion_types.SessionEvent()
    body = getattr(event, kind)
    body.SetInParent()
    field = {
        "turn_start": "turn_id",
        "turn_end": "turn_id",
        "step_start": "step_id",
        "step_end": "step_id",
        "tool_call": "call_id",
        "tool_result": "call_id",
        "checkpoint": "checkpoint_id",
        "checkpoint_restore": "checkpoint_id",
    }.get(kind)
    if field:
        setattr(body, field, ref)
    if kind == "tool_call":
        body.tool_name, body.arguments = "bash", "make test"
    if kind == "turn_end":
        body.reason = completion_enums.TURN_END_REASON_COMPLETED
    if kind in ("user_message", "assistant_message", "user_feedback", "prompt_resend"):
        body.text = f"{kind} text"
    if kind == "tool_result":
        body.content = "ok"
    return event


# -- the state machine ---------------------------------------------------------------------------


class Disagreement(AssertionError):
    pass


class FunnelMachine(RuleBasedStateMachine):
    """Both services, one model. Each rule makes one client call (which may make
    several lifecycle transitions), checks the answer against the model's
    prediction, and applies the prediction."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = Path(tempfile.mkdtemp(prefix="funnel-model-"))
        self.clock = ManualClock(CLOCK_START_MICROS)
        self.model = Model()
        self.f = Funnel(
            self.clock,
            self.tmp,
            LifecycleConfig(listen="127.0.0.1:0", database=str(self.tmp / "lifecycle.sqlite3"), health_interval=5.0),
            CompletionConfig(
                listen="127.0.0.1:0",
                database=str(self.tmp / "completion.sqlite3"),
                lifecycle_timeout=10.0,
                settle_interval=0.2,
                health_interval=5.0,
            ),
            POLICY,
        )
        self.run(lambda: self.f.start())
        self.ts = transcript_grpc.TranscriptServiceStub(self.run(lambda: self._channel()))
        self.serial = 0
        self.calls = 0

    async def _channel(self):
        channel = credentials.insecure_channel(self.f.completion.address)
        self.f._channels.append(channel)
        return channel

    def run(self, make):
        """Runs `make()` (a coroutine, or a gRPC call, which must be created inside
        the loop that awaits it) to completion on this machine's loop."""

        async def go():
            return await make()

        return self.loop.run_until_complete(go())

    def teardown(self) -> None:
        try:
            self.run(lambda: self.f.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # calling and comparing

    def call(self, make) -> tuple[str, object]:
        """(OK | the ErrorInfo reason, response or error) of the call `make()` makes;
        never UNKNOWN or INTERNAL."""
        self.calls += 1

        async def go():
            try:
                return OK, await make()
            except grpc.aio.AioRpcError as error:
                return error, None

        outcome, response = self.run(go)
        if outcome == OK:
            return OK, response
        error = outcome
        assert error.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (error.code(), error.details())
        info = error_info(error)
        assert info is not None, (error.code(), error.details())
        return info.reason, error

    def expect(self, what: str, expected: str, got: str, error=None) -> None:
        STATS[(what.split(" ")[0], got)] += 1
        if expected != got:
            detail = error.details() if isinstance(error, grpc.aio.AioRpcError) else ""
            raise Disagreement(f"{what}: the model expected {expected}, the service answered {got} {detail}")

    def settle_background(self) -> None:
        """Lets the propagations the last call committed reach the children."""
        self.run(lambda: self.f.lifecycle.authority.deliver_pending())

    def rid(self) -> str:
        self.serial += 1
        return f"r{self.serial}"

    def task_of(self, index: int) -> tuple[str, MTask | None]:
        """Mostly a registered task; sometimes any id of the pool (maybe not registered yet)."""
        candidates = sorted(self.model.tasks) + [TASKS[index % len(TASKS)]]
        task_id = candidates[index % len(candidates)]
        return task_id, self.model.tasks.get(task_id)

    def pick_run(self, index: int) -> MRun | None:
        runs = list(self.model.runs.values())
        return runs[index % len(runs)] if runs else None

    # rules: lifecycle

    @initialize()
    def two_tasks(self):
        for task_id in TASKS[:2]:
            got, response = self.call(
                lambda task_id=task_id: self.f.lc.RegisterTask(
                    lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id), timeout=CALL_TIMEOUT
                )
            )
            self.expect("RegisterTask", OK, got, response)
            self.model.tasks[task_id] = MTask(task_id, None)

    @rule(
        index=st.integers(0, 11),
        parent=st.one_of(st.none(), st.integers(0, 5)),
        attached=st.booleans(),
        offset=st.sampled_from([0, 0, 0, -1, 1]),
    )
    def register(self, index, parent, attached, offset):
        m = self.model
        task_id = TASKS[index % len(TASKS)]
        existing = m.tasks.get(task_id)
        request = lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id, request_id=self.rid())
        link = None
        if parent is not None:
            parent_id, parent_task = self.task_of(parent)
            generation = max(1, (parent_task.generation if parent_task else 1) + offset)
            mode = "ATTACHED" if attached else "DETACHED"
            link = (parent_id, generation, mode)
            request.parent.CopyFrom(
                lifecycle_types.ParentLink(
                    task_id=parent_id,
                    generation=generation,
                    mode=lifecycle_enums.ParentLinkMode.Value(f"PARENT_LINK_MODE_{mode}"),
                )
            )
        if link and link[0] == task_id:
            expected = "FIELD_MALFORMED"
        elif existing is not None:
            expected = "TASK_ALREADY_EXISTS"
        elif link is None:
            expected = OK
        else:
            parent_task = m.tasks.get(link[0])
            if parent_task is None:
                expected = "PARENT_NOT_FOUND"
            elif link[2] == "ATTACHED":
                expected = m.parent_admits_work(link[1], parent_task) or OK
            else:
                expected = "PARENT_GENERATION_MISMATCH" if link[1] > parent_task.generation else OK
        got, response = self.call(lambda: self.f.lc.RegisterTask(request, timeout=CALL_TIMEOUT))
        self.expect(f"RegisterTask {task_id} {link}", expected, got, response)
        if got == OK:
            m.tasks[task_id] = MTask(task_id, link, evidence=m.early_evidence.pop(task_id, []))

    @rule(
        index=st.integers(0, 11),
        intent=st.sampled_from(
            [
                REQUEST_CANCEL,
                REQUEST_CANCEL,
                SETTLE_CANCEL,
                SETTLE_CANCEL,
                SETTLE_FAILURE,
                SETTLE_TIMEOUT,
                SUSPEND,
                ACTIVATE,
                RESUME,
                RESUME,
                PROPAGATE,
                SET_STATUS,
            ]
        ),
        offset=st.sampled_from([0, 0, 0, 0, -1, 1]),
        status=st.sampled_from(["READY", "IN_PROGRESS", "BLOCKED"]),
    )
    def lifecycle_intent(self, index, intent, offset, status):
        m = self.model
        task_id, t = self.task_of(index)
        generation = max(1, (t.generation if t else 1) + offset)
        common = dict(
            workspace_id=WS,
            task_id=task_id,
            generation=generation,
            request_id=self.rid(),
            cause=lifecycle_types.Cause(source="operator:model", reason=f"{intent} by the model test"),
        )
        work_status = lifecycle_enums.WorkStatus.Value(f"WORK_STATUS_{status}")
        request, method = {
            REQUEST_CANCEL: (lifecycle_messages.RequestCancellationRequest, self.f.lc.RequestCancellation),
            SETTLE_CANCEL: (lifecycle_messages.SettleCancellationRequest, self.f.lc.SettleCancellation),
            SETTLE_FAILURE: (lifecycle_messages.SettleFailureRequest, self.f.lc.SettleFailure),
            SETTLE_TIMEOUT: (lifecycle_messages.SettleTimeoutRequest, self.f.lc.SettleTimeout),
            SUSPEND: (lifecycle_messages.SuspendGenerationRequest, self.f.lc.SuspendGeneration),
            ACTIVATE: (
                lambda **kw: lifecycle_messages.ActivateGenerationRequest(work_status=work_status, **kw),
                self.f.lc.ActivateGeneration,
            ),
            RESUME: (lifecycle_messages.ResumeWithGenerationRequest, self.f.lc.ResumeWithGeneration),
            PROPAGATE: (lifecycle_messages.PropagateParentTerminationRequest, self.f.lc.PropagateParentTermination),
            SET_STATUS: (
                lambda **kw: lifecycle_messages.SetWorkStatusRequest(work_status=work_status, **kw),
                self.f.lc.SetWorkStatus,
            ),
        }[intent]
        expected = m.judge(intent, task_id, generation)
        before = t.revision if t else None
        got, response = self.call(lambda: method(request(**common), timeout=CALL_TIMEOUT))
        self.expect(
            f"{intent} {task_id} generation {generation}", OK if expected == "ALREADY" else expected, got, response
        )
        if expected == OK:
            m.apply(intent, task_id, generation, work_status=status if intent in (ACTIVATE, SET_STATUS) else None)
            assert response.event.revision == before + 1 and response.task.revision == before + 1
        elif expected == "ALREADY":
            assert response.event.revision <= before and response.task.revision == before
        self.settle_background()

    # rules: runs and leases

    @rule(index=st.integers(0, 11), ttl=st.sampled_from([1, 5, 60, 600]))
    def claim(self, index, ttl):
        m = self.model
        task_id, t = self.task_of(index)
        if t is None:
            expected = "TASK_NOT_FOUND"
        elif t.terminal:
            expected = "GENERATION_TERMINAL"
        elif t.fenced:
            expected = "CANCELLATION_REQUESTED"
        elif t.lease and m.runs[t.lease[0]].open and t.lease[2] > m.now:  # another open run's live lease
            expected = "LEASE_HELD"
        elif t.state == REGISTERED:
            problem = m.judge(ACTIVATE, task_id, t.generation)
            expected = OK if problem == OK else "LIFECYCLE_REJECTED"
        else:
            expected = OK
        got, response = self.call(lambda: self.f.claim(task_id, workspace=WS, ttl_seconds=ttl))
        self.expect(f"ClaimTask {task_id}", expected, got, response)
        if expected == "LIFECYCLE_REJECTED":
            # The lifecycle refused the activation the claim needs, which comes before
            # the claim commits: nothing was written, the epoch was not used.
            self.expect(
                "refused claim's lifecycle reason",
                m.judge(ACTIVATE, task_id, t.generation),
                error_info(response).metadata["lifecycle_reason"],
            )
        elif expected == OK:
            # The claim closed the turn the previous holder left open.
            m.repair(t)
            t.epoch += 1
            run = response.run
            assert (run.generation, response.lease.epoch) == (t.generation, t.epoch)
            m.runs[run.run_id] = MRun(run.run_id, task_id, t.generation, t.epoch)
            m.completion_events += 1  # RUN_CLAIMED
            t.lease = (run.run_id, t.epoch, m.now + ttl * SECOND)
            if t.state == REGISTERED:
                m.apply(ACTIVATE, task_id, t.generation, work_status="IN_PROGRESS")
            elif t.work_status != "IN_PROGRESS":
                m.apply(SET_STATUS, task_id, t.generation, work_status="IN_PROGRESS")

    @rule(pick=st.integers(0, 100), ttl=st.sampled_from([1, 30, 120]), stale_epoch=st.booleans())
    def renew(self, pick, ttl, stale_epoch):
        m = self.model
        run = self.pick_run(pick)
        if run is None:
            return
        t = m.tasks[run.task_id]
        epoch = run.epoch + 1 if stale_epoch else run.epoch
        if not run.open:
            expected = "RUN_ALREADY_FINISHED"
        elif t.lease is None or t.lease[0] != run.run_id or t.lease[1] != epoch:
            expected = "LEASE_NOT_CURRENT"
        elif t.lease[2] <= m.now:
            expected = "LEASE_EXPIRED"
        else:
            expected = OK
        got, response = self.call(
            lambda: self.f.cs.RenewLease(
                completion_messages.RenewLeaseRequest(
                    workspace_id=WS, run_id=run.run_id, epoch=epoch, lease_ttl=Duration(seconds=ttl)
                ),
                timeout=CALL_TIMEOUT,
            )
        )
        self.expect(f"RenewLease {run.run_id}", expected, got, response)
        if got == OK:
            t.lease = (run.run_id, epoch, m.now + ttl * SECOND)

    @rule(seconds=st.sampled_from([1, 2, 10, 45, 150]))
    def advance_clock(self, seconds):
        self.clock.advance(seconds * SECOND)
        self.model.now = self.clock.now_micros()

    # rules: transcripts and evidence

    @rule(
        index=st.integers(0, 11),
        shape=st.sampled_from(
            [
                "open",
                "work",
                "close",
                "full",
                "checkpoint",
                "feedback",
                "resend",
                "restore",
                "restore_unknown",
                "bad",
                "message",
            ]
        ),
        n=st.integers(0, 3),
    )
    def append(self, index, shape, n):
        m = self.model
        task_id, t = self.task_of(index)
        tail = t.tail if t else MTail()
        close = [("tool_result", c) for c in tail.open_calls] + (
            [("step_end", tail.open_step)] if tail.open_step else []
        )
        close += [("turn_end", tail.open_turn)] if tail.open_turn else []
        events = {
            "open": [("turn_start", f"turn-{n}"), ("assistant_message", "")],
            "work": [("step_start", f"step-{n}"), ("tool_call", f"call-{n}")]
            + ([("tool_result", f"call-{n}")] if n else []),
            "close": close,
            "full": close
            + [
                ("turn_start", f"turn-x{n}"),
                ("step_start", "s"),
                ("tool_call", "c"),
                ("tool_result", "c"),
                ("step_end", "s"),
                ("checkpoint", f"cp-{n}"),
                ("turn_end", f"turn-x{n}"),
            ],
            "checkpoint": [("checkpoint", f"cp-{n}")],
            "feedback": [("user_feedback", "")] + ([("turn_start", f"turn-f{n}")] if n else []),
            "resend": [("prompt_resend", "")],
            "restore": [
                ("checkpoint_restore", sorted(t.checkpoints)[n % len(t.checkpoints)] if t and t.checkpoints else "cp-0")
            ],
            "restore_unknown": [("checkpoint_restore", "cp-never")],
            "bad": [("tool_result", "call-unknown")],
            "message": [("user_message", "")],
        }[shape] or [("user_message", "")]
        request = transcript_messages.AppendTranscriptRequest(
            workspace_id=WS, task_id=task_id, request_id=self.rid(), events=[to_event(k, r) for k, r in events]
        )
        resume = False
        if t is None:
            expected = "TASK_NOT_FOUND"
        else:
            following = grammar(t.tail, events, t.checkpoints)
            if t.terminal:
                completion = t.completions.get(t.generation)
                first_kind, first_ref = events[0]
                reopens = first_kind in ("user_feedback", "prompt_resend") or (
                    first_kind == "checkpoint_restore"
                    and completion is not None
                    and completion.checkpoint
                    and first_ref in t.checkpoints
                    and t.checkpoints[first_ref] < t.checkpoints.get(completion.checkpoint, 0)
                )
                if t.outcome != COMPLETED or not reopens:
                    expected = "GENERATION_TERMINAL"
                elif isinstance(following, str):
                    expected = "TRANSCRIPT_GRAMMAR_VIOLATION"
                else:
                    problem = m.judge(RESUME, task_id, t.generation + 1)
                    expected = OK if problem == OK else "LIFECYCLE_REJECTED"
                    resume = problem == OK
            else:
                expected = "TRANSCRIPT_GRAMMAR_VIOLATION" if isinstance(following, str) else OK
        got, response = self.call(lambda: self.ts.AppendTranscript(request, timeout=CALL_TIMEOUT))
        self.expect(f"AppendTranscript {task_id} {shape} {events}", expected, got, response)
        if got == "TRANSCRIPT_GRAMMAR_VIOLATION":
            self.expect("grammar rule", following, error_info(response).metadata["rule"])
        if got != OK:
            return
        if resume:
            m.apply(RESUME, task_id, t.generation + 1)
        for offset, (kind, ref) in enumerate(events):
            if kind == "checkpoint":
                t.checkpoints.setdefault(ref, t.tail.last_sequence + 1 + offset)
        t.tail = following
        t.state_version += 1
        assert (response.state_version, response.generation, response.resumed) == (
            t.state_version,
            t.generation,
            resume,
        )
        STATS[("resumed by " + events[0][0], OK)] += resume

    @rule(index=st.integers(0, 11))
    def load(self, index):
        m = self.model
        task_id, t = self.task_of(index)
        expected_repair = bool(t and t.tail.open_turn is not None and not m.live_lease(t))
        got, response = self.call(
            lambda: self.ts.LoadTranscript(
                transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id=task_id, page_size=1000),
                timeout=CALL_TIMEOUT,
            )
        )
        if t is None:  # never registered, so it has no transcript either
            self.expect(f"LoadTranscript {task_id}", "TASK_NOT_FOUND", got, response)
            return
        self.expect(f"LoadTranscript {task_id}", OK, got, response)
        assert response.repaired == expected_repair, (task_id, response.repaired, expected_repair)
        if expected_repair:
            m.repair(t)
            STATS[("repaired on load", OK)] += 1
        assert response.turn_in_progress == bool(t and t.tail.open_turn is not None), task_id
        assert response.state_version == (t.state_version if t else 0)
        assert len(response.events) == (t.tail.last_sequence if t else 0)
        synthetic = [e for e in response.events if e.synthetic]
        assert all(
            e.tool_result.is_error
            or e.HasField("step_end")
            or e.turn_end.reason == completion_enums.TURN_END_REASON_INTERRUPTED
            for e in synthetic
        )

    @rule(
        index=st.integers(0, 11),
        passed=st.booleans(),
        where=st.sampled_from(["current", "current", "other"]),
        generation_offset=st.sampled_from([0, 0, 1]),
    )
    def evidence(self, index, passed, where, generation_offset):
        task_id, t = self.task_of(index)
        checkpoint = (t.tail.checkpoint if t else "") if where == "current" else "cp-elsewhere"
        generation = (t.generation if t else 1) + generation_offset
        got, response = self.call(
            lambda: self.f.cs.RecordEvidence(
                completion_messages.RecordEvidenceRequest(
                    workspace_id=WS,
                    task_id=task_id,
                    generation=generation,
                    kind="tests",
                    checkpoint=checkpoint,
                    verdict=completion_enums.EVIDENCE_VERDICT_PASSED
                    if passed
                    else completion_enums.EVIDENCE_VERDICT_FAILED,
                    request_id=self.rid(),
                ),
                timeout=CALL_TIMEOUT,
            )
        )
        self.expect(f"RecordEvidence {task_id}", OK, got, response)  # not checked against the task
        self.model.completion_events += 1  # EVIDENCE_RECORDED
        facts = t.evidence if t is not None else self.model.early_evidence.setdefault(task_id, [])
        facts.append((generation, "tests", passed, checkpoint))

    # rules: the completion transaction

    def gates(self, t: MTask, run: MRun, epoch: int, outcome: str, result: str, state_version: int | None):
        """(verdict, decisive gate) of the built-in gates, in their order."""
        m = self.model
        tail = t.tail
        evaluated = t.state_version if state_version is None else state_version
        lease = t.lease
        checks = [
            (
                "lease.live",
                True,
                run.open
                and lease is not None
                and lease[0] == run.run_id
                and lease[1] == epoch
                and run.epoch == epoch
                and lease[2] > m.now,
            ),
            ("lifecycle.generation_current", True, run.generation == t.generation and not t.terminal),
            ("lifecycle.no_cancellation", True, not t.fenced),
            (
                "completion.circuit_breaker",
                True,
                t.blocked.count((run.generation, tail.checkpoint, result)) < BREAKER_THRESHOLD,
            ),
            ("transcript.state_version_current", False, evaluated == t.state_version),
            (
                "transcript.no_open_work",
                False,
                not tail.open_calls and tail.open_step is None and tail.open_turn is None,
            ),
            ("lifecycle.no_active_children", False, not m.children(t)),
            ("evidence.required", False, outcome == FAILED or self._evidence_passed(t, run.generation)),
            ("result.non_empty", False, bool(result.strip())),
        ]
        for gate_id, hard, holds in checks:
            if not holds:
                return ("HARD_BLOCK" if hard else "SOFT_BLOCK"), gate_id
        return "ALLOW", None

    def _evidence_passed(self, t: MTask, generation: int) -> bool:
        latest = None
        for fact_generation, kind, passed, checkpoint in t.evidence:
            if fact_generation == generation and kind == "tests" and checkpoint == t.tail.checkpoint:
                latest = passed
        return latest is True

    def completion_transaction(
        self, t: MTask, run: MRun, epoch: int, outcome: str, result: str, state_version: int | None
    ):
        """The model's attempt: (verdict, decisive gate, settlement or None, error or None); applies it."""
        m = self.model
        verdict, decisive = self.gates(t, run, epoch, outcome, result, state_version)
        if verdict != "ALLOW":
            t.blocked.append((run.generation, t.tail.checkpoint, result))
            m.completion_events += 1
            return verdict, decisive, None, None
        evaluated = t.state_version if state_version is None else state_version
        identity = (run.generation, evaluated, t.tail.checkpoint, outcome)
        existing = t.completions.get(run.generation)
        if existing is not None:
            if existing.outcome != outcome:
                return verdict, None, None, "COMPLETION_CONFLICT"
            return verdict, None, existing.settlement, None
        intent = SETTLE_COMPLETION if outcome == COMPLETED else SETTLE_FAILURE
        problem = m.judge(intent, t.task_id, run.generation, completion_id="(new)")
        settlement = "SETTLED" if problem == OK else "REJECTED"
        m.completion_events += 2
        return verdict, None, settlement, (identity, intent, problem)

    def record_completion(self, t: MTask, run: MRun, outcome: str, completion, plan) -> None:
        identity, intent, problem = plan
        assert completion.completion_id and completion.generation == run.generation
        t.completions[run.generation] = MCompletion(
            completion.completion_id,
            run.generation,
            outcome,
            identity,
            t.tail.checkpoint,
            "SETTLED" if problem == OK else "REJECTED",
            "" if problem == OK else problem,
        )
        if problem == OK:
            self.model.apply(intent, t.task_id, run.generation, completion_id=completion.completion_id)
        else:
            assert completion.terminalization_error_reason == problem, (completion, problem)

    @rule(
        pick=st.integers(0, 100),
        outcome=st.sampled_from([COMPLETED, COMPLETED, COMPLETED, FAILED]),
        result=st.sampled_from(["Done: tests pass.", "Done: tests pass.", "Another result", "   "]),
        version=st.sampled_from(["unset", "unset", "current", "stale"]),
        stale_epoch=st.booleans(),
        wrong_task=st.integers(0, 12),
    )
    def attempt(self, pick, outcome, result, version, stale_epoch, wrong_task):
        m = self.model
        run = self.pick_run(pick)
        if run is None:
            return
        t = m.tasks[run.task_id]
        task_id = run.task_id if wrong_task > 5 else TASKS[wrong_task]
        epoch = run.epoch + 1 if stale_epoch and pick % 3 == 0 else run.epoch
        state_version = {"unset": None, "current": t.state_version, "stale": max(t.state_version - 1, 0)}[version]
        request = completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id=task_id,
            run_id=run.run_id,
            epoch=epoch,
            result=result,
            request_id=self.rid(),
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED
            if outcome == COMPLETED
            else completion_enums.REQUESTED_OUTCOME_FAILED,
        )
        if state_version is not None:
            request.state_version = state_version
        if task_id not in m.tasks:
            expected, plan = "TASK_NOT_FOUND", None
        elif task_id != run.task_id:
            expected, plan = "RUN_NOT_FOUND", None
        else:
            verdict, decisive, settlement, plan = self.completion_transaction(
                t, run, epoch, outcome, result, state_version
            )
            expected = plan if isinstance(plan, str) else OK
        # The model predicts the gates on the current lifecycle state: the attempt's
        # projected view must have caught up with the lifecycle events committed so far.
        self.run(lambda: self.f.projection_caught_up())
        got, response = self.call(lambda: self.f.cs.AttemptCompletion(request, timeout=CALL_TIMEOUT))
        self.expect(f"AttemptCompletion {run.run_id} {outcome} {result!r} {version}", expected, got, response)
        if got != OK:
            return
        decision = response.decision
        self.expect("verdict", verdict, completion_enums.Verdict.Name(decision.verdict).removeprefix("VERDICT_"))
        actual_decisive = [g.gate_id for g in decision.trace if g.decisive]
        self.expect("decisive gate", str([decisive] if decisive else []), str(actual_decisive))
        if verdict == "ALLOW":
            completion = response.completion
            self.expect(
                "settlement",
                settlement,
                completion_enums.SettlementStatus.Name(completion.settlement).removeprefix("SETTLEMENT_STATUS_"),
            )
            if isinstance(plan, tuple):
                self.record_completion(t, run, outcome, completion, plan)
            else:
                assert response.existing_completion
        self.settle_background()

    @rule(pick=st.integers(0, 100), feedback=st.booleans())
    def finish_work(self, pick, feedback):
        """What a well-behaved agent does: close the transcript, record passing tests
        at the current checkpoint, attempt completion; then maybe the user answers."""
        run = self.pick_run(pick)
        if run is None or not run.open:
            return
        index = sorted(self.model.tasks).index(run.task_id)
        self.renew(pick, 120, False)
        self.append(index, "close", 0)
        self.evidence(index, True, "current", 0)
        self.attempt(pick, COMPLETED, "Done: tests pass.", "unset", False, 12)
        if feedback:
            self.append(index, "feedback", 1)

    @rule(
        pick=st.integers(0, 100),
        outcome=st.sampled_from(["SUCCEEDED", "SUCCEEDED", "FAILED", "CANCELLED", "STALLED"]),
        final=st.sampled_from([None, None, None, "READY", "BLOCKED", "DONE", "CANCELLED"]),
    )
    def complete_run(self, pick, outcome, final):
        m = self.model
        run = self.pick_run(pick)
        if run is None:
            return
        t = m.tasks[run.task_id]
        request = completion_messages.CompleteRunRequest(
            workspace_id=WS,
            run_id=run.run_id,
            request_id=self.rid(),
            outcome=completion_enums.RunOutcome.Value(f"RUN_OUTCOME_{outcome}"),
            notes="Done: tests pass.",
            tokens_input=10,
            tokens_output=5,
        )
        if final:
            request.final_status = completion_enums.FinalStatus.Value(f"FINAL_STATUS_{final}")
        target = final or {"SUCCEEDED": "DONE", "FAILED": "BLOCKED", "CANCELLED": "CANCELLED"}.get(outcome)
        plan = decision = None
        # A lifecycle refusal of what the close needs is the answer: LIFECYCLE_REJECTED,
        # and the run stays open (what the lifecycle applied before the refusal stays).
        # Under a cancellation fence no status is set, and a close that leaves no run
        # holding the task settles the cancellation (issue 21).
        lifecycle_reason = ""

        def fenced() -> bool:
            return run.generation == t.generation and t.fenced and not t.terminal

        if not run.open:
            expected = "RUN_ALREADY_FINISHED"
        else:
            expected = OK
            if target == "DONE":
                settled = t.completions.get(run.generation)
                if settled is None or settled.settlement != "SETTLED":
                    verdict, decisive, settlement, plan = self.completion_transaction(
                        t, run, run.epoch, COMPLETED, "Done: tests pass.", None
                    )
                    decision = (verdict, decisive, settlement)
                    if isinstance(plan, str):
                        expected = plan
                    elif settlement == "REJECTED":
                        refusal = plan[2] if isinstance(plan, tuple) else settled.error_reason
                        lifecycle_reason = "" if refusal == "CANCELLATION_FENCED" else refusal
            elif target == "CANCELLED":
                if not t.fenced:
                    lifecycle_reason = m.judge(REQUEST_CANCEL, t.task_id, run.generation)
                    if lifecycle_reason == OK:
                        m.apply(REQUEST_CANCEL, t.task_id, run.generation)
                        lifecycle_reason = ""
                if not lifecycle_reason:
                    lifecycle_reason = m.judge(SETTLE_CANCEL, t.task_id, run.generation)
                    if lifecycle_reason in (OK, "ALREADY"):
                        if lifecycle_reason == OK:
                            m.apply(SETTLE_CANCEL, t.task_id, run.generation)
                        lifecycle_reason = ""
            elif target is not None and not fenced():
                lifecycle_reason = m.judge(SET_STATUS, t.task_id, run.generation)
                if lifecycle_reason == OK:
                    m.apply(SET_STATUS, t.task_id, run.generation, work_status=target)
                    lifecycle_reason = ""
            if lifecycle_reason:
                expected = "LIFECYCLE_REJECTED"
            elif expected == OK and fenced():
                lease = t.lease
                if not (lease and lease[0] != run.run_id and m.runs[lease[0]].open and lease[2] > m.now):
                    m.apply(SETTLE_CANCEL, t.task_id, run.generation)
        got, response = self.call(lambda: self.f.cs.CompleteRun(request, timeout=CALL_TIMEOUT))
        self.expect(f"CompleteRun {run.run_id} {outcome} {final}", expected, got, response)
        if got == "LIFECYCLE_REJECTED":
            self.expect("lifecycle_reason", lifecycle_reason, error_info(response).metadata["lifecycle_reason"])
            if isinstance(plan, tuple):  # the completion committed and was rejected: the model records it
                completion = self.run(
                    lambda: self.f.cs.GetCompletion(
                        completion_messages.GetCompletionRequest(
                            workspace_id=WS, task_id=t.task_id, generation=run.generation
                        ),
                        timeout=CALL_TIMEOUT,
                    )
                ).completion
                self.record_completion(t, run, COMPLETED, completion, plan)
            self.settle_background()
            return
        if got != OK:
            return
        run.open = False
        m.completion_events += 1  # RUN_CLOSED
        if decision is not None:
            verdict, decisive, settlement = decision
            self.expect(
                "close verdict",
                verdict,
                completion_enums.Verdict.Name(response.decision.verdict).removeprefix("VERDICT_"),
            )
            if verdict == "ALLOW":
                self.expect(
                    "close settlement",
                    settlement,
                    completion_enums.SettlementStatus.Name(response.completion.settlement).removeprefix(
                        "SETTLEMENT_STATUS_"
                    ),
                )
                if isinstance(plan, tuple):
                    self.record_completion(t, run, COMPLETED, response.completion, plan)
        self.expect(
            "final status",
            t.work_status,
            completion_enums.FinalStatus.Name(response.final_status).removeprefix("FINAL_STATUS_"),
        )
        self.settle_background()

    # invariants

    @invariant()
    def agrees_with_the_model(self):
        m = self.model
        self.settle_background()
        completions = self.run(
            lambda: self.f.cs.ListCompletions(
                completion_messages.ListCompletionsRequest(workspace_id=WS, page_size=1000), timeout=CALL_TIMEOUT
            )
        ).completions
        by_id = {c.completion_id: c for c in completions}
        stored_events = self.run(lambda: self.f.completion.store.read(lambda tx: tx.events.page(WS, 0, None, 100_000)))
        assert len(stored_events) == m.completion_events, (len(stored_events), m.completion_events)
        settled_events = [e.completion_id for e in stored_events if e.kind.name == "COMPLETION_SETTLED"]
        assert len(settled_events) == len(set(settled_events))
        for completion_id in settled_events:  # a COMPLETION_SETTLED event only for a SETTLED row
            assert by_id[completion_id].settlement == completion_enums.SETTLEMENT_STATUS_SETTLED, by_id[completion_id]
        assert {c for c, row in by_id.items() if row.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED} == set(
            settled_events
        )
        for task_id, t in m.tasks.items():
            view = self.run(lambda task_id=task_id: self.f.task(task_id, workspace=WS)).task
            state = lifecycle_enums.GenerationState.Name(view.state).removeprefix("GENERATION_STATE_")
            outcome = lifecycle_enums.TerminalOutcome.Name(view.outcome).removeprefix("TERMINAL_OUTCOME_")
            actual = (
                view.generation,
                view.revision,
                state,
                outcome if view.outcome else None,
                view.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED,
                lifecycle_enums.WorkStatus.Name(view.work_status).removeprefix("WORK_STATUS_"),
                view.completion_id or None,
            )
            expected = (t.generation, t.revision, t.state, t.outcome, t.fenced, t.work_status, t.completion_id)
            assert actual == expected, f"task {task_id}: service {actual}, model {expected}"
            events = self.run(
                lambda task_id=task_id: self.f.lc.ListLifecycleEvents(
                    lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id=task_id, page_size=1000),
                    timeout=CALL_TIMEOUT,
                )
            ).events
            # Revisions gapless and increasing; events equal committed transitions.
            assert [e.revision for e in events] == list(range(1, t.revision + 1)), [e.revision for e in events]
            assert all(a.sequence < b.sequence for a, b in itertools.pairwise(events))
            # One terminal outcome per generation, never changed once set.
            terminal = {}
            for e in events:
                if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL:
                    assert e.generation not in terminal, f"{task_id} generation {e.generation} terminal twice"
                    terminal[e.generation] = lifecycle_enums.TerminalOutcome.Name(e.outcome).removeprefix(
                        "TERMINAL_OUTCOME_"
                    )
            assert terminal == t.outcomes, (task_id, terminal, t.outcomes)
            by_revision = {e.revision: e for e in events}
            # A settled completion is the lifecycle's terminal transition of its generation.
            for generation, mc in t.completions.items():
                row = by_id[mc.completion_id]
                assert completion_enums.SettlementStatus.Name(row.settlement).endswith(mc.settlement), (row, mc)
                if mc.settlement == "SETTLED":
                    event = by_revision[row.lifecycle_revision]
                    assert event.sequence == row.lifecycle_event_sequence and event.generation == generation
                    assert event.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL
                    if mc.outcome == COMPLETED:
                        assert (
                            event.intent == lifecycle_enums.INTENT_SETTLE_COMPLETION
                            and event.completion_id == mc.completion_id
                        )
                        assert t.outcomes[generation] == COMPLETED
                    else:
                        assert (
                            event.intent == lifecycle_enums.INTENT_SETTLE_FAILURE and t.outcomes[generation] == FAILED
                        )
            # Transcript tail and state version.
            stored = self.run(lambda task_id=task_id: self.f.completion.authority.transcripts.state(WS, task_id))
            tail, version = stored.tail, stored.state_version
            actual_tail = (tail.open_turn, tail.open_step, tuple(tail.open_calls), tail.checkpoint, tail.last_sequence)
            mt = t.tail
            assert actual_tail == (mt.open_turn, mt.open_step, mt.open_calls, mt.checkpoint, mt.last_sequence), (
                task_id,
                actual_tail,
                mt,
            )
            assert version == t.state_version, (task_id, version, t.state_version)
            lease = self.run(
                lambda task_id=task_id: self.f.completion.store.read(lambda tx: tx.runs.load_lease(WS, task_id))
            )
            assert (lease.run_id, lease.epoch, lease.expires_at) == t.lease if t.lease else lease is None
        runs = self.run(
            lambda: self.f.cs.ListRuns(
                completion_messages.ListRunsRequest(workspace_id=WS, page_size=1000), timeout=CALL_TIMEOUT
            )
        ).runs
        assert {r.run_id: (r.epoch, not r.HasField("finish_time")) for r in runs} == {
            r.run_id: (r.epoch, r.open) for r in m.runs.values()
        }


@pytest.mark.slow
def test_both_services_agree_with_the_reference_model():
    run_state_machine_as_test(
        FunnelMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    print("\nmodel test: " + ", ".join(f"{call}:{answer} {n}" for (call, answer), n in sorted(STATS.items())))
