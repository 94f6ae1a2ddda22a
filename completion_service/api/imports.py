"""A streamed transcript import: the file is validated line by line against the
grammar and staged in the database in bounded batches, and everything it holds
in memory between two messages is counted in its reservation of the import
buffer (funnel.runtime.budget), as the process really holds it:

* room for the next message, which gRPC receives whole (up to the message
  limit) before the handler sees any of it;
* the bytes of the file not yet split into lines: at most the last message and
  the partial line before it;
* the decoded events not yet staged, at their size as Python objects (a text of
  one character above U+FFFF costs four bytes per character, whatever its
  length on the wire), twice while the staging write turns them into rows;

and never less than room for a message and WORKING_BYTES.

Only one line at a time is decoded (the event loop runs one import at a time
between awaits), so its transient copies are not counted per import; the
document states them beside the buffer (docs/security.md, "Limits")."""

from __future__ import annotations

import sys

from completion_service.api.convert import session_event_from_proto
from completion_service.api.event_rules import check_event
from completion_service.api.jsonl import LineDamaged, LineSplitter, is_torn, parse_line
from completion_service.authority.transcripts import Transcripts
from completion_service.core import transcript as grammar
from completion_service.core.transcript import EventKind, Tail, Violation, grammar_rejection
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.budget import Reservation, Shortfall
from funnel.runtime.errors import ServiceError
from funnel.runtime.validation import Checker

# A staged batch is written out at this many events or decoded bytes, whichever
# comes first.
BATCH_EVENTS = 1000
BATCH_DECODED_BYTES = 256 * 1024
# Every import holds at least room for a message and this much more: what an
# import of ordinary lines (a partial one, a batch being staged) ever needs, so
# that only one with long lines or chunks has to grow its reservation. Imports
# admitted at their minimum can never leave each other without room to go on.
WORKING_BYTES = 1024 * 1024
# What a decoded event costs beyond its three strings: the object, its fields and
# its place in the batch (measured with tracemalloc: ~300 bytes).
EVENT_OVERHEAD_BYTES = 512


class OutOfBuffer(Exception):
    """The import needs more of the buffer than its scopes have left."""

    def __init__(self, shortfall: Shortfall) -> None:
        super().__init__(shortfall)
        self.shortfall = shortfall


def least_held_bytes(message_limit: int) -> int:
    """What an import holds at least: its reservation when it is admitted."""
    return message_limit + WORKING_BYTES


def decoded_bytes(event: grammar.SessionEvent) -> int:
    return EVENT_OVERHEAD_BYTES + sys.getsizeof(event.text) + sys.getsizeof(event.name) + sys.getsizeof(event.ref)


class StreamedImport:
    """One import in flight: its line splitter, the grammar's tail so far, the
    batch not yet staged, and its reservation, kept equal to what it holds."""

    def __init__(
        self,
        transcripts: Transcripts,
        import_id: str,
        reservation: Reservation,
        message_limit: int,
    ) -> None:
        self._transcripts = transcripts
        self.import_id = import_id
        self._reservation = reservation
        self._message_limit = message_limit
        self.splitter = LineSplitter()
        self.tail = Tail()
        self.checkpoints: dict[str, int] = {}
        self.count = 0
        self._generation = 0
        self._batch: list[grammar.SessionEvent] = []
        self._batch_bytes = 0

    def held_bytes(self) -> int:
        """What this import holds now, and room for the next message."""
        buffered = len(self.splitter.pending) + 2 * self._batch_bytes
        return max(least_held_bytes(self._message_limit), self._message_limit + buffered)

    def hold(self) -> None:
        """Holds held_bytes() in the reservation; OutOfBuffer when the budget lacks it."""
        shortfall = self._reservation.hold(self.held_bytes())
        if shortfall is not None:
            raise OutOfBuffer(shortfall)

    def feed(self, message: transcript_messages.ImportTranscriptRequest) -> None:
        """Takes a chunk's bytes out of its message (the caller drops the message:
        one copy of them lives on, counted as pending)."""
        self.splitter.feed(message.jsonl_chunk)

    async def take_lines(self) -> None:
        """Accepts each complete line fed so far and stages full batches; raises
        OutOfBuffer at the first the reservation cannot hold."""
        for number, raw in self.splitter.lines():
            full = self._accept(number, parse_line(raw, number))
            del raw  # not kept while the batch is written
            await self._held_while(full)
        self.hold()  # the partial line left, and room for the next message

    async def _held_while(self, full: bool) -> None:
        """Holds the batch as it is (its write is when it costs the most), then
        writes it out if it is full."""
        self.hold()
        if full:
            await self._flush()

    def _accept(self, number: int, message: completion_types.SessionEvent) -> bool:
        """Checks one line's event against the grammar and adds it to the batch;
        True when the batch is full."""
        checker = Checker()
        check_event(checker, f"line {number}", message, imported=True)
        if checker.violations:
            raise LineDamaged(number, checker.violations[0].description)
        event = session_event_from_proto(message)
        if event.sequence != self.tail.last_sequence + 1:
            raise LineDamaged(number, f"sequence {event.sequence}, expected {self.tail.last_sequence + 1}")
        if event.generation < self._generation:
            raise LineDamaged(number, f"generation {event.generation} after generation {self._generation}")
        following = grammar.validate(self.tail, [event], self.checkpoints)
        if isinstance(following, Violation):
            raise ServiceError(grammar_rejection(following, line=number))
        if event.kind is EventKind.CHECKPOINT:
            self.checkpoints.setdefault(event.ref, event.sequence)
        self.tail, self._generation = following, event.generation
        self._batch.append(event)
        self._batch_bytes += decoded_bytes(event)
        self.count += 1
        return len(self._batch) >= BATCH_EVENTS or self._batch_bytes >= BATCH_DECODED_BYTES

    async def _flush(self) -> None:
        if self._batch:
            await self._transcripts.stage_import(self.import_id, self._batch)
        self._batch = []
        self._batch_bytes = 0

    async def finish(self) -> list[str]:
        warnings = []
        last = self.splitter.final()
        if last is not None:
            number, raw = last
            try:
                message = parse_line(raw, number)
            except LineDamaged as torn:
                # A final line without its newline that opens a JSON object and
                # never closes it is a torn write; a complete event on it is checked
                # like any other line, and anything else on it is damage.
                if not is_torn(raw):
                    raise
                warnings.append(f"line {number} is torn ({torn.problem}); it was dropped")
            else:
                self._accept(number, message)
        await self._held_while(True)
        return warnings

    def close(self) -> None:
        """Drops what the import buffers. An ended call's frames can outlive it
        (a traceback, a cycle in gRPC's call state): they must not keep its bytes."""
        self.splitter.pending.clear()
        self._batch = []
        self._batch_bytes = 0
        self._reservation.release()
