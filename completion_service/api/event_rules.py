"""The field rules of a transcript event: appended ones leave the fields the
service assigns unset, imported ones carry them."""

from __future__ import annotations

from completion_service.core import transcript as grammar
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.validation import Checker

MAX_TEXT = 1024 * 1024
MAX_TOOL_NAME = 256


def check_event(checker: Checker, prefix: str, event: completion_types.SessionEvent, *, imported: bool) -> None:
    """Field rules of one event. Appended events leave the assigned fields unset;
    imported ones carry them."""
    body_name = event.WhichOneof("body")
    if body_name is None:
        checker.require(f"{prefix}.body", False)
        return
    body = getattr(event, body_name)
    for field, value in body.ListFields():
        path = f"{prefix}.{body_name}.{field.name}"
        if field.name.endswith("_id"):
            checker.identifier(path, value)
        elif field.name == "tool_name":
            checker.text(path, value, MAX_TOOL_NAME)
        elif field.type == field.TYPE_STRING:
            checker.text(path, value, MAX_TEXT)
    for id_field in ("turn_id", "step_id", "call_id", "checkpoint_id"):
        if id_field in body.DESCRIPTOR.fields_by_name and not getattr(body, id_field):
            checker.require(f"{prefix}.{body_name}.{id_field}", False)
    if body_name == "tool_call" and not body.tool_name:
        checker.require(f"{prefix}.tool_call.tool_name", False)
    if body_name == "turn_end":
        checker.enum(f"{prefix}.turn_end.reason", body.reason, [r.value for r in grammar.TurnEndReason])
    if imported:
        checker.integer(f"{prefix}.sequence", event.sequence, minimum=1)
        checker.integer(f"{prefix}.generation", event.generation, minimum=1)
    else:
        if event.sequence or event.generation or event.HasField("record_time"):
            checker.malformed(prefix, f"{prefix}: sequence, generation and record_time are assigned by the service")
        if event.synthetic:
            checker.malformed(f"{prefix}.synthetic", "only repair writes synthetic events")
