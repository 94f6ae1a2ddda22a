"""The invariants every simulated history must keep, each a function from the
evidence (the history, both durable stores once drained, what the watchers saw,
the clocks, what crashed incarnations left behind) to the violations it found,
as one line each.

  settled      no terminal state without a settled completion or failure, no
               settled completion without its terminal event, nothing pending
  one_terminal at most one terminal event per generation; revisions gapless
  fence        a completion passes a cancellation fence only if it truly came
               first (in virtual time, whatever the clocks' skew)
  request_ids  a request id applies once, and every answer after the first
               success is that success
  watchers     each watcher saw every committed event of its workspace once, in order
  acknowledged no acknowledged write is missing from the durable state
  transcripts  each transcript reads back whole (sequences 1..n, the grammar kept,
               so an interrupted turn closed once; no batch applied twice, no turn
               left open after the last load); an acknowledged batch is in it as
               sent, in its generation, which no answer had shown ended before
               the batch was sent;
               every load read a prefix of it, in order
  blocks       no attempt is blocked as "not the current generation" while its
               run's generation was the task's current, live one
  linearizable each task's lifecycle record, as all callers saw it, against a
               sequential register of revisions (linearizability.py)
  faults       no call ended INTERNAL, no loop died, nothing unexpected raised
  unwound      a crashed incarnation leaves nothing behind: every write handed to
               its store answered (committed, or failed unapplied), every task
               ended, every database connection closed"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from completion_service.api.convert import session_event_from_proto
from completion_service.core import transcript as grammar
from completion_service.core.model import (
    CompletionEventKind,
    CompletionRecord,
    EvidenceRecord,
    RequestedOutcome,
    SettlementStatus,
)
from completion_service.storage.port import CompletionReadTx
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.store import Transactions
from funnel_sim.clocks import SimClock
from funnel_sim.history import Call, History
from funnel_sim.linearizability import Operation, linearizable
from funnel_sim.network import INTERNAL, Failed, Ok, no_answer
from funnel_sim.workload import Task
from lifecycle_service.api.convert import event_to_proto
from lifecycle_service.core.model import GenerationState, IntentKind, LifecycleEvent, Outcome, Policy

EVERYTHING = 1_000_000


@dataclass
class Evidence:
    history: History
    lifecycle: Transactions[Any, Any]
    completion: Transactions[Any, Any]
    workspaces: list[str]
    # Task name: its workspace.
    tasks: dict[str, str]
    # Watcher name: (its workspace, the events it saw).
    watchers: dict[str, tuple[str, list[Any]]]
    # Each whole load of a transcript: the task and the events it read.
    transcript_reads: list[tuple[Task, list[completion_types.SessionEvent]]]
    # The tasks whose transcript was loaded whole after the drain.
    audited: set[str]
    lifecycle_clock: SimClock
    completion_clock: SimClock
    policy: Policy
    # What the crashed incarnations left behind (Node.unwound), one line each.
    left_behind: list[str]


@dataclass
class Durable:
    """Both stores' committed state, read once."""

    events: list[LifecycleEvent]
    completions: list[CompletionRecord]
    completion_events: list[Any]
    runs: dict[str, Any]
    evidence_ids: set[str]
    # Task name: its transcript.
    transcripts: dict[str, list[grammar.SessionEvent]]


async def check(evidence: Evidence) -> list[str]:
    durable = await _read(evidence)
    violations: list[str] = []
    for checker in CHECKERS:
        violations += [f"{checker.__name__}: {problem}" for problem in checker(evidence, durable)]
    return violations


