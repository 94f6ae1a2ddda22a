"""The duplicate and conflict policy for `task_completions` (docs/specification.md §5.6):
one row per task generation; what a second attempt gets depends on what is stored."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class DuplicateVerdict(enum.Enum):
    # No row yet: insert this one.
    INSERT = "insert"
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
