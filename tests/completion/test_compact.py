"""The stored form of decisions and identity payloads (completion_service/storage/
compact.py): lossless for any value, small for the usual ones, and readable in
every form an older row or the PostgreSQL adapter holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion_service.core.model import decision_from_json, decision_to_json
from completion_service.storage import compact
from tests.completion.test_core_rules import DECISIONS

# A decision as the built-in gates write it for an allowed completion (from a benchmark database).
ALLOWED = (
    '{"checkpoint": "", "decision_schema": "funnel.completion.decision/v1", "forbidden_actions": ["CONTINUE_WORK", '
    '"ATTEMPT_COMPLETION"], "instruction": "Completion allowed (COMPLETED); report it and end the session.", '
    '"next_action": "REPORT_COMPLETE", "state_version": 0, "trace": [{"decisive": false, "gate_id": "lease.live", '
    '"reason": "run run_caf3b378f06d43848ca2d7c46f325dbb holds the live lease of epoch 1", "status": "PASSED", '
    '"version": 1}, {"decisive": false, "gate_id": "lifecycle.generation_current", "reason": "generation 1 is '
    'current and ACTIVE", "status": "PASSED", "version": 1}, {"decisive": false, "gate_id": '
    '"lifecycle.no_cancellation", "reason": "no cancellation requested", "status": "PASSED", "version": 1}, '
    '{"decisive": false, "gate_id": "completion.circuit_breaker", "reason": "0 earlier blocked attempt(s) with this '
    'result at this checkpoint", "status": "PASSED", "version": 1}, {"decisive": false, "gate_id": '
    '"transcript.state_version_current", "reason": "state version 0 is current", "status": "PASSED", "version": 1}, '
    '{"decisive": false, "gate_id": "transcript.no_open_work", "reason": "no open tool calls, steps or turn", '
    '"status": "PASSED", "version": 1}, {"decisive": false, "gate_id": "lifecycle.no_active_children", "reason": '
    '"no attached child task is open", "status": "PASSED", "version": 1}, {"decisive": false, "gate_id": '
    '"evidence.required", "reason": "the workspace requires no evidence", "status": "PASSED", "version": 1}, '
    '{"decisive": false, "gate_id": "result.non_empty", "reason": "a result is given", "status": "PASSED", '
    '"version": 1}], "verdict": "ALLOW"}'
)


@settings(max_examples=300, deadline=None)
@given(DECISIONS)
def test_any_decision_round_trips(decision):
    assert compact.decode_decision(compact.encode_decision(decision)) == decision


def test_an_allowed_decision_is_stored_in_a_tenth_of_its_json():
    decision = decision_from_json(ALLOWED)
    stored = compact.encode_decision(decision)
    assert len(stored) * 10 <= len(ALLOWED)
    assert compact.decode_decision(stored) == decision


# ALLOWED as this codec's first release stored it.
STORED_V1 = bytes.fromhex(
    "011bad196851332427a61927199b5ba41998a598185b985824271aa598279b98a5191b99a624258dd61ca335c768cd315a730ce59a0300"
)


def test_values_stored_by_the_first_release_still_read():
    # The dictionary is part of the data format; if this fails, it was edited.
    assert decision_to_json(compact.decode_decision(STORED_V1)) == ALLOWED


@pytest.mark.parametrize("older", [ALLOWED, ALLOWED.encode(), memoryview(ALLOWED.encode())])
def test_rows_stored_as_json_text_still_read(older):
    assert decision_to_json(compact.decode_decision(older)) == ALLOWED


@pytest.mark.parametrize(
    "damaged, message",
    [(b"\x07abc", "unknown format"), (compact.encode_decision(decision_from_json(ALLOWED))[:20], "truncated")],
)
def test_a_damaged_value_is_an_error_not_a_decision(damaged, message):
    with pytest.raises(ValueError, match=message):
        compact.decode_decision(damaged)


def test_a_value_decoded_again_is_the_same_decision_without_parsing(monkeypatch):
    stored = compact.encode_decision(decision_from_json(ALLOWED))
    first = compact.decode_decision(stored)
    monkeypatch.setattr(compact, "decision_from_json", lambda text: pytest.fail("parsed again"))
    assert compact.decode_decision(stored) is first


PAYLOAD = (
    b'{"checkpoint":"","decision_schema":"funnel.completion.decision/v1","generation":1,"outcome":"COMPLETED",'
    b'"schema":"funnel.completion.identity/v1","state_version":0,"task_id":"a16-13809073-0000486",'
    b'"workspace_id":"bench"}'
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_any_payload_round_trips(payload):
    assert compact.decode_payload(compact.encode_payload(payload)) == payload


def test_a_payload_is_stored_in_a_third_of_its_size_and_older_ones_still_read():
    stored = compact.encode_payload(PAYLOAD)
    assert len(stored) * 3 <= len(PAYLOAD)
    assert compact.decode_payload(stored) == PAYLOAD
    assert compact.decode_payload(PAYLOAD) == PAYLOAD  # a row written before


# PAYLOAD as this module's first release stored it.
PAYLOAD_V1 = bytes.fromhex("011b5aae4d3434d33534b630b0343037d6350002130b33cc38484acd4bce50aa0500")


def test_payloads_stored_by_the_first_release_still_read():
    assert compact.decode_payload(PAYLOAD_V1) == PAYLOAD