async def _read(evidence: Evidence) -> Durable:
    """Every workspace's state, each kind of record in one list (sequences are
    global, so the events of all workspaces sort in commit order)."""
    events: list[LifecycleEvent] = []
    completions: list[CompletionRecord] = []
    completion_events: list[Any] = []
    runs: list[Any] = []
    found: set[str] = set()
    store = evidence.completion
    for workspace in evidence.workspaces:
        events += await evidence.lifecycle.read(functools.partial(_lifecycle_events, workspace=workspace))
        completions += await store.read(functools.partial(_completions, workspace=workspace))
        completion_events += await store.read(functools.partial(_completion_events, workspace=workspace))
        runs += await store.read(functools.partial(_runs, workspace=workspace))
    transcripts: dict[str, list[grammar.SessionEvent]] = {}
    for task_id, workspace in sorted(evidence.tasks.items()):
        listed = await store.read(functools.partial(_evidence_of, workspace=workspace, task_id=task_id))
        found |= {record.evidence_id for record in listed}
        transcripts[task_id] = await store.read(functools.partial(_transcript, workspace=workspace, task_id=task_id))
    events.sort(key=lambda e: e.sequence)
    completion_events.sort(key=lambda e: e.sequence)
    return Durable(events, completions, completion_events, {run.run_id: run for run in runs}, found, transcripts)


def _lifecycle_events(tx: Any, workspace: str) -> list[LifecycleEvent]:
    events: list[LifecycleEvent] = tx.events.page(workspace, 0, None, EVERYTHING)
    return events


def _completions(tx: CompletionReadTx, workspace: str) -> list[CompletionRecord]:
    return tx.completions.page(workspace, None, None, None, EVERYTHING)


def _completion_events(tx: CompletionReadTx, workspace: str) -> list[Any]:
    return list(tx.events.page(workspace, 0, None, EVERYTHING))


def _runs(tx: CompletionReadTx, workspace: str) -> list[Any]:
    return list(tx.runs.page(workspace, None, None, EVERYTHING))


def _evidence_of(tx: CompletionReadTx, workspace: str, task_id: str) -> list[EvidenceRecord]:
    return tx.evidence.page(workspace, task_id, None, None, EVERYTHING)


def _transcript(tx: CompletionReadTx, workspace: str, task_id: str) -> list[grammar.SessionEvent]:
    return tx.transcripts.page(workspace, task_id, 0, EVERYTHING)


def settled(evidence: Evidence, durable: Durable) -> Iterable[str]:
    by_id = {c.completion_id: c for c in durable.completions}
    for event in durable.events:
        if event.outcome is Outcome.COMPLETED:
            completion = by_id.get(event.completion_id or "")
            if completion is None or completion.settlement is not SettlementStatus.SETTLED:
                yield f"{event.task_id} gen {event.generation} COMPLETED by {event.completion_id} without it settled"
        if event.intent is IntentKind.SETTLE_FAILURE:
            completion_id = (event.request_id or "").removeprefix("settle:")
            completion = by_id.get(completion_id)
            if (
                completion is None
                or completion.outcome is not RequestedOutcome.FAILED
                or (completion.settlement is not SettlementStatus.SETTLED)
            ):
                yield f"{event.task_id} gen {event.generation} FAILED without a settled failure {completion_id}"
    terminal = {(e.task_id, e.generation): e for e in durable.events if e.to_state is GenerationState.TERMINAL}
    for completion in durable.completions:
        if completion.settlement is SettlementStatus.PENDING:
            yield f"completion {completion.completion_id} still PENDING after the drain"
        if completion.settlement is SettlementStatus.SETTLED:
            ended = terminal.get((completion.task_id, completion.generation))
            if ended is None or ended.sequence != completion.lifecycle_event_sequence:
                yield f"completion {completion.completion_id} SETTLED without its terminal event"


def one_terminal(evidence: Evidence, durable: Durable) -> Iterable[str]:
    ends = collections.Counter(
        (e.task_id, e.generation) for e in durable.events if e.to_state is GenerationState.TERMINAL
    )
    for (task_id, generation), count in sorted(ends.items()):
        if count > 1:
            yield f"{task_id} gen {generation} has {count} terminal events"
    revisions: dict[str, list[int]] = collections.defaultdict(list)
    for event in durable.events:
        revisions[event.task_id].append(event.revision)
    for task_id, seen in sorted(revisions.items()):
        if seen != list(range(1, len(seen) + 1)):
            yield f"{task_id} revisions are {seen}"


