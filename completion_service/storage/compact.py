"""How the completion service stores its largest repeated values, compactly:
a binding decision (its JSON, core.model's decision_to_json) and a completion's
identity payload (the RFC 8785 document its identity hashes), each deflated
against a preset dictionary of the text every such value repeats.

Each completion row and each attempt event carries its decision with the full
gate trace: ~1.6 KB of JSON, which used to fill a database page per row. With
the dictionary a typical decision takes 50-150 bytes and a payload ~60 of its
~210 (issue 13's footprint).

Format: one version byte, then a raw deflate stream made with that version's
dictionary. A stored value that is text, or bytes starting with "{", is the
plain JSON of rows written before this module (and, for decisions, of the
PostgreSQL adapter, whose server compresses large values itself). A dictionary
is part of the data format: never edit one; add a new version byte with a new
dictionary instead.
"""

from __future__ import annotations

import zlib

from completion_service.core.model import Decision, decision_from_json, decision_to_json

_V1 = 1
# Rarely repeated text first, the most frequent last (deflate reaches nearer bytes
# with shorter codes). Built from the decisions the built-in gates write.
_DECISIONS_V1 = (
    b'"details": {"current_generation": null, "current_lease": null, "current_state_version": null, '
    b'"decisive_gate": "", "evidence_checkpoint": "", "failing_evidence_kinds": [], "gate_feedback": "", '
    b'"lifecycle_reason": "", "missing_evidence_kinds": [], "open_child_task_ids": [], "open_step_id": "", '
    b'"open_tool_call_ids": [], "open_turn_id": ""}, "status": "FAILED", "decisive": true, '
    b'"SKIPPED", "BLOCK", "RESOLVE_OPEN_WORK", "RECORD_EVIDENCE", "WAIT_FOR_CHILDREN", "STOP_AND_REPORT", '
    b'"REFRESH_STATE", "RETRY_LATER", "FIX_RESULT", "external gate unavailable: ", '
    b'{"checkpoint": "", "decision_schema": "funnel.completion.decision/v1", "forbidden_actions": '
    b'["CONTINUE_WORK", "ATTEMPT_COMPLETION"], "instruction": "Completion allowed (COMPLETED); report it and end '
    b'the session.", "next_action": "REPORT_COMPLETE", "state_version": 0, "trace": [{"decisive": false, '
    b'"gate_id": "lease.live", "reason": "run run_ holds the live lease of epoch 1", "status": "PASSED", '
    b'"version": 1}, {"decisive": false, "gate_id": "lifecycle.generation_current", "reason": "generation 1 is '
    b'current and ACTIVE", "status": "PASSED", "version": 1}, {"decisive": false, "gate_id": '
    b'"lifecycle.no_cancellation", "reason": "no cancellation requested", "status": "PASSED", "version": 1}, '
    b'{"decisive": false, "gate_id": "completion.circuit_breaker", "reason": "0 earlier blocked attempt(s) with '
    b'this result at this checkpoint", "status": "PASSED", "version": 1}, {"decisive": false, "gate_id": '
    b'"transcript.state_version_current", "reason": "state version 0 is current", "status": "PASSED", "version": '
    b'1}, {"decisive": false, "gate_id": "transcript.no_open_work", "reason": "no open tool calls, steps or turn", '
    b'"status": "PASSED", "version": 1}, {"decisive": false, "gate_id": "lifecycle.no_active_children", "reason": '
    b'"no attached child task is open", "status": "PASSED", "version": 1}, {"decisive": false, "gate_id": '
    b'"evidence.required", "reason": "the workspace requires no evidence", "status": "PASSED", "version": 1}, '
    b'{"decisive": false, "gate_id": "result.non_empty", "reason": "a result is given", "status": "PASSED", '
    b'"version": 1}], "verdict": "ALLOW"}'
)


# An identity payload (core.identity), keys in RFC 8785 order.
_PAYLOADS_V1 = (
    b'{"checkpoint":"","decision_schema":"funnel.completion.decision/v1","generation":1,"outcome":"FAILED",'
    b'"schema":"funnel.completion.identity/v1","state_version":0,"task_id":"","workspace_id":""}'
    b'{"checkpoint":"","decision_schema":"funnel.completion.decision/v1","generation":1,"outcome":"COMPLETED",'
    b'"schema":"funnel.completion.identity/v1","state_version":0,"task_id":"'
)

# A completion row and its attempt event store the same decision, and the
# settlement reads the row back moments after the attempt wrote it: remember the
# last value encoded and the values recently encoded or decoded (decisions are
# immutable, so sharing one is safe). Converting to and from JSON is most of the cost.
_last_encoded: tuple[Decision | None, bytes] = (None, b"")
_known: dict[bytes, Decision] = {}
_KNOWN_LIMIT = 1024


def encode_decision(decision: Decision) -> bytes:
    global _last_encoded
    last = _last_encoded
    if last[0] is decision:
        return last[1]
    stored = encode_decision_json(decision_to_json(decision))
    _last_encoded = (decision, stored)
    _remember(stored, decision)
    return stored


def decode_decision(stored: str | bytes | memoryview) -> Decision:
    data = stored if isinstance(stored, str) else bytes(stored)
    known = _known.get(data) if isinstance(data, bytes) else None
    if known is not None:
        return known
    decision = decision_from_json(decode_decision_json(data))
    if isinstance(data, bytes) and data[:1] != b"{":
        _remember(data, decision)
    return decision


def encode_decision_json(text: str) -> bytes:
    """The stored form of a decision's JSON (decision_to_json)."""
    return _deflate(_DECISIONS_V1, text.encode("utf-8"))


def decode_decision_json(stored: str | bytes | memoryview) -> str:
    """A stored decision's JSON, from any of its stored forms."""
    if isinstance(stored, str):
        return stored
    data = bytes(stored)
    if data[:1] == b"{":
        return data.decode("utf-8")
    return _inflate(_DECISIONS_V1, data, "decision").decode("utf-8")


def encode_payload(payload: bytes) -> bytes:
    return _deflate(_PAYLOADS_V1, payload)


def decode_payload(stored: bytes | memoryview) -> bytes:
    data = bytes(stored)
    return data if data[:1] == b"{" else _inflate(_PAYLOADS_V1, data, "identity payload")


def _deflate(dictionary: bytes, data: bytes) -> bytes:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15, zdict=dictionary)
    return bytes([_V1]) + deflate.compress(data) + deflate.flush()


def _inflate(dictionary: bytes, data: bytes, what: str) -> bytes:
    if data[:1] != bytes([_V1]):
        raise ValueError(f"stored {what} in an unknown format (first byte {data[:1]!r})")
    inflate = zlib.decompressobj(-15, zdict=dictionary)
    text = inflate.decompress(data[1:]) + inflate.flush()
    if not inflate.eof:
        raise ValueError(f"stored {what} is truncated")
    return text


def _remember(stored: bytes, decision: Decision) -> None:
    if len(_known) >= _KNOWN_LIMIT:
        _known.clear()
    _known[stored] = decision
