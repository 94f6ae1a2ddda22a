"""Test-only mutations of the product: each plants one real defect class, so that
the simulation's checkers can be shown to catch it (test_mutations.py). Each is a
function of pytest's `monkeypatch`; nothing here is imported by the product."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from completion_service.api import transcript_service
from completion_service.authority import projection, settler, transcripts
from completion_service.authority.transcripts import Reopened
from completion_service.clients import lifecycle_client
from completion_service.units import completions, runs
from completion_service.units import transcripts as transcript_units
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import sqlite, watch
from funnel.runtime.sqlite import Database
from lifecycle_service import authority as lifecycle_authority
from lifecycle_service import units
from lifecycle_service.api import requests as lifecycle_requests
from lifecycle_service.api import service as lifecycle_service
from lifecycle_service.core import intents, rules


def fence_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """SettleCompletion lets every completion through a cancellation fence, as if
    it had proved it came first (the fence's check, gone)."""

    def decide(intent: Any, situation: Any, policy: Any) -> Any:
        if isinstance(intent, intents.SettleCompletion):
            # An offset this negative makes every authoritative time "earlier than the fence".
            policy = dataclasses.replace(policy, max_clock_offset_micros=-(2**61))
        return rules.decide(intent, situation, policy)

    monkeypatch.setattr(lifecycle_authority, "decide", decide)


def replay_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated lifecycle request id is applied again instead of answered from memory."""
    monkeypatch.setattr(units, "recall", lambda tx, request: None)
    # Nothing remembered either: the second application does not trip over the first's key.
    monkeypatch.setattr(units, "remember", lambda tx, request, response, now: None)


def late_commit_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lifecycle watch subscribes after draining the backlog without reading the
    store once more: an event committed in between is never delivered."""

    async def follow(
        read_after: Callable[..., Any],
        broker: watch.EventBroker,
        scope: Any,
        key: Any,
        cursor: int,
        wrap: Callable[[Any], Any],
        sequence_of: Callable[[Any], int],
        ends: watch.WatchEnds,
    ) -> AsyncIterator[Any]:
        while True:
            events = await read_after(cursor, watch.WATCH_BATCH)
            for event in events:
                item = wrap(event)
                cursor = sequence_of(item)
                yield item
            if len(events) < watch.WATCH_BATCH:
                break
        with broker.subscribe(scope, key) as live:
            async for item in watch._live(live, cursor, sequence_of, ends):
                yield item

    monkeypatch.setattr(lifecycle_service, "follow", follow)


def outbox_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settlement outbox never retries: a settlement whose inline call got no
    answer stays PENDING for good."""

    async def settle_due(self: settler.Settler) -> int:
        return 0

    monkeypatch.setattr(settler.Settler, "settle_due", settle_due)


def projection_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lifecycle projection serves each task's view one generation behind (as
    if it had missed the resume). The attempt's guard reads such a view afresh, so
    this alone must cost nothing: test_mutations.py shows the checkers stay quiet."""
    view = projection.LifecycleProjection.view

    def behind(self: projection.LifecycleProjection, workspace_id: str, task_id: str) -> Any:
        served = view(self, workspace_id, task_id)
        if served is None or served.generation == 1:
            return served
        return dataclasses.replace(served, generation=served.generation - 1)

    monkeypatch.setattr(projection.LifecycleProjection, "view", behind)


def stale_view_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view one generation behind reaches the gates: the projection lags
    (projection_behind) and the check that reads such a view afresh is gone."""
    projection_behind(monkeypatch)
    attempt = completions.attempt

    def judged_as_read(tx: Any, command: Any, context: Any, now: int, inline_settle_micros: int = 0) -> Any:
        return attempt(tx, command, dataclasses.replace(context, lifecycle_projected=False), now, inline_settle_micros)

    monkeypatch.setattr(completions, "attempt", judged_as_read)


def driver_fault_untranslated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store lets the driver's operational faults (locked, disk full, I/O
    error, read-only) through as they are, instead of as StorageUnavailable."""

    def untranslated(exc: Any) -> Any:
        return exc

    monkeypatch.setattr(sqlite, "operational_fault", untranslated)


def transcript_replay_appends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated AppendTranscript request id appends its batch again instead of
    answering from memory (the shell's early look and the unit's, both gone)."""
    monkeypatch.setattr(transcript_service, "peek", lambda tx, key: None)
    monkeypatch.setattr(transcript_units, "recalled", lambda requests, key: None)
    monkeypatch.setattr(transcript_units, "answer", lambda requests, key, render, result, now: result)


def repair_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted final turn is never closed: neither a load nor a claim repairs it."""

    def leave_open(tx: Any, workspace_id: str, task_id: str, now: int) -> Any:
        return transcript_units.Repaired()

    monkeypatch.setattr(transcript_units, "repair", leave_open)
    monkeypatch.setattr(runs, "repair_transcript", leave_open)


def ended_generation_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch for a terminal generation is appended to it as it is, neither
    refused nor reopening the task (bookkeeping reviving terminal state)."""

    async def reopen(self: Any, workspace: str, task: Any, events: Any, expected: Any, batch: Any) -> Reopened:
        return Reopened(task.generation, by_this_batch=False)

    monkeypatch.setattr(transcripts.Reopener, "reopen", reopen)


def cancelled_writer_forgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite writer, cancelled (its owner, with the incarnation that crashed),
    stops without failing the writes it had not taken yet: they wait for good (the
    defect that had the writer pipeline reverted; tests/storage's
    test_a_cancelled_owner_answers_every_write_it_was_given)."""

    async def write_until_closed(self: Database) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                await self._write_pending()
                if self._closing and not self._has_pending():
                    return
        except BaseException:
            self._closing = True
            raise

    monkeypatch.setattr(Database, "_write_until_closed", write_until_closed)


def batch_settled_as_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """SettleCompletions settles every item of the call as its first (a loop that
    keeps the first item, as a late-bound closure does): the first is applied, and
    every item is answered with the first's settlement, so the completion service
    marks the others SETTLED while their tasks never completed."""

    async def settle_completions(
        self: lifecycle_service.LifecycleService, request: Any, context: Any
    ) -> lifecycle_messages.SettleCompletionsResponse:
        lifecycle_requests.check_settle_completions(request)
        first = request.items[0]
        answers = await asyncio.gather(*(self._settle_item(first, context) for _ in request.items))
        return lifecycle_messages.SettleCompletionsResponse(results=answers)

    monkeypatch.setattr(lifecycle_service.LifecycleService, "SettleCompletions", settle_completions)


def batch_refusal_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The completion service reads a SettleCompletions call answered OK as every
    item settled: an item the lifecycle service refused (at a cancellation fence)
    is recorded SETTLED with another item's settlement, as if the call's status
    were each item's."""
    send = lifecycle_client.LifecycleClient._send_settlements

    async def send_settlements(self: lifecycle_client.LifecycleClient, items: list[Any]) -> list[Any]:
        answers = await send(self, items)
        settled = [answer for answer in answers if not isinstance(answer, Exception)]
        if len(items) > 1 and settled:
            return [
                settled[0] if isinstance(answer, lifecycle_client.LifecycleRejected) else answer for answer in answers
            ]
        return answers

    monkeypatch.setattr(lifecycle_client.LifecycleClient, "_send_settlements", send_settlements)


MUTATIONS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "fence_ignored": fence_ignored,
    "replay_executes": replay_executes,
    "late_commit_skipped": late_commit_skipped,
    "outbox_stopped": outbox_stopped,
    "projection_behind": projection_behind,
    "stale_view_served": stale_view_served,
    "driver_fault_untranslated": driver_fault_untranslated,
    "transcript_replay_appends": transcript_replay_appends,
    "repair_skipped": repair_skipped,
    "ended_generation_appended": ended_generation_appended,
    "cancelled_writer_forgets": cancelled_writer_forgets,
    "batch_settled_as_first": batch_settled_as_first,
    "batch_refusal_settled": batch_refusal_settled,
}