def fence(evidence: Evidence, durable: Durable) -> Iterable[str]:
    by_id = {c.completion_id: c for c in durable.completions}
    for event in durable.events:
        if event.intent is not IntentKind.SETTLE_COMPLETION or event.cancellation_requested_at is None:
            continue
        completion = by_id.get(event.completion_id or "")
        if completion is None:
            continue  # settled() names it
        committed = evidence.completion_clock.true_micros(completion.committed_at)
        requested = evidence.lifecycle_clock.true_micros(event.cancellation_requested_at)
        if committed >= requested:
            yield (
                f"{event.task_id} gen {event.generation}: completion {completion.completion_id} committed "
                f"{committed - requested} µs after the cancellation request passed the fence"
            )


def _request_id(request: Any) -> str:
    return getattr(request, "request_id", "")


def _attempts(history: History) -> Iterable[tuple[Call, str, Any, Any]]:
    """Every call as (call, method, request, answer), the items of a settle batch one by one."""
    for call in history.calls:
        if call.method == "SettleCompletions":
            results = call.answer.response.results if isinstance(call.answer, Ok) else None
            for n, item in enumerate(call.request.items):
                answer: Any = call.answer
                if results is not None:
                    result = results[n]
                    answer = Ok(result.settled) if result.HasField("settled") else Failed(result.error)
                yield call, "SettleCompletion", item, answer
        else:
            yield call, call.method, call.request, call.answer


def _same(method: str, first: Any, later: Any) -> bool:
    if method == "AttemptCompletion":
        # A replay carries the completion's settlement as it is now (service._replayed_attempt).
        return (first.decision.verdict, first.completion.completion_id) == (
            later.decision.verdict,
            later.completion.completion_id,
        )
    first_bytes: bytes = first.SerializeToString(deterministic=True)
    later_bytes: bytes = later.SerializeToString(deterministic=True)
    return first_bytes == later_bytes


def request_ids(evidence: Evidence, durable: Durable) -> Iterable[str]:
    applied = collections.Counter((e.caller.subject, e.intent, e.request_id) for e in durable.events if e.request_id)
    for (subject, intent, request_id), count in sorted(applied.items(), key=str):
        if count > 1:
            yield f"request id {request_id} of {subject} applied {count} times ({intent.name})"
    first: dict[tuple[str, str, str, str], Any] = {}
    for call, method, request, answer in _attempts(evidence.history):
        request_id = _request_id(request)
        if not request_id or no_answer(answer):
            continue
        key = (call.source, call.target, method, request_id)
        if key not in first:
            if isinstance(answer, Ok):
                first[key] = answer.response
        elif not isinstance(answer, Ok) or not _same(method, first[key], answer.response):
            yield f"{call.source} {method} {request_id} answered differently on a retry at {call.answered:.3f}"


def watchers(evidence: Evidence, durable: Durable) -> Iterable[str]:
    for name, (workspace, seen) in evidence.watchers.items():
        lifecycle = name.startswith("lifecycle")
        expected = (
            [(e.sequence, e.task_id, e.revision) for e in durable.events if e.workspace_id == workspace]
            if lifecycle
            else [
                (e.sequence, e.task_id, e.kind.value) for e in durable.completion_events if e.workspace_id == workspace
            ]
        )
        got = [(e.sequence, e.task_id, e.revision if lifecycle else e.kind) for e in seen]
        if got != expected:
            missing = sorted(set(expected) - set(got))[:3]
            repeated = [item for item, n in collections.Counter(got).items() if n > 1][:3]
            yield f"{name} saw {len(got)} events of {len(expected)}: missing {missing}, repeated {repeated}"


