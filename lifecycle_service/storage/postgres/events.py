"""Events on PostgreSQL: numbered from the writing transaction's id, above the
task's last, and read below the horizon by cursor; callers' numbers that a store
knows committed are not looked up again."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from funnel.auth.principal import Caller
from funnel.runtime.postgres import last_deliverable, task_number
from lifecycle_service.core.model import LifecycleEvent
from lifecycle_service.storage.postgres.session import PostgresSession
from lifecycle_service.storage.sqlite import rows
from lifecycle_service.storage.sqlite.events import SqliteEvents
from lifecycle_service.storage.sqlite.rows import EVENT_VALUES

# The number (see PostgresEvents.append) is computed in the INSERT: one round trip.
_INSERT_EVENT = (
    f"INSERT INTO lifecycle_events (sequence, {EVENT_VALUES}) "
    f"VALUES ({task_number('lifecycle_events')}, {', '.join(['?'] * 21)}) RETURNING sequence"
)


class PostgresEvents(SqliteEvents):
    def __init__(self, session: PostgresSession, callers: Mapping[Caller, int] | None = None) -> None:
        super().__init__(session)
        self._ordinal = 0  # events this transaction has numbered
        self._known_callers = callers or {}
        # The callers' numbers this transaction used: known committed once it is.
        self.callers_seen: dict[Caller, int] = {}

    def append(self, event: LifecycleEvent) -> LifecycleEvent:
        # Numbered in its INSERT (funnel.runtime.postgres.task_number): the task's row
        # is locked FOR UPDATE (or inserted) by this transaction.
        values = rows.event_values(self._s, event, self._caller_id(event.caller))
        (sequence,) = self._s.db.execute(
            _INSERT_EVENT, (self._ordinal, event.workspace_id, event.task_id, *values)
        ).fetchone()
        self._ordinal += 1
        return dataclasses.replace(event, sequence=sequence)

    def _caller_id(self, caller: Caller) -> int:
        known = self._known_callers.get(caller)
        if known is None:
            known = self.callers_seen[caller] = super()._caller_id(caller)
        return known

    def last_sequence(self) -> int:
        return last_deliverable(self._s.db, "lifecycle_events")
