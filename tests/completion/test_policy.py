"""The per-workspace gate policy file: parsing, inheritance and every refusal."""

from __future__ import annotations

import pytest

from completion_service.core.gates import DEFAULT_BREAKER_THRESHOLD, MANDATORY_GATES, ExternalGate, WorkspacePolicy
from completion_service.policy import PolicyBook, PolicyError, load_policy, parse_policy

REVIEW = {"id": "acme.review", "address": "127.0.0.1:7000", "timeout_ms": 500}


def test_an_empty_policy_is_the_defaults():
    book = parse_policy({})
    assert book == PolicyBook()
    policy = book.for_workspace("anyone")
    assert policy == WorkspacePolicy()
    assert policy.required_evidence == ()
    assert policy.disabled_gates == frozenset()
    assert policy.breaker_threshold == DEFAULT_BREAKER_THRESHOLD == 3
    assert policy.external_gates == ()


def test_defaults_apply_to_every_workspace_without_a_section():
    book = parse_policy({"defaults": {"required_evidence": ["tests"], "breaker_threshold": 5}})
    assert book.for_workspace("beta") == WorkspacePolicy(required_evidence=("tests",), breaker_threshold=5)


def test_a_workspace_section_overrides_only_the_keys_it_names():
    book = parse_policy(
        {
            "defaults": {
                "required_evidence": ["tests"],
                "breaker_threshold": 5,
                "disabled_gates": ["result.non_empty"],
                "external_gates": [REVIEW],
            },
            "workspaces": {"acme": {"required_evidence": ["tests", "lint"]}, "beta": {"breaker_threshold": 2}},
        }
    )
    acme = book.for_workspace("acme")
    assert acme.required_evidence == ("tests", "lint")
    assert acme.breaker_threshold == 5
    assert acme.disabled_gates == frozenset({"result.non_empty"})
    assert acme.external_gates == (ExternalGate("acme.review", "127.0.0.1:7000", 500),)
    beta = book.for_workspace("beta")
    assert beta.required_evidence == ("tests",)
    assert beta.breaker_threshold == 2
    assert book.for_workspace("gamma") == book.defaults