def acknowledged(evidence: Evidence, durable: Durable) -> Iterable[str]:
    events = {e.sequence: e for e in durable.events}
    committed = {
        e.completion_id for e in durable.completion_events if e.kind is CompletionEventKind.COMPLETION_COMMITTED
    }
    for call, method, request, answer in _attempts(evidence.history):
        if not isinstance(answer, Ok):
            continue
        response = answer.response
        if call.target == "lifecycle" and method != "GetTask":
            acked = response.event
            stored = events.get(acked.sequence)
            if stored is None or (stored.task_id, stored.revision) != (acked.task_id, acked.revision):
                yield f"{call.source} {method} {_request_id(request)}: acknowledged event {acked.sequence} lost"
        elif method == "ClaimTask" and response.run.run_id not in durable.runs:
            yield f"{call.source} claim {response.run.run_id} acknowledged, then lost"
        elif method == "RecordEvidence" and response.evidence.evidence_id not in durable.evidence_ids:
            yield f"{call.source} evidence {response.evidence.evidence_id} acknowledged, then lost"
        elif (
            method == "AttemptCompletion"
            and response.HasField("completion")
            and (response.completion.completion_id not in committed)
        ):
            yield f"{call.source} completion {response.completion.completion_id} acknowledged, then lost"
        elif method == "CompleteRun":
            run = durable.runs.get(response.run_id)
            if run is None or run.open:
                yield f"{call.source} close of {response.run_id} acknowledged, then lost"


def _shape(event: grammar.SessionEvent) -> tuple[Any, ...]:
    """What a client sent of an event (the service adds sequence, generation and time)."""
    return (event.kind, event.ref, event.name, event.text, event.is_error, event.reason)


def _records_seen(history: History) -> dict[str, list[tuple[float, int, int]]]:
    """Per task, every lifecycle answer's record as (answered, revision, generation):
    what it showed had committed by then. An event's own time is when its unit began,
    which a held write lock can put seconds before its commit."""
    seen: dict[str, list[tuple[float, int, int]]] = collections.defaultdict(list)
    for call, _, _, answer in _attempts(history):
        if call.target == "lifecycle" and isinstance(answer, Ok) and hasattr(answer.response, "task"):
            task = answer.response.task
            seen[task.task_id].append((call.answered, task.revision, task.generation))
    return seen


def _seen_ended(history: History) -> dict[tuple[str, int], float]:
    """When a lifecycle answer first showed each generation ended: its end had
    committed by then. (Not its event's time: that is when its unit began, which
    a held write lock can put seconds before the commit.)"""
    seen: dict[tuple[str, int], float] = {}
    for call, _, _, answer in _attempts(history):
        if call.target != "lifecycle" or not isinstance(answer, Ok) or not hasattr(answer.response, "task"):
            continue
        task = answer.response.task
        if task.state == lifecycle_enums.GENERATION_STATE_TERMINAL:
            key = (task.task_id, task.generation)
            seen[key] = min(seen.get(key, call.answered), call.answered)
    return seen


