"""The duplicate and conflict policy for `task_completions` (docs/specification.md §5.6):
one row per task generation; what a second attempt gets depends on what is stored."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from completion_service.core.model import CompletionRecord
from completion_service.core.settlement import supersedable


class DuplicateVerdict(enum.Enum):
    # No row yet: insert this one.
    INSERT = "insert"
    # The stored row was refused for a reason that has passed: this attempt replaces it.
    REPLACE = "replace"
    # Same identity and payload: the stored row is this attempt's (idempotent).
    SAME = "same"
    # Different identity, same outcome: the stored row stays the completion.
    KEEP_EXISTING = "keep_existing"
    # Different outcome: fail closed.
    CONFLICT = "conflict"
    # Same identity, different payload: corruption or a digest collision.
    CORRUPTED = "corrupted"


@dataclass(frozen=True)
class CompletionKey:
    identity: str
    payload: bytes
    outcome: str


def judge_duplicate(stored: CompletionKey | None, attempt: CompletionKey) -> DuplicateVerdict:
    if stored is None:
        return DuplicateVerdict.INSERT
    if stored.identity == attempt.identity:
        return DuplicateVerdict.SAME if stored.payload == attempt.payload else DuplicateVerdict.CORRUPTED
    if stored.outcome == attempt.outcome:
        return DuplicateVerdict.KEEP_EXISTING
    return DuplicateVerdict.CONFLICT


def place_completion(stored: CompletionRecord | None, attempt: CompletionKey) -> DuplicateVerdict:
    """Where an allowed attempt's completion goes, given the generation's stored row:
    a row whose settlement was refused for a transient reason is replaced (as if
    absent, but its row is deleted first); otherwise judge_duplicate decides."""
    if stored is not None and supersedable(stored):
        return DuplicateVerdict.REPLACE
    return judge_duplicate(
        CompletionKey(stored.identity, stored.payload, stored.outcome.name) if stored else None, attempt
    )