def test_a_workspace_can_clear_inherited_lists():
    book = parse_policy(
        {
            "defaults": {
                "required_evidence": ["tests"],
                "disabled_gates": ["result.non_empty"],
                "external_gates": [REVIEW],
            },
            "workspaces": {"acme": {"required_evidence": [], "disabled_gates": [], "external_gates": []}},
        }
    )
    assert book.for_workspace("acme") == WorkspacePolicy()


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"gates": {}}, "unknown sections ['gates']"),
        ({"defaults": {"required_evidnce": ["tests"]}}, "[defaults]: unknown keys ['required_evidnce']"),
        ({"workspaces": {"acme": {"timeout": 3}}}, "[workspaces.acme]: unknown keys ['timeout']"),
        ({"defaults": ["tests"]}, "[defaults]: expected a table"),
        ({"workspaces": {"acme": "tests"}}, "[workspaces.acme]: expected a table"),
        ({"workspaces": {"my workspace": {}}}, "workspace id 'my workspace' is not a valid id"),
        ({"workspaces": {"": {}}}, "workspace id '' is not a valid id"),
        ({"workspaces": ["acme"]}, "[workspaces] must be a table"),
    ],
)
def test_unknown_or_malformed_sections_are_refused(raw, message):
    with pytest.raises(PolicyError) as caught:
        parse_policy(raw, "policy.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("policy.toml")


@pytest.mark.parametrize("entries", [["result.non_empty", 1], [["result.non_empty"]]])
def test_disabled_gates_must_be_gate_ids(entries):
    with pytest.raises(PolicyError, match="disabled_gates must be a list of gate ids"):
        parse_policy({"defaults": {"disabled_gates": entries}})


def test_unknown_gate_ids_cannot_be_disabled():
    with pytest.raises(PolicyError, match=r"unknown gates \['evidence.requried'\]"):
        parse_policy({"defaults": {"disabled_gates": ["evidence.required", "evidence.requried"]}})


@pytest.mark.parametrize("gate_id", sorted(MANDATORY_GATES))
def test_mandatory_gates_cannot_be_disabled(gate_id):
    with pytest.raises(PolicyError, match="guard safety rules and cannot be disabled"):
        parse_policy({"workspaces": {"acme": {"disabled_gates": [gate_id]}}})


@pytest.mark.parametrize(
    "gate_id",
    [
        "completion.circuit_breaker",
        "transcript.state_version_current",
        "transcript.no_open_work",
        "lifecycle.no_active_children",
        "evidence.required",
        "result.non_empty",
    ],
)
def test_other_built_in_gates_can_be_disabled(gate_id):
    assert parse_policy({"defaults": {"disabled_gates": [gate_id]}}).defaults.disabled_gates == frozenset({gate_id})


@pytest.mark.parametrize("kind", ["", "unit tests", "tests\n", 5, "cafe\u0301"])
def test_invalid_evidence_kinds_are_refused(kind):
    with pytest.raises(PolicyError, match=r"evidence kind .* is not a valid id"):
        parse_policy({"defaults": {"required_evidence": [kind]}})


@pytest.mark.parametrize(
    "key, value", [("required_evidence", "tests"), ("disabled_gates", "result.non_empty"), ("external_gates", REVIEW)]
)
def test_lists_must_be_lists(key, value):
    # A bare string is not a list of one: "tests" must not become kinds t, e, s.
    with pytest.raises(PolicyError, match=f"{key} must be"):
        parse_policy({"defaults": {key: value}})


@pytest.mark.parametrize("threshold", [0, -1, "3", 2.5, True])
def test_breaker_threshold_must_be_a_positive_integer(threshold):
    with pytest.raises(PolicyError, match="breaker_threshold must be a positive integer"):
        parse_policy({"defaults": {"breaker_threshold": threshold}})


@pytest.mark.parametrize("threshold", [1, 1000])
def test_breaker_threshold_accepts_positive_integers(threshold):
    assert parse_policy({"defaults": {"breaker_threshold": threshold}}).defaults.breaker_threshold == threshold


# --- external gates ----------------------------------------------------------------------


def test_external_gates_are_read_in_order_with_a_default_timeout():
    book = parse_policy(
        {"workspaces": {"acme": {"external_gates": [REVIEW, {"id": "acme.style", "address": "localhost:7001"}]}}}
    )
    assert book.for_workspace("acme").external_gates == (
        ExternalGate("acme.review", "127.0.0.1:7000", 500),
        ExternalGate("acme.style", "localhost:7001", 1000),
    )
    assert book.defaults.external_gates == ()


@pytest.mark.parametrize("timeout_ms", [1, 60_000])
def test_external_gate_timeout_bounds_are_inclusive(timeout_ms):
    book = parse_policy({"defaults": {"external_gates": [dict(REVIEW, timeout_ms=timeout_ms)]}})
    assert book.defaults.external_gates[0].timeout_ms == timeout_ms


@pytest.mark.parametrize(
    "gates, message",
    [
        ([{"id": "acme.review"}], "an external gate needs `id` and `address`"),
        ([{"address": "127.0.0.1:7000"}], "an external gate needs `id` and `address`"),
        ([dict(REVIEW, deadline=3)], "an external gate needs `id` and `address`"),
        (["acme.review"], "an external gate needs `id` and `address`"),
        ([REVIEW, dict(REVIEW, address="127.0.0.1:7001")], "external gate ids repeat"),
        ([dict(REVIEW, id="lease.live")], "external gate id 'lease.live' is invalid or taken by a built-in gate"),
        ([dict(REVIEW, id="evidence.required")], "taken by a built-in gate"),
        ([dict(REVIEW, id="acme review")], "external gate id 'acme review' is invalid"),
        ([dict(REVIEW, id="")], "is invalid"),
        ([dict(REVIEW, address="")], "external gate acme.review: address must be host:port"),
        ([dict(REVIEW, address=7000)], "address must be host:port"),
        ([dict(REVIEW, timeout_ms=0)], "timeout_ms must be 1..60000"),
        ([dict(REVIEW, timeout_ms=60_001)], "timeout_ms must be 1..60000"),
        ([dict(REVIEW, timeout_ms=-5)], "timeout_ms must be 1..60000"),
        ([dict(REVIEW, timeout_ms="500")], "timeout_ms must be 1..60000"),
        ([dict(REVIEW, timeout_ms=True)], "timeout_ms must be 1..60000"),
    ],
)
def test_invalid_external_gates_are_refused(gates, message):
    with pytest.raises(PolicyError) as caught:
        parse_policy({"workspaces": {"acme": {"external_gates": gates}}})
    assert message in str(caught.value)
    assert "[workspaces.acme]" in str(caught.value)


# --- load_policy ----------------------------------------------------------------------------

POLICY_TOML = """
[defaults]
required_evidence = ["tests"]
breaker_threshold = 4

[workspaces.acme]
disabled_gates = ["result.non_empty"]

[[workspaces.acme.external_gates]]
id = "acme.review"
address = "127.0.0.1:7000"
timeout_ms = 250
"""


def test_load_policy_reads_a_toml_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML, encoding="utf-8")
    book = load_policy(path)
    assert book.defaults == WorkspacePolicy(required_evidence=("tests",), breaker_threshold=4)
    assert book.for_workspace("acme") == WorkspacePolicy(
        disabled_gates=frozenset({"result.non_empty"}),
        required_evidence=("tests",),
        breaker_threshold=4,
        external_gates=(ExternalGate("acme.review", "127.0.0.1:7000", 250),),
    )
    assert load_policy(str(path)) == book


def test_load_policy_without_a_file_is_the_defaults():
    assert load_policy(None) == PolicyBook()


def test_load_policy_on_a_missing_file_fails(tmp_path):
    path = tmp_path / "missing.toml"
    with pytest.raises(PolicyError, match=f"cannot read policy file {path}"):
        load_policy(path)


def test_load_policy_on_invalid_toml_fails(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[defaults\nrequired_evidence = [", encoding="utf-8")
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(path)


def test_load_policy_names_the_file_in_content_errors(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[defaults]\ndisabled_gates = ["lease.live"]\n', encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path} [defaults]: ")