def transcripts(evidence: Evidence, durable: Durable) -> Iterable[str]:
    for task_id, events in sorted(durable.transcripts.items()):
        sequences = [e.sequence for e in events]
        if sequences != list(range(1, len(events) + 1)):
            yield f"{task_id} transcript has sequences {sequences}"
            continue
        tail = grammar.validate(grammar.Tail(), events)
        if isinstance(tail, grammar.Violation):
            yield f"{task_id} transcript breaks {tail.rule} at sequence {tail.index + 1}"
            continue
        # The grammar also means an interrupted turn was closed once. Every id a batch
        # sends is its own (turns.py): a turn started twice is a batch applied twice.
        started = collections.Counter(e.ref for e in events if e.kind is grammar.EventKind.TURN_START)
        twice = sorted(ref for ref, n in started.items() if n > 1)
        if twice:
            yield f"{task_id} transcript starts turns {twice[:3]} more than once"
    for task_id in sorted(evidence.audited):
        # The last load came when no lease was live any more: it closed an interrupted turn.
        tail = grammar.validate(grammar.Tail(), durable.transcripts.get(task_id, []))
        if isinstance(tail, grammar.Tail) and tail.open_turn is not None:
            yield f"{task_id} transcript still has turn {tail.open_turn!r} open after the last load"
    ended = _seen_ended(evidence.history)
    appends = [
        (call, request, answer)
        for call, method, request, answer in _attempts(evidence.history)
        if method == "AppendTranscript"
    ]
    # When each batch was first sent (a retry may come after the end and be answered from memory).
    sent_at: dict[tuple[str, str], float] = {}
    for call, request, _ in appends:
        key = (call.source, request.request_id)
        sent_at[key] = min(sent_at.get(key, call.invoked), call.invoked)
    for call, request, answer in appends:
        if not isinstance(answer, Ok):
            continue
        if (
            ended.get((request.task_id, answer.response.generation), float("inf"))
            < sent_at[(call.source, request.request_id)]
        ):
            # An append racing the end may land (it read the generation live); one sent
            # after a lifecycle answer showed the end may not.
            yield f"{call.source} transcript batch {request.request_id} appended to an ended generation"
        stored = durable.transcripts.get(request.task_id, [])
        first = answer.response.first_sequence
        sent = [_shape(session_event_from_proto(e)) for e in request.events]
        found = stored[first - 1 : first - 1 + len(sent)]
        if [_shape(e) for e in found] != sent or any(e.generation != answer.response.generation for e in found):
            yield f"{call.source} transcript batch {request.request_id} acknowledged at {first}, not stored as sent"
    for task, read in evidence.transcript_reads:
        stored = durable.transcripts.get(task.name, [])
        got = [(e.sequence, e.generation, e.synthetic, _shape(session_event_from_proto(e))) for e in read]
        expected = [(e.sequence, e.generation, e.synthetic, _shape(e)) for e in stored[: len(read)]]
        if got != expected:
            yield f"a load of {task.name}'s transcript read {len(read)} events that are not its first {len(read)}"


def blocks(evidence: Evidence, durable: Durable) -> Iterable[str]:
    # A view lagging behind the lifecycle may cost a refused settlement, never a block
    # as "not the current generation" while the run's generation was current and live
    # for the whole call (core/projection.py: a view of an older generation is read
    # again). Live: an answer had shown it before the call, in virtual time, and no
    # event ending it (terminal, or a newer generation) was stamped before the answer
    # (a stamp comes before its commit, so this errs towards "not live").
    clock = evidence.lifecycle_clock
    # Began: a lifecycle answer had shown the generation (it had committed by then).
    began: dict[tuple[str, int], float] = {}
    for task_id, records in _records_seen(evidence.history).items():
        for answered, _, shown in records:
            key = (task_id, shown)
            began[key] = min(began.get(key, answered), answered)
    ended: dict[tuple[str, int], float] = {}
    for event in durable.events:
        at = clock.true_micros(event.committed_at) / 1_000_000
        if event.to_state is GenerationState.TERMINAL:
            ended.setdefault((event.task_id, event.generation), at)
        if event.generation > 1:
            ended.setdefault((event.task_id, event.generation - 1), at)
    for call in evidence.history.calls:
        if call.method != "AttemptCompletion" or not isinstance(call.answer, Ok):
            continue
        decisive = [gate.gate_id for gate in call.answer.response.decision.trace if gate.decisive]
        run = durable.runs.get(call.request.run_id)
        if decisive != ["lifecycle.generation_current"] or run is None:
            continue
        generation = (call.request.task_id, run.generation)
        if began.get(generation, float("inf")) < call.invoked and ended.get(generation, float("inf")) > call.answered:
            yield (
                f"{call.source} attempt of {call.request.run_id} at {call.answered:.3f} blocked as not current,"
                f" while generation {run.generation} of {call.request.task_id} was current and live"
            )


Key = tuple[Any, ...]
# The state of a task not registered yet, after a read saw it absent (None means "no step possible").
_ABSENT: Key = ("absent",)


def record_key(task: lifecycle_types.Task) -> Key:
    return (
        task.revision,
        task.generation,
        task.state,
        task.outcome,
        task.cancellation,
        task.work_status,
        task.completion_id,
    )


