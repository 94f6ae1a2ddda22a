"""The completion identity: every shipped vector recomputed twice (our RFC 8785
encoder and, independently, the `rfc8785` package + hashlib), and our encoder held
to RFC 8785 on random documents."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pathlib
import re

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from completion_service.core.gates import DECISION_SCHEMA
from completion_service.core.identity import (
    IDENTITY_SCHEMA,
    IdentityInput,
    canonical_json,
    completion_identity,
    identity_payload,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS_PATH = ROOT / "protos" / "funnel" / "completion" / "v1" / "identity_vectors.json"
VECTORS_FILE = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
VECTORS = VECTORS_FILE["vectors"]
INPUT_KEYS = {
    "schema",
    "workspace_id",
    "task_id",
    "generation",
    "state_version",
    "checkpoint",
    "outcome",
    "decision_schema",
}
MAX_SAFE = 2**53 - 1


def _identity_input(document: dict) -> IdentityInput:
    return IdentityInput(
        workspace_id=document["workspace_id"],
        task_id=document["task_id"],
        generation=document["generation"],
        state_version=document["state_version"],
        checkpoint=document["checkpoint"],
        outcome=document["outcome"],
        decision_schema=document["decision_schema"],
    )


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_recomputes_with_our_implementation(vector):
    document = vector["input"]
    assert set(document) == INPUT_KEYS
    assert document["schema"] == IDENTITY_SCHEMA
    identity_input = _identity_input(document)

    assert identity_input.document() == document
    assert identity_payload(identity_input) == vector["canonical_json"].encode("utf-8")
    assert identity_payload(identity_input).hex() == vector["canonical_json_utf8_hex"]
    assert completion_identity(identity_input) == vector["identity"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_recomputes_independently_with_rfc8785_and_hashlib(vector):
    encoded = rfc8785.dumps(vector["input"])
    assert encoded == vector["canonical_json"].encode("utf-8")
    assert encoded == bytes.fromhex(vector["canonical_json_utf8_hex"])
    assert "sha256:" + hashlib.sha256(encoded).hexdigest() == vector["identity"]


def test_vector_file_covers_what_other_languages_need():
    assert len(VECTORS) >= 12
    assert len({v["name"] for v in VECTORS}) == len(VECTORS)
    assert len({v["identity"] for v in VECTORS}) == len(VECTORS), "distinct inputs must give distinct identities"
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", v["identity"]) for v in VECTORS)
    assert VECTORS_FILE["schema"] == IDENTITY_SCHEMA
    description = " ".join(VECTORS_FILE["description"])
    for term in ("RFC 8785", "UTF-8", "SHA-256", "lowercase hex", "sha256:"):
        assert term in description

    inputs = [v["input"] for v in VECTORS]
    strings = [d[k] for d in inputs for k in ("workspace_id", "task_id", "checkpoint")]
    assert {d["outcome"] for d in inputs} == {"COMPLETED", "FAILED"}
    assert any(d["checkpoint"] == "" for d in inputs)
    assert any(d["generation"] == 1 for d in inputs)
    assert any(d["generation"] == MAX_SAFE for d in inputs)
    assert any(d["state_version"] == MAX_SAFE for d in inputs)
    assert any(any(0x80 <= ord(c) <= 0xFFFF for c in s) for s in strings), "BMP non-ASCII"
    assert any(any(ord(c) > 0xFFFF for c in s) for s in strings), "non-BMP (surrogate pairs in UTF-16)"
    assert any(any(0x4E00 <= ord(c) <= 0x9FFF for c in s) for s in strings), "CJK"
    for needs_escape in ('"', "\\", "\n", "\t", "\u0001", "\u0000"):
        assert any(needs_escape in s for s in strings), repr(needs_escape)
    assert all(d["decision_schema"] == DECISION_SCHEMA for d in inputs)


def test_vector_file_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location(
        "generate_identity_vectors", ROOT / "scripts" / "generate_identity_vectors.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert VECTORS_PATH.read_text(encoding="utf-8") == module.render()


def test_escapes_are_the_rfc8785_ones():
    assert canonical_json('"\\/\b\f\n\r\t\u0000\u0001\u001f\u007f\u2028é😀') == (
        '"\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f\u007f\u2028é😀"'.encode("utf-8")
    )


def test_every_field_changes_the_identity():
    base = IdentityInput("acme", "task-1", 1, 1, "cp-1", "COMPLETED", DECISION_SCHEMA)
    variants = [
        IdentityInput("acme2", "task-1", 1, 1, "cp-1", "COMPLETED", DECISION_SCHEMA),
        IdentityInput("acme", "task-2", 1, 1, "cp-1", "COMPLETED", DECISION_SCHEMA),
        IdentityInput("acme", "task-1", 2, 1, "cp-1", "COMPLETED", DECISION_SCHEMA),
        IdentityInput("acme", "task-1", 1, 2, "cp-1", "COMPLETED", DECISION_SCHEMA),
        IdentityInput("acme", "task-1", 1, 1, "cp-2", "COMPLETED", DECISION_SCHEMA),
        IdentityInput("acme", "task-1", 1, 1, "cp-1", "FAILED", DECISION_SCHEMA),
        IdentityInput("acme", "task-1", 1, 1, "cp-1", "COMPLETED", "funnel.completion.decision/v2"),
    ]
    identities = {completion_identity(v) for v in variants}
    assert len(identities) == len(variants)
    assert completion_identity(base) not in identities
    # Same input, same identity, however often it is computed.
    assert completion_identity(base) == completion_identity(
        IdentityInput(*[getattr(base, f) for f in base.__dataclass_fields__])
    )


# --- RFC 8785 on random documents -------------------------------------------------

SAFE_INTS = st.integers(min_value=-MAX_SAFE, max_value=MAX_SAFE)
SCALARS = st.none() | st.booleans() | SAFE_INTS | st.text()
DOCUMENTS = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS)
def test_canonical_json_equals_rfc8785_on_random_documents(document):
    assert canonical_json(document) == rfc8785.dumps(document)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, alphabet=st.characters(min_codepoint=0xD000, exclude_categories=("Cs",))),
        st.integers(0, 9),
        min_size=2,
        max_size=8,
    )
)
def test_member_order_follows_utf16_code_units_for_high_characters(document):
    assert canonical_json(document) == rfc8785.dumps(document)


def test_member_order_is_by_utf16_code_units_not_code_points():
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16, which sorts before U+E000,
    # although its code point is larger.
    document = {"\ue000": 1, "\U0001f600": 2, "a": 3}
    expected = '{"a":3,"\U0001f600":2,"\ue000":1}'.encode("utf-8")
    assert canonical_json(document) == expected
    assert rfc8785.dumps(document) == expected
    by_code_point = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    assert by_code_point != expected


@pytest.mark.parametrize("value", [MAX_SAFE, -MAX_SAFE, 0])
def test_safe_integers_are_encoded_exactly(value):
    assert canonical_json(value) == str(value).encode("ascii")
    assert canonical_json({"n": [value]}) == rfc8785.dumps({"n": [value]})


@pytest.mark.parametrize("value", [2**53, -(2**53), 2**63, {"nested": [2**53 + 1]}])
def test_integers_beyond_2_pow_53_are_refused(value):
    with pytest.raises(ValueError, match="outside the exactly representable range"):
        canonical_json(value)
    with pytest.raises(rfc8785.IntegerDomainError):
        rfc8785.dumps(value)


def test_identity_with_a_generation_beyond_2_pow_53_is_refused():
    with pytest.raises(ValueError):
        completion_identity(IdentityInput("acme", "task-1", 2**53, 1, "cp-1", "COMPLETED", DECISION_SCHEMA))


def test_booleans_are_not_integers():
    assert canonical_json([True, False, None, 1, 0]) == b"[true,false,null,1,0]"


@pytest.mark.parametrize("value", [1.5, b"bytes", {1: "non-string key"}.keys(), object()])
def test_values_outside_the_identity_domain_are_refused(value):
    with pytest.raises(TypeError):
        canonical_json(value)


@pytest.mark.parametrize("value", ["\ud800", ["ok", "\udfff"], {"\ud83d": 1}])
def test_lone_surrogates_are_refused(value):
    with pytest.raises(ValueError, match="surrogate"):
        canonical_json(value)
