"""The Python client (`funnel.client`) against both services as real processes
(tests/reliability/harness.py, over TLS with the test PKI): the story to
COMPLETED as a host and an agent, a retry that reuses its request id, a
refusal as FunnelError, a client built from a `funnel up` data directory,
per-caller tokens on one client's channels (`as_caller`, as `funnel mcp` uses it),
and watches that resume after a restart or an overflow (as `funnel ui` follows them)."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from funnel.client import FunnelClient, FunnelError, RetryPolicy, Tls
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from lifecycle_service.api.requests import MAX_CAUSE_REASON_LENGTH
from tests import credentials
from tests.reliability.harness import Pair

pytestmark = pytest.mark.asyncio(loop_scope="module")

WS = "client-ws"
AGENT = "agent-py"
BOUND = 30.0
COMMITS = 200


def client(pair: Pair, token: str | None, **options) -> FunnelClient:
    """A client as a host builds one from files: the CA, the local client
    certificate (the lifecycle service asks for one), a token."""
    pki = credentials.PKI
    return FunnelClient(
        pair.lifecycle.address,
        pair.completion.address,
        tls=Tls.from_files(pki.ca, pki.cert("client"), pki.key("client")),
        token=token,
        **options,
    )


def host_token() -> str:
    return credentials.token("host-py", [f"{WS}:host"])


def fresh_task() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


async def test_the_story_reaches_completed_through_the_client(pair):
    task_id = fresh_task()
    async with client(pair, host_token()) as host, client(pair, credentials.token(AGENT, [f"{WS}:agent"])) as agent:
        registered = await host.register_task(WS, task_id, cause=lifecycle_types.Cause(source="test", reason="a task"))
        assert (registered.task.generation, registered.task.state) == (1, lifecycle_enums.GENERATION_STATE_REGISTERED)

        async def until_terminal() -> lifecycle_types.LifecycleEvent:
            # The agent watches its own task (no host token needed).
            async for event in agent.watch_lifecycle_events(WS, task_id=task_id):
                if event.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL:
                    return event
            raise AssertionError("the watch ended before the task did")

        async def settled() -> completion_types.CompletionEvent:
            async for event in host.watch_completion_events(WS, task_id=task_id):
                if event.kind == completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED:
                    return event
            raise AssertionError("the watch ended before the settlement")

        terminal, settlement = asyncio.create_task(until_terminal()), asyncio.create_task(settled())
        claim = await agent.claim_task(WS, task_id, AGENT, lease_ttl=60)
        assert isinstance(claim, completion_messages.ClaimTaskResponse)
        run = claim.run
        blocked = await agent.attempt_completion(WS, task_id, run.run_id, claim.lease.epoch, result="fixed it")
        assert blocked.decision.next_action == completion_enums.AGENT_ACTION_RECORD_EVIDENCE
        await host.record_evidence(
            WS, task_id, run.generation, "tests", completion_enums.EVIDENCE_VERDICT_PASSED, run_id=run.run_id
        )
        allowed = await agent.attempt_completion(WS, task_id, run.run_id, claim.lease.epoch, result="fixed it")
        assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW
        closed = await agent.complete_run(
            WS, run.run_id, completion_enums.RUN_OUTCOME_SUCCEEDED, notes="fixed it", tokens_total=10
        )
        assert closed.final_status == completion_enums.FINAL_STATUS_DONE
        event = await asyncio.wait_for(terminal, BOUND)
        completion_id = allowed.completion.completion_id
        assert (event.outcome, event.completion_id) == (lifecycle_enums.TERMINAL_OUTCOME_COMPLETED, completion_id)
        assert (await asyncio.wait_for(settlement, BOUND)).completion_id == completion_id
        task = await host.get_task(WS, task_id)
        assert task.task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
        assert [e.sequence for e in await host.list_lifecycle_events(WS, task_id)][-1] == event.sequence


async def test_a_lost_reply_is_retried_with_the_same_request_id_and_replayed(pair):
    task_id = fresh_task()
    async with client(pair, host_token()) as host:
        # The service commits the registration, then its reply is lost (UNAVAILABLE).
        pair.lifecycle.arm("lifecycle.after_commit_before_reply:drop:1")
        try:
            registered = await host.register_task(WS, task_id)
        finally:
            pair.lifecycle.disarm()
        assert pair.lifecycle.faults_fired() >= 1
        events = await host.list_lifecycle_events(WS, task_id)
        # One registration, made by the first call: the retry was answered from memory.
        assert [(e.sequence, e.request_id) for e in events] == [
            (registered.event.sequence, registered.event.request_id)
        ]
        assert registered.event.request_id.startswith("py-")


async def test_without_retries_a_lost_reply_surfaces_as_unavailable(pair):
    task_id = fresh_task()
    async with client(pair, host_token(), retry=RetryPolicy(attempts=1)) as host:
        pair.lifecycle.arm("lifecycle.after_commit_before_reply:drop:1")
        try:
            with pytest.raises(FunnelError) as caught:
                await host.register_task(WS, task_id, request_id=f"register-{task_id}")
        finally:
            pair.lifecycle.disarm()
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
        # The caller's own retry with its request id gets the committed answer.
        again = await host.register_task(WS, task_id, request_id=f"register-{task_id}")
        assert again.event.request_id == f"register-{task_id}"


async def test_a_refusal_is_a_funnel_error_with_its_reason_and_metadata(pair):
    task_id = fresh_task()
    async with client(pair, host_token()) as host:
        await host.register_task(WS, task_id)
        first = await host.claim_task(WS, task_id, "agent-1")
        with pytest.raises(FunnelError) as caught:
            await host.claim_task(WS, task_id, "agent-2")
    error = caught.value
    assert (error.code, error.reason, error.domain) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_HELD",
        "funnel.completion.v1",
    )
    assert error.metadata["holder_run_id"] == first.run.run_id
    assert "lease_expire_time" in error.metadata
    assert str(error).startswith("LEASE_HELD (FAILED_PRECONDITION): ")


async def test_as_caller_sends_each_callers_own_token_over_the_shared_channels(pair):
    task_id = fresh_task()
    agent_token = credentials.token(AGENT, [f"{WS}:agent"])
    # A client without a token of its own, as `funnel mcp --http` holds one.
    async with client(pair, None) as shared:
        with pytest.raises(FunnelError) as anonymous:
            await shared.get_task(WS, task_id)
        assert (anonymous.value.code, anonymous.value.reason) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "CREDENTIALS_MISSING",
        )
        host, agent = shared.as_caller(host_token()), shared.as_caller(agent_token)
        registered = await host.register_task(WS, task_id)
        assert registered.event.caller.subject == "host-py"
        # The agent's token, not the host's: an agent may not register a task.
        with pytest.raises(FunnelError) as refused:
            await agent.register_task(WS, fresh_task())
        assert refused.value.reason == "ROLE_NOT_PERMITTED"
        events = agent.watch_lifecycle_events(WS, task_id=task_id)
        assert (await asyncio.wait_for(anext(events), BOUND)).caller.subject == "host-py"
        claim = await agent.claim_task(WS, task_id, AGENT)
        run = (await agent.get_run(WS, claim.run.run_id)).run
        assert (run.agent_id, run.epoch) == (AGENT, claim.lease.epoch)
        await events.aclose()
        # A caller closes nothing: the channels are the shared client's.
        await agent.close()
        assert (await host.get_task(WS, task_id)).task.task_id == task_id
    # Closed, the shared client ended its callers' channels too.
    with pytest.raises(grpc.aio.UsageError, match="Channel is closed"):
        await host.get_task(WS, task_id)


async def test_as_caller_overrides_the_clients_token_and_retry_policy(pair):
    task_id = fresh_task()
    # The client's own token is the agent's; its caller's, the host's.
    async with client(pair, credentials.token(AGENT, [f"{WS}:agent"])) as agent:
        host = agent.as_caller(host_token(), retry=RetryPolicy(attempts=1))
        assert agent.retry == RetryPolicy() and agent.as_caller(host_token()).retry is agent.retry
        pair.lifecycle.arm("lifecycle.after_commit_before_reply:drop:1")
        try:
            with pytest.raises(FunnelError) as caught:
                await host.register_task(WS, task_id, request_id=f"register-{task_id}")
        finally:
            pair.lifecycle.disarm()
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE  # not retried: the caller's policy
        again = await host.register_task(WS, task_id, request_id=f"register-{task_id}")
        assert (again.event.request_id, again.event.caller.subject) == (f"register-{task_id}", "host-py")
        with pytest.raises(FunnelError) as refused:
            await agent.register_task(WS, fresh_task())
        assert refused.value.reason == "ROLE_NOT_PERMITTED"


async def test_a_client_from_a_funnel_up_data_directory(pair, tmp_path):
    # A data directory as `funnel up` lays it out: its tls/ folder is the test PKI,
    # which ensure_local_pki made exactly as `funnel up` makes its own.
    (tmp_path / "tls").symlink_to(credentials.PKI.directory, target_is_directory=True)
    task_id = fresh_task()
    async with FunnelClient.from_data_dir(
        tmp_path,
        subject="host-local",
        permissions=[f"{WS}:host"],
        lifecycle=pair.lifecycle.address,
        completion=pair.completion.address,
    ) as host:
        registered = await host.register_task(WS, task_id)
        assert registered.event.caller.subject == "host-local"
        claim = await host.claim_task(WS, task_id, "agent-1")
        assert claim.run.task_id == task_id
    with pytest.raises(ValueError, match="token"):
        FunnelClient.from_data_dir(tmp_path)


async def test_a_rate_limited_call_waits_as_retry_info_says(tmp_path):
    # Its own pair: a lifecycle service that lets each caller through 5 times a second.
    limited = await Pair(tmp_path, lifecycle_args=["--rate-limit", "5", "--rate-burst", "1"]).start()
    try:
        task_id = fresh_task()
        async with client(limited, host_token()) as host:
            await host.register_task(WS, task_id)
            started = asyncio.get_running_loop().time()
            for _ in range(3):
                await host.get_task(WS, task_id)
            # Each call past the burst waited about 1/5 s, as the RetryInfo said.
            assert asyncio.get_running_loop().time() - started >= 0.3
        async with client(limited, host_token(), retry=RetryPolicy(max_retry_delay=0.001)) as impatient:
            with pytest.raises(FunnelError) as caught:
                for _ in range(3):
                    await impatient.get_task(WS, task_id)
    finally:
        await limited.stop()
    error = caught.value
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED")
    assert error.retry_after is not None and error.retry_after > 0


async def test_a_watch_resumes_after_its_service_restarts_without_a_gap_or_a_repeat(tmp_path):
    # Its own pair: this test stops and restarts the lifecycle service.
    restarting = await Pair(tmp_path).start()
    patient = RetryPolicy(attempts=40, max_backoff=0.5)  # the restart takes a few seconds on a loaded machine
    try:
        task_id = fresh_task()
        async with client(restarting, host_token(), retry=patient) as host:
            await host.register_task(WS, task_id)
            breaks: list[tuple[str, int]] = []

            async def broke(error: FunnelError, after: int) -> None:
                breaks.append((error.reason, after))

            events = host.watch_lifecycle_events(WS, task_id=task_id, on_break=broke)
            first = await asyncio.wait_for(anext(events), BOUND)
            assert first.to_state == lifecycle_enums.GENERATION_STATE_REGISTERED
            # A watch with a policy of its own: it gives up at the first break.
            impatient = host.watch_lifecycle_events(WS, task_id=task_id, retry=RetryPolicy(attempts=1))
            assert (await asyncio.wait_for(anext(impatient), BOUND)).sequence == first.sequence
            # SIGTERM ends the stream with SERVER_SHUTTING_DOWN (UNAVAILABLE); then the service comes back.
            restarting.lifecycle.stop()
            with pytest.raises(FunnelError) as ended:
                await asyncio.wait_for(anext(impatient), BOUND)
            assert (ended.value.code, ended.value.reason) == (grpc.StatusCode.UNAVAILABLE, "SERVER_SHUTTING_DOWN")
            restarting.lifecycle.start()
            claim = await host.claim_task(WS, task_id, "agent-1")
            run = claim.run
            await host.record_evidence(WS, task_id, run.generation, "tests", completion_enums.EVIDENCE_VERDICT_PASSED)
            allowed = await host.attempt_completion(WS, task_id, run.run_id, claim.lease.epoch, result="done")
            assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW
            seen = [first]
            while seen[-1].to_state != lifecycle_enums.GENERATION_STATE_TERMINAL:
                seen.append(await asyncio.wait_for(anext(events), BOUND))
            await events.aclose()
            history = await host.list_lifecycle_events(WS, task_id)
    finally:
        await restarting.stop()
    assert [e.sequence for e in seen] == [e.sequence for e in history]
    # Told before each reopening, after the one event delivered before the stop.
    assert breaks and breaks[0] == ("SERVER_SHUTTING_DOWN", first.sequence), breaks


async def test_a_watch_that_fell_behind_its_buffer_resumes_without_a_gap_or_a_repeat(tmp_path):
    # Its own pair: a lifecycle service that buffers only a few events per watcher.
    small = await Pair(tmp_path, lifecycle_args=["--watch-buffer", "4"]).start()
    breaks: list[tuple[str, int]] = []

    async def broke(error: FunnelError, after: int) -> None:
        breaks.append((error.reason, after))

    try:
        async with client(small, host_token()) as host:
            first = await host.register_task(WS, fresh_task())
            events = host.watch_lifecycle_events(WS, after_sequence=first.event.sequence - 1, on_break=broke)
            assert (await asyncio.wait_for(anext(events), BOUND)).sequence == first.event.sequence
            # The watcher reads nothing while the commits go on, more than the
            # connection and the service's buffer hold: the service ends its stream.
            cause = lifecycle_types.Cause(source="test", reason="x" * MAX_CAUSE_REASON_LENGTH)
            for _ in range(COMMITS // 25):
                await asyncio.gather(*(host.register_task(WS, fresh_task(), cause=cause) for _ in range(25)))
            seen = [first.event.sequence]
            while len(seen) < COMMITS + 1:
                seen.append((await asyncio.wait_for(anext(events), BOUND)).sequence)
            await events.aclose()
    finally:
        await small.stop()
    assert seen == list(range(first.event.sequence, first.event.sequence + COMMITS + 1))
    assert breaks and all(reason == "WATCH_OVERFLOW" for reason, _ in breaks), breaks
