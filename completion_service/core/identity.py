"""The completion identity (docs/specification.md §5.5): SHA-256 over the RFC 8785 (JCS)
canonical JSON of a fixed, schema-versioned document. Never protobuf bytes: other
languages must be able to recompute it (see identity_vectors.json next to the protos).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from json.encoder import encode_basestring

IDENTITY_SCHEMA = "funnel.completion.identity/v1"
_MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True)
class IdentityInput:
    workspace_id: str
    task_id: str
    generation: int
    state_version: int
    checkpoint: str
    outcome: str
    decision_schema: str

    def document(self) -> dict[str, object]:
        return {
            "schema": IDENTITY_SCHEMA,
            "workspace_id": self.workspace_id,
            "task_id": self.task_id,
            "generation": self.generation,
            "state_version": self.state_version,
            "checkpoint": self.checkpoint,
            "outcome": self.outcome,
            "decision_schema": self.decision_schema,
        }


def canonical_json(value: object) -> bytes:
    """RFC 8785 serialization for the JSON values the identity uses: objects,
    arrays, strings, booleans, null and integers within ±(2^53 - 1)."""
    return _encode(value).encode("utf-8")


def _encode(value: object) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > _MAX_SAFE_INTEGER:
            raise ValueError(f"integer {value} is outside the exactly representable range of RFC 8785")
        return str(value)
    if isinstance(value, str):
        return _encode_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(item) for item in value) + "]"
    if isinstance(value, dict):
        # RFC 8785 §3.2.3: members sorted by the UTF-16 code units of their names.
        members = sorted(value.items(), key=lambda item: item[0].encode("utf-16-be"))
        return "{" + ",".join(_encode_string(k) + ":" + _encode(v) for k, v in members) + "}"
    raise TypeError(f"{type(value).__name__} has no canonical JSON form here")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _encode_string(text: str) -> str:
    # RFC 8785 §3.2.2.2 escapes exactly what ECMAScript's JSON.stringify does: `"`, `\\`,
    # the short forms \b \f \n \r \t, other controls below U+0020 as lowercase \u00xx,
    # everything else as itself; `json`'s C encoder without ensure_ascii does just that,
    # without a Python step per character (this runs on every attempt).
    if not text.isascii() and _LONE_SURROGATE.search(text):
        raise ValueError("lone surrogates have no canonical JSON form")
    return encode_basestring(text)


def identity_payload(identity_input: IdentityInput) -> bytes:
    """The canonical document: stored with the completion row as its payload."""
    return canonical_json(identity_input.document())


def completion_identity(identity_input: IdentityInput) -> str:
    return payload_identity(identity_payload(identity_input))


def payload_identity(payload: bytes) -> str:
    """The identity of a canonical document already rendered by `identity_payload`."""
    return "sha256:" + hashlib.sha256(payload).hexdigest()
