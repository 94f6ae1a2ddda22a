"""The request-id rule's stored responses (funnel/runtime/idempotency.py): a
replay returns the exact bytes first answered, whatever form they were stored in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.idempotency import Replay, RequestKey, recall, remember

KEY = RequestKey("ws", "caller", "SettleCompletion", "req-1", b"fingerprint")


class Memory:
    """Request ids (funnel.runtime.idempotency.RequestIds) kept as given, as a storage adapter does."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str, str], tuple[bytes, bytes]] = {}

    def recall(self, workspace_id, caller, method, request_id):
        return self.rows.get((workspace_id, caller, method, request_id))

    def remember(self, key, response, created_at):
        self.rows[(key.workspace_id, key.caller, key.method, key.request_id)] = (key.fingerprint, response)

    def stored(self) -> bytes:
        return next(iter(self.rows.values()))[1]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096) | st.text(max_size=2000).map(lambda t: (t * 3).encode()))
def test_a_replay_returns_the_bytes_first_answered(response):
    memory = Memory()
    remember(memory, KEY, response, 1)
    assert recall(memory, KEY) == Replay(response)


def test_a_large_repetitive_response_is_stored_deflated():
    completion_id = "cmp_76069c9b8c544957b7fdd67912bbe6cb"
    task = lifecycle_types.Task(workspace_id="bench", task_id="a16-13809073-0000486", generation=1, revision=3)
    event = lifecycle_types.LifecycleEvent(
        workspace_id="bench",
        task_id="a16-13809073-0000486",
        completion_id=completion_id,
        request_id=f"settle:{completion_id}",
        cause=lifecycle_types.Cause(source="completion_service", originating_ids={"completion_id": completion_id}),
        caller=lifecycle_types.Caller(
            subject="spiffe://funnel.local/funnel/completion-service", role="completion-service"
        ),
    )
    response = lifecycle_messages.SettleCompletionResponse(task=task, event=event).SerializeToString()
    memory = Memory()
    remember(memory, KEY, response, 1)
    assert len(memory.stored()) < len(response) * 0.7
    assert recall(memory, KEY) == Replay(response)


def test_a_small_response_is_stored_as_it_is():
    memory = Memory()
    remember(memory, KEY, b"\x08\x01", 1)
    assert memory.stored() == b"\x08\x01"


def test_responses_stored_before_deflating_still_replay():
    memory = Memory()
    older = lifecycle_messages.GetTaskResponse(
        task=lifecycle_types.Task(workspace_id="ws", task_id="t" * 300)
    ).SerializeToString()
    memory.remember(KEY, older, 1)  # as an older release wrote it
    assert recall(memory, KEY) == Replay(older)
