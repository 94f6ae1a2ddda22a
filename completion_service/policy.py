"""Per-workspace gate policy, read from a TOML file at start-up.

[defaults]
required_evidence = []          # evidence kinds every COMPLETED outcome needs
disabled_gates = []             # built-in gate ids switched off
breaker_threshold = 3           # blocked repeats before the circuit breaker trips

[workspaces.acme]               # any key of [defaults], overriding it
required_evidence = ["tests"]

[[workspaces.acme.external_gates]]
id = "acme.review"              # shown in the trace
address = "127.0.0.1:7000"      # a CompletionGate server
timeout_ms = 500
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from completion_service.core.gates import BUILT_IN_GATES, MANDATORY_GATES, ExternalGate, WorkspacePolicy
from funnel.runtime.validation import id_problem

_KEYS = {"required_evidence", "disabled_gates", "breaker_threshold", "external_gates"}
_GATE_KEYS = {"id", "address", "timeout_ms"}


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class PolicyBook:
    defaults: WorkspacePolicy = WorkspacePolicy()
    workspaces: dict[str, WorkspacePolicy] = field(default_factory=dict)

    def for_workspace(self, workspace_id: str) -> WorkspacePolicy:
        return self.workspaces.get(workspace_id, self.defaults)

    def external_gates(self) -> list[ExternalGate]:
        """Every external gate any workspace's policy names."""
        return [gate for policy in (self.defaults, *self.workspaces.values()) for gate in policy.external_gates]


def load_policy(path: str | Path | None) -> PolicyBook:
    if path is None:
        return PolicyBook()
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from exc
    return parse_policy(raw, str(path))


def parse_policy(raw: dict[str, Any], origin: str = "policy") -> PolicyBook:
    unknown = set(raw) - {"defaults", "workspaces"}
    if unknown:
        raise PolicyError(f"{origin}: unknown sections {sorted(unknown)}")
    defaults = _workspace_policy(raw.get("defaults", {}), WorkspacePolicy(), f"{origin} [defaults]")
    sections = raw.get("workspaces", {})
    if not isinstance(sections, dict):
        raise PolicyError(f"{origin}: [workspaces] must be a table of workspace tables")
    workspaces = {}
    for workspace_id, section in sections.items():
        if id_problem(workspace_id) or not workspace_id:
            raise PolicyError(f"{origin}: workspace id {workspace_id!r} is not a valid id")
        workspaces[workspace_id] = _workspace_policy(section, defaults, f"{origin} [workspaces.{workspace_id}]")
    return PolicyBook(defaults, workspaces)


def _workspace_policy(section: object, base: WorkspacePolicy, where: str) -> WorkspacePolicy:
    if not isinstance(section, dict):
        raise PolicyError(f"{where}: expected a table")
    unknown = set(section) - _KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}")
    for key in ("required_evidence", "disabled_gates", "external_gates"):
        if key in section and not isinstance(section[key], list):
            raise PolicyError(f"{where}: {key} must be a list")
    known_gates = {gate.gate_id for gate in BUILT_IN_GATES}
    if not all(isinstance(g, str) for g in section.get("disabled_gates", ())):
        raise PolicyError(f"{where}: disabled_gates must be a list of gate ids")
    disabled = frozenset(section.get("disabled_gates", base.disabled_gates))
    if disabled - known_gates:
        raise PolicyError(f"{where}: unknown gates {sorted(disabled - known_gates)}")
    if disabled & MANDATORY_GATES:
        raise PolicyError(
            f"{where}: gates {sorted(disabled & MANDATORY_GATES)} guard safety rules and cannot be disabled"
        )
    evidence = tuple(section.get("required_evidence", base.required_evidence))
    for kind in evidence:
        if not isinstance(kind, str) or not kind or id_problem(kind):
            raise PolicyError(f"{where}: evidence kind {kind!r} is not a valid id")
    threshold = section.get("breaker_threshold", base.breaker_threshold)
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
        raise PolicyError(f"{where}: breaker_threshold must be a positive integer")
    external = base.external_gates
    if "external_gates" in section:
        external = tuple(_external_gate(g, where, known_gates) for g in section["external_gates"])
        ids = [g.gate_id for g in external]
        if len(set(ids)) != len(ids):
            raise PolicyError(f"{where}: external gate ids repeat")
    return WorkspacePolicy(disabled, evidence, threshold, external)


def _external_gate(raw: object, where: str, known_gates: set[str]) -> ExternalGate:
    if not isinstance(raw, dict) or set(raw) - _GATE_KEYS or not {"id", "address"} <= set(raw):
        raise PolicyError(f"{where}: an external gate needs `id` and `address` (and optionally `timeout_ms`)")
    gate_id, address, timeout = raw["id"], raw["address"], raw.get("timeout_ms", 1000)
    if not isinstance(gate_id, str) or not gate_id or id_problem(gate_id) or gate_id in known_gates:
        raise PolicyError(f"{where}: external gate id {gate_id!r} is invalid or taken by a built-in gate")
    if not isinstance(address, str) or not address:
        raise PolicyError(f"{where}: external gate {gate_id}: address must be host:port")
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 60_000:
        raise PolicyError(f"{where}: external gate {gate_id}: timeout_ms must be 1..60000")
    return ExternalGate(gate_id, address, timeout)