def step(state: Key | None, op: tuple[str, Key | None]) -> Key | None:
    """A task's record as a register of revisions: a write moves it one revision on
    (or, a settlement answered from the record, leaves it as it is), a read sees it."""
    kind, key = op
    state = None if state == _ABSENT else state
    revision = state[0] if state is not None else 0
    if kind == "write":
        assert key is not None
        if key[0] == revision + 1 or key == state:
            return key
        return None
    if kind == "write?":
        return (revision + 1,)
    if kind == "read":
        if key is None:  # not found: only before its registration
            return None if state is not None else _ABSENT
        if state == key or (state is not None and len(state) == 1 and state[0] == key[0]):
            return key
        return None
    raise ValueError(kind)


def _lifecycle_operations(evidence: Evidence, durable: Durable) -> dict[str, list[Operation[Any]]]:
    seen = _records_seen(evidence.history)
    per_task: dict[str, list[Operation[Any]]] = collections.defaultdict(list)
    groups: dict[tuple[str, str, str, str], list[tuple[Call, Any]]] = collections.defaultdict(list)
    for call, method, request, answer in _attempts(evidence.history):
        if call.target != "lifecycle":
            continue
        if method == "GetTask":
            if isinstance(answer, Ok):
                per_task[request.task_id].append(
                    Operation(call.invoked, call.answered, ("read", record_key(answer.response.task)))
                )
            elif answer.reason == "TASK_NOT_FOUND":
                per_task[request.task_id].append(Operation(call.invoked, call.answered, ("read", None)))
        elif _request_id(request):
            groups[(call.source, method, request.task_id, request.request_id)].append((call, answer))
    for (_, _, task_id, _), attempts in groups.items():
        invoked = min(call.invoked for call, _ in attempts)
        ok = [(call, answer) for call, answer in attempts if isinstance(answer, Ok)]
        if ok:
            call, answer = min(ok, key=lambda pair: pair[0].answered)
            per_task[task_id].append(Operation(invoked, call.answered, ("write", record_key(answer.response.task))))
        elif any(no_answer(answer) for _, answer in attempts):
            per_task[task_id].append(Operation(invoked, None, ("write?", None)))
    for event in durable.events:
        if event.request_id is None:  # the lifecycle service's own: a propagation
            at = evidence.lifecycle_clock.true_micros(event.committed_at) / 1_000_000
            # It committed after its stamp and before any answer showed it (or a later revision).
            shown = [t for t, revision, _ in seen[event.task_id] if revision >= event.revision and t >= at]
            committed_by = min(shown, default=None)
            proto = event_to_proto(event)
            key = (
                proto.revision,
                proto.generation,
                proto.to_state,
                proto.outcome,
                proto.cancellation,
                proto.work_status,
                proto.completion_id,
            )
            per_task[event.task_id].append(Operation(at - 1e-6, committed_by, ("write", key)))
    return per_task


def linearizable_records(evidence: Evidence, durable: Durable) -> Iterable[str]:
    for task_id, operations in sorted(_lifecycle_operations(evidence, durable).items()):
        verdict = linearizable(operations, _ABSENT, step)
        if verdict is False:
            yield f"the lifecycle record of {task_id} is not linearizable ({len(operations)} operations)"


def faults(evidence: Evidence, durable: Durable) -> Iterable[str]:
    for note in evidence.history.anomalies():
        yield f"{note.node} at {note.at:.3f}: {note.text}"
    for call in evidence.history.calls:
        if not isinstance(call.answer, Ok) and call.answer.code == INTERNAL:
            yield f"{call.source} {call.method} ended INTERNAL at {call.answered:.3f}"


def unwound(evidence: Evidence, durable: Durable) -> Iterable[str]:
    return evidence.left_behind


CHECKERS: tuple[Callable[[Evidence, Durable], Iterable[str]], ...] = (
    settled,
    one_terminal,
    fence,
    request_ids,
    watchers,
    acknowledged,
    transcripts,
    blocks,
    linearizable_records,
    faults,
    unwound,
)
