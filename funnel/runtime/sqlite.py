"""SQLite as docs/specification.md §2.8 wants it: WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` for
read-then-write transactions, versioned migrations applied at start, and a refusal
to start when any of that cannot be had.

Start-up checks only what costs the same at any size (the header, the pragmas, the
schema version, the first and last row of every table); the full integrity check,
which reads the whole file, runs after the service serves (`Database.check_integrity`),
and once it finds damage the database refuses every write.

A transaction is one plain function over a `sqlite3.Connection`, run on the
connection's own thread in a single hop: aiosqlite would otherwise cost one thread
hop per statement, which dominates the cost of a small transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aiosqlite

from funnel.runtime import calls
from funnel.runtime.storage_errors import StorageRefused, StorageUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
# Told of each committed group: (seconds on the database thread, writes in it).
CommitObserver = Callable[[float, int], None]

MEMORY = ":memory:"
# Per connection, in KiB (negative: a size, not a page count): room for the hot
# index pages of a few million tasks instead of SQLite's default 2 MB, filled
# only as pages are touched.
CACHE_SIZE = -32768
CHECKPOINT_INTERVAL = 1.0
# How long a write without a caller deadline (background work, callers that set
# none) waits for the database lock before it fails with StorageUnavailable.
DEFAULT_LOCK_WAIT = 5.0
LOCKED_PAST_THE_DEADLINE = "the database stayed locked until the caller's deadline; nothing was applied"
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations_in(package: str) -> list[Migration]:
    """The package's `NNNN_name.sql` files, in version order, numbered 1, 2, 3…"""
    found = []
    for entry in importlib.resources.files(package).iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise StorageRefused(f"migrations in {package} are not numbered 1..{len(found)}")
    return found


class Database:
    """One SQLite connection with its own thread, and one owner task for the work
    it does by itself: the writer (handing the thread groups of writes) and, on a
    reader, the checkpointer. The owner ends when close() has had every write
    given so far answered, or when it is cancelled (the event loop going away:
    the writer then answers or fails what it holds first), and closes the
    connection last: nothing of a database runs unowned or outlives it."""

    def __init__(
        self,
        connection: aiosqlite.Connection,
        path: str,
        commits: CommitObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = connection
        self.path = path
        self._commits = commits
        # The database thread's clock, for lock deadlines (see write()); the simulator
        # gives one that follows its virtual time.
        self._clock = clock
        # Writes waiting for a group. The event loop appends, the database thread
        # takes (the writer pipeline, _commit_groups), hence the lock.
        self._pending: list[_Write[Any]] = []
        self._pending_lock = threading.Lock()
        self._wakeup = asyncio.Event()  # writes wait, or close() was called
        self._closing = False  # set by close(): later writes fail at once
        # Started by open() and open_reader(); a Database made for one read (the
        # integrity check's) has none and is closed by its maker.
        self._owner: asyncio.Task[None] | None = None
        # Set once the integrity check, or a write, met damage: every later write is refused.
        self._damage: str | None = None

    @classmethod
    async def open(
        cls,
        path: str,
        migrations: list[Migration],
        *,
        busy_timeout_ms: int = 5000,
        commits: CommitObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Database:
        """Opens (creating if needed) and prepares the database, or raises StorageRefused.
        Only checks whose cost does not grow with the file run here (see _prepare).
        `commits` is told of each committed group (the commit metrics); `clock` is the
        one the database thread judges lock deadlines on (any steady clock: a write's
        deadline is handed over as the time it has left)."""
        try:
            connection = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise StorageRefused(f"cannot open database {path!r}: {exc}") from exc
        database = cls(connection, path, commits, clock)
        try:
            await database.run(lambda db: _prepare(db, path, migrations, busy_timeout_ms))
        except BaseException:
            await _close_connection(connection)
            raise
        database._start(checkpoints=False)
        return database

    @classmethod
    async def open_reader(cls, writer: Database, *, busy_timeout_ms: int = 5000) -> Database:
        """A second, read-only connection for reads that must not queue behind writes.
        An in-memory database has no second connection: the writer serves reads."""
        if writer.path == MEMORY:
            return writer
        connection = await aiosqlite.connect(writer.path, isolation_level=None)
        reader = cls(connection, writer.path, clock=writer._clock)

        def configure(db: sqlite3.Connection) -> None:
            db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            db.execute(f"PRAGMA cache_size={CACHE_SIZE}")
            db.execute("PRAGMA query_only=ON")

        try:
            await reader.run(configure)
        except BaseException:
            await _close_connection(connection)
            raise
        # Checkpoints move off the commit path: the writer never runs one, the
        # reader's thread copies the WAL back into the database in the background.
        await writer.run(lambda db: db.execute("PRAGMA wal_autocheckpoint=0"))
        reader._start(checkpoints=True)
        return reader

    def _start(self, *, checkpoints: bool) -> None:
        self._owner = asyncio.create_task(self._own(checkpoints), name=f"sqlite:{self.path}")

    async def _own(self, checkpoints: bool) -> None:
        """The owner: a writer's runs the writer until close(); a reader's (never
        given writes) runs the checkpointer until close(). The connection is
        closed last, however the owner ends."""
        loop = asyncio.get_running_loop()
        try:
            if checkpoints:
                async with asyncio.TaskGroup() as group:
                    checkpointer = group.create_task(self._checkpoint_forever(), name=f"sqlite-checkpoint:{self.path}")
                    while not self._closing:
                        await self._wakeup.wait()
                        self._wakeup.clear()
                    checkpointer.cancel()
            else:
                await self._write_until_closed()
        finally:
            # Unless its event loop was closed with the owner pending: then it is only
            # being finalized (by the garbage collector, maybe while another loop runs),
            # and nothing can be awaited (its maker closes the thread).
            if _running(loop):
                await _close_connection(self._connection)

    async def _checkpoint_forever(self, interval: float = CHECKPOINT_INTERVAL) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run(lambda db: db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())
            except (StorageUnavailable, sqlite3.Error) as exc:  # tried again at the next interval
                log.warning("WAL checkpoint of %s postponed: %s", self.path, exc)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs fn on the connection's thread. sqlite3 operational faults become StorageUnavailable."""
        connection = self._connection
        if not connection._running or connection._connection is None:
            raise StorageUnavailable(f"database {self.path!r} is closed; nothing was applied")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        # aiosqlite has no public "run this callable on your thread"; its queue is that
        # primitive (pinned range in pyproject.toml, covered by the storage tests). Not
        # through aiosqlite's own answer, which raises on the thread, and so ends it for
        # every later operation, when the event loop closed while fn ran: _post does not.
        connection._tx.put_nowait((None, functools.partial(_answer, connection._conn, fn, loop, future)))
        try:
            return await future
        except sqlite3.OperationalError as exc:
            raise operational_fault(exc) from exc

    async def write(self, fn: Callable[[sqlite3.Connection], T], after_commit: Callable[[T], None] | None = None) -> T:
        """Runs fn in a write transaction and returns its result once committed.

        Group commit: writes that arrive while a transaction is on the database
        thread are committed together in the next one (one fsync), each inside its
        own savepoint, so a write that raises is rolled back alone and its caller
        gets the exception. after_commit runs on the event loop after the commit,
        in commit order, before any later write is acknowledged. Once queued, a
        write commits and publishes even if its caller is cancelled (deadline,
        disconnect), so nothing committed goes unpublished.

        A write waits for the database lock (held by another process: a backup,
        an operator's shell) at most DEFAULT_LOCK_WAIT, and no longer than the
        RPC's deadline allows (see funnel.runtime.calls); then it fails with
        StorageUnavailable and nothing of it is applied. Once the integrity check
        found damage, every write fails at once with StorageUnavailable."""
        if self._damage is not None:
            raise StorageUnavailable(self._damage)
        if self._closing or self._owner is None or self._owner.done():
            raise StorageUnavailable(f"database {self.path!r} is closed; nothing was applied")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        future.add_done_callback(_consume_exception)
        # The caller's deadline is on the event loop's clock; the database thread judges
        # it on this database's clock, never the loop's (uvloop's time() is cached, stale
        # while the loop idles): converted once, here, as the time the write has left.
        now = loop.time()
        left = min(calls.lock_deadline() or float("inf"), now + DEFAULT_LOCK_WAIT) - now
        with self._pending_lock:
            self._pending.append(_Write(fn, after_commit, future, self._clock() + left))
        self._wakeup.set()
        return await asyncio.shield(future)

    async def _write_until_closed(self) -> None:
        """The writer: writes pending whenever woken, until close() was called
        and every write given before it is answered. However it ends, no write
        is left waiting: cancelled (the event loop going away), it lets the turn
        on the database thread finish and fails the writes not yet taken, and
        from then on every write fails at once."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                await self._write_pending()
                if self._closing and not self._has_pending():
                    return
        except BaseException:
            self._closing = True
            if _running(loop):  # else the loop closed with the writer pending: nobody is left to answer
                self._refuse_pending(
                    StorageUnavailable(f"the writer of {self.path!r} was stopped; nothing was applied")
                )
            raise

    async def _write_pending(self) -> None:
        """Hands the database thread turns of groups (_commit_groups) while writes
        are pending; committed groups are answered by the database thread's posts."""
        loop = asyncio.get_running_loop()
        while self._has_pending():
            if self._damage is not None:  # found while these waited: none of them is applied
                self._refuse_pending(StorageUnavailable(self._damage))
                return
            turn: asyncio.Future[None] = loop.create_future()
            connection = self._connection
            # On aiosqlite's own queue (see run()), without a future of its own: the
            # turn answers through _post alone, which survives a closed event loop.
            connection._tx.put_nowait((None, functools.partial(self._commit_groups, connection._conn, loop, turn)))
            try:
                await asyncio.shield(turn)
            except asyncio.CancelledError:
                await _finished(turn)
                raise
            except Exception as exc:  # noqa: BLE001 - the turn failed outside any group (a defect)
                log.error("the writer's turn on %s failed: %r", self.path, exc)
                self._refuse_pending(StorageUnavailable(f"the writer of {self.path!r} failed: {exc!r}"))

    def _has_pending(self) -> bool:
        with self._pending_lock:
            return bool(self._pending)

    def _refuse_pending(self, failure: Exception) -> None:
        """Fails every write not yet taken, unapplied."""
        with self._pending_lock:
            refused, self._pending = self._pending, []
        for write in refused:
            if not write.future.done():
                write.future.set_exception(failure)

    def _commit_groups(
        self, db: sqlite3.Connection, loop: asyncio.AbstractEventLoop, turn: asyncio.Future[None]
    ) -> None:
        """On the database thread: commits groups of pending writes back to back,
        each answered on the event loop as soon as it has committed, so the next
        group starts right after the previous COMMIT instead of waiting for the
        event loop to take the answer and hand the next group over. Stops when no
        write is pending, after a failed group or damage (the event loop deals with
        them first), after PIPELINE_GROUPS groups (so that other work queued for
        this thread, health probes and reads of an in-memory database, gets its
        turn), or once the event loop is closed (nobody is left to answer). `turn`
        is set when it stops, whatever happened."""
        try:
            for _ in range(PIPELINE_GROUPS):
                if self._damage is not None:
                    return
                with self._pending_lock:
                    batch, self._pending = self._pending[:MAX_GROUP], self._pending[MAX_GROUP:]
                if not batch:
                    return
                now = self._clock()
                expired = [w for w in batch if w.deadline <= now]
                if expired:
                    if not _post(loop, _expire, expired):
                        return
                    batch = [w for w in batch if w.deadline > now]
                    if not batch:
                        continue
                # In slices: between two, writes that came meanwhile join the batch and
                # those past their deadline fail, so that no write waits on the lock
                # for longer than its own deadline because a group ahead of it (a
                # background write without a caller) may wait longer.
                wait_ms = max(1, min(LOCK_WAIT_SLICE_MS, int((min(w.deadline for w in batch) - now) * 1000)))
                started = time.perf_counter()
                try:
                    outcomes = _commit_group(db, [w.fn for w in batch], wait_ms)
                except _LockBusy:
                    # Nothing was applied: the writes try again, in order, while they have time.
                    with self._pending_lock:
                        self._pending[:0] = batch
                    continue
                except BaseException as exc:  # noqa: BLE001 - the commit itself failed: nothing of the group applied
                    _post(loop, self._failed, batch, exc)
                    return
                if not _post(loop, self._committed, batch, outcomes, time.perf_counter() - started):
                    return
                if any(isinstance(error, sqlite3.DatabaseError) and _is_damage(error) for _, error in outcomes):
                    return
        except BaseException as exc:  # noqa: BLE001 - told to the writer, which fails what is left
            _post(loop, _resolve, turn, None, exc)
        finally:
            _post(loop, _resolve, turn, None, None)

    def _committed(
        self, batch: list[_Write[Any]], outcomes: list[tuple[object, Exception | None]], seconds: float
    ) -> None:
        """On the event loop, in commit order: answers a committed group's writes."""
        if self._commits is not None:
            try:
                self._commits(seconds, len(batch))
            except Exception:  # a metric must not leave the group's callers unanswered
                log.exception("commit observer failed")
        for write, (value, error) in zip(batch, outcomes, strict=True):
            if error is not None:
                if isinstance(error, sqlite3.OperationalError):
                    error = operational_fault(error)
                write.future.set_exception(self._damaged_by(error) or error)
                continue
            if write.after_commit is not None:
                try:
                    write.after_commit(value)
                except Exception:  # publishing must not undo an acknowledged commit
                    log.exception("after-commit hook failed")
            write.future.set_result(value)

    def _failed(self, batch: list[_Write[Any]], exc: BaseException) -> None:
        """On the event loop: a group whose commit failed, nothing of it applied."""
        if isinstance(exc, sqlite3.OperationalError):
            exc = operational_fault(exc)
        failure = self._damaged_by(exc) or exc
        for write in batch:
            write.future.set_exception(failure if isinstance(failure, Exception) else StorageUnavailable(repr(failure)))

    def _damaged_by(self, exc: BaseException) -> StorageUnavailable | None:
        """A write that met a damaged page (SQLite checks every page it reads) marks
        the database damaged, as the integrity check would: later writes are refused
        and health turns NOT_SERVING, rather than writes going on around the damage."""
        if not (isinstance(exc, sqlite3.DatabaseError) and _is_damage(exc)):
            return None
        if self._damage is None:
            self._damage = (
                f"database {self.path!r} is damaged ({exc}), writes are refused; restore the file from a backup"
            )
            log.error("a write met damage, refusing writes from now on: %s", self._damage)
        return StorageUnavailable(self._damage)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs fn in a read transaction: a consistent snapshot across its statements."""
        return await self.run(lambda db: in_read_transaction(db, fn))

    async def check_writable(self) -> None:
        """The health probe: raises StorageUnavailable when no write could commit now,
        including once the integrity check found damage (health turns NOT_SERVING)."""
        if self._damage is not None:
            raise StorageUnavailable(self._damage)
        await self.run(probe_writable)

    async def check_integrity(self) -> str | None:
        """The full `PRAGMA integrity_check`, which reads every page: None when the
        file is sound, else a summary of the damage, and from then on every write is
        refused. It runs on a read-only connection and thread of its own, lowered in
        priority, over one WAL snapshot, so writers and readers go on beside it.
        Raises StorageUnavailable when the check itself could not run (nothing is
        known then). An in-memory database has no file to check."""
        if self.path == MEMORY:
            return None
        opening = asyncio.ensure_future(aiosqlite.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None))
        try:
            connection = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The service stops just after it started: the connection's thread opens the
            # file anyway and then answers this event loop. Wait for that answer (and
            # close what it opened), or it may reach a loop that is closed by then.
            with contextlib.suppress(sqlite3.Error):
                await _close_connection(await opening)
            raise
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"cannot open {self.path!r} for its integrity check: {exc}") from exc
        try:
            problems = await Database(connection, self.path).run(_integrity_problems)
        except asyncio.CancelledError:
            # The service stops: end the check on its thread now, or closing would wait
            # for the whole file to be read. integrity_check is one virtual-machine step
            # (no progress handler runs inside it); SQLite's interrupt, meant to be
            # called from another thread, stops it at once.
            await connection.interrupt()
            raise
        finally:
            await _close_connection(connection)
        if not problems:
            return None
        self._damage = f"database {self.path!r} failed its integrity check, writes are refused: {_summary(problems)}"
        return self._damage

    async def close(self) -> None:
        """Answers every write given so far (the writer drains them), then closes
        the connection; later writes fail at once. Every caller waits for the one
        closing, which the owner does: a caller cancelled meanwhile leaves it to
        finish."""
        self._closing = True
        self._wakeup.set()
        if self._owner is None:  # made for one read: nothing of its own runs
            await _close_connection(self._connection)
        else:
            await asyncio.wait({self._owner})


class SqliteEngine:
    """A database file as a store's engine (funnel.runtime.store): writes on the
    writer's connection (group commit), reads on a read-only one of their own, so
    that reads never queue behind writes."""

    def __init__(self, writer: Database, reader: Database) -> None:
        self._writer = writer
        self._reader = reader

    @classmethod
    async def open(
        cls,
        path: str,
        migrations: list[Migration],
        *,
        commits: CommitObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> SqliteEngine:
        """Opens (creating and migrating if needed) the database, or raises StorageRefused."""
        writer = await Database.open(path, migrations, commits=commits, clock=clock)
        return cls(writer, await Database.open_reader(writer))

    async def write(self, fn: Callable[[sqlite3.Connection], T], after_commit: Callable[[T], None] | None = None) -> T:
        return await self._writer.write(fn, after_commit)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._reader.read(fn)

    async def check_writable(self) -> None:
        await self._writer.check_writable()

    async def check_integrity(self) -> str | None:
        """The full integrity check (Database.check_integrity): None, or the damage,
        after which every write is refused."""
        return await self._writer.check_integrity()

    async def close(self) -> None:
        if self._reader is not self._writer:
            await self._reader.close()
        await self._writer.close()


# Large enough to amortize one fsync over a burst, small enough to bound the
# latency of the first write in the group.
MAX_GROUP = 64
# Groups the database thread commits back to back before it lets other work
# queued for it run (see Database._commit_groups).
PIPELINE_GROUPS = 8
# How long one BEGIN IMMEDIATE waits for a lock another connection holds before
# the writer looks again at what is pending (Database._commit_groups).
LOCK_WAIT_SLICE_MS = 100


@dataclass
class _Write(Generic[T]):
    fn: Callable[[sqlite3.Connection], T]
    after_commit: Callable[[T], None] | None
    future: asyncio.Future[T]
    # The database's clock (Database._clock) after which it no longer waits for the lock.
    deadline: float


class _LockBusy(Exception):
    """BEGIN IMMEDIATE did not get the write lock in time; nothing was applied."""


def _expire(writes: list[_Write[Any]]) -> None:
    """On the event loop: writes whose lock deadline passed before their group began fail, unapplied."""
    for write in writes:
        if not write.future.done():
            write.future.set_exception(StorageUnavailable(LOCKED_PAST_THE_DEADLINE))


def operational_fault(exc: sqlite3.OperationalError) -> StorageUnavailable:
    """What an operational fault of the database (locked, disk full, I/O error,
    read-only) is to the services: nothing was applied, the caller may retry."""
    return StorageUnavailable(str(exc))


def _running(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` runs this code: not when a coroutine of a closed loop is finalized,
    even while another loop runs (the garbage collector finalizes it anywhere)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> bool:
    """Runs `callback(*args)` on `loop` soon, from the database thread; False once the
    loop is closed (then nobody is left to answer, and the thread must go on: an
    exception here would end aiosqlite's thread for every later operation)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        return False
    return True


def _answer(
    db: sqlite3.Connection,
    fn: Callable[[sqlite3.Connection], T],
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
) -> None:
    """On the database thread: runs fn and posts its outcome to `future`'s loop."""
    try:
        result = fn(db)
    except BaseException as exc:  # noqa: BLE001 - the caller gets it, as from aiosqlite
        _post(loop, _resolve, future, None, exc)
    else:
        _post(loop, _resolve, future, result, None)


def _resolve(future: asyncio.Future[Any], result: Any, failure: BaseException | None) -> None:
    if future.done():  # its caller was cancelled
        return
    if failure is None:
        future.set_result(result)
    else:
        future.set_exception(failure)


async def _close_connection(connection: aiosqlite.Connection) -> None:
    """Closes `connection` and waits for its thread's answers, however often the
    task is cancelled meanwhile (and then ends cancelled). aiosqlite answers a close,
    and the stop of its thread after it, on this event loop: a task that stopped
    waiting for them let the loop close first, and the thread, answering a closed
    loop, died with "Event loop is closed" (traced in a loaded run to an integrity
    check cancelled twice while it closed its connection)."""
    closing = asyncio.ensure_future(connection.close())
    cancelled = False
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    closing.result()


async def _finished(turn: asyncio.Future[None]) -> None:
    """Waits for the database thread's turn to end, cancelled or not: its groups
    commit and are answered whatever happens to the task that handed them over."""
    while not turn.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(turn)


def _consume_exception(future: asyncio.Future[Any]) -> None:
    # A cancelled caller never awaits its write; its outcome is still logged by
    # the service, so do not let asyncio report it as "never retrieved".
    if not future.cancelled():
        future.exception()


def _commit_group(
    db: sqlite3.Connection, fns: list[Callable[[sqlite3.Connection], object]], wait_ms: int
) -> list[tuple[object, Exception | None]]:
    """One BEGIN IMMEDIATE … COMMIT around several writes, each in a savepoint:
    [(result, None) | (None, exception)] in order. Waits at most `wait_ms` for
    the write lock (raises _LockBusy)."""
    outcomes: list[tuple[object, Exception | None]] = []
    db.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise _LockBusy(str(exc)) from None
        raise
    try:
        for fn in fns:
            db.execute("SAVEPOINT write")
            try:
                outcomes.append((fn(db), None))
            except Exception as exc:  # noqa: BLE001 - this write alone is undone and reported to its caller
                db.execute("ROLLBACK TO write")
                outcomes.append((None, exc))
            db.execute("RELEASE write")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return outcomes


def in_read_transaction(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    if db.in_transaction:
        return fn(db)
    db.execute("BEGIN")
    try:
        return fn(db)
    finally:
        db.execute("ROLLBACK")


def _summary(problems: list[str], shown: int = 3) -> str:
    """The first few problems integrity_check found (one row may hold many lines),
    so that the refusal stays readable; restoring a backup is the way out."""
    lines = [line.strip() for row in problems for line in row.splitlines()]
    lines = [line for line in lines if line and not line.startswith("*** in database")]
    more = f" (and {len(lines) - shown} more)" if len(lines) > shown else ""
    return "; ".join(lines[:shown]) + more + "; restore the file from a backup"


# The integrity check's thread yields the CPU to the service's own threads.
_INTEGRITY_NICENESS = 10


def _integrity_problems(db: sqlite3.Connection) -> list[str]:
    """The problems `PRAGMA integrity_check` lists ([] when the file is sound), or
    the error SQLite stopped at when the damage is too deep to list. Runs on the
    check's own thread (aiosqlite's, one per connection, ended when it closes), so
    lowering that thread's priority leaves every other thread as it was."""
    with contextlib.suppress(AttributeError, OSError):  # Linux: a thread has its own nice value
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _INTEGRITY_NICENESS)
    try:
        rows = db.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as exc:
        if not _is_damage(exc):
            raise  # interrupted, I/O error…: the check did not run, nothing is known
        return [str(exc)]
    problems = [row[0] for row in rows]
    return [] if problems == ["ok"] else problems


def _is_damage(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _table_edges(db: sqlite3.Connection) -> list[tuple[str, str]]:
    """(table, query) reading the first and the last row of each table: one path
    from the root page to a leaf at each end of its b-tree, whatever its size
    (in key order, LIMIT 1 stops at the first row; tests/reliability/test_durability.py
    checks that no query needs a sort, which would read them all)."""
    queries = []
    for _, name, kind, _, without_rowid, _ in db.execute("PRAGMA main.table_list").fetchall():
        if kind != "table" or name.startswith("sqlite_"):
            continue
        quoted = '"' + name.replace('"', '""') + '"'
        if without_rowid:
            columns = sorted((pk, column) for _, column, _, _, _, pk in db.execute(f"PRAGMA table_info({quoted})"))
            key = ['"' + column.replace('"', '""') + '"' for pk, column in columns if pk]
        else:
            key = ["rowid"]
        for direction in ("ASC", "DESC"):
            order = ", ".join(f"{column} {direction}" for column in key)
            queries.append((name, f"SELECT * FROM {quoted} ORDER BY {order} LIMIT 1"))
    return queries


def _prepare(db: sqlite3.Connection, path: str, migrations: list[Migration], busy_timeout_ms: int) -> None:
    """Checks, in time independent of the file's size, what start-up must refuse:
    not a database (the header), no WAL or `synchronous=FULL`, a schema newer than
    the code, a damaged schema or table root or edge (the ends of every table,
    where the newest rows and a truncated file show); then applies migrations.
    Damage deeper inside is the background integrity check's to find."""
    try:
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        db.execute(f"PRAGMA cache_size={CACHE_SIZE}")
        journal = db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower()
        db.execute("PRAGMA synchronous=FULL")
        synchronous = db.execute("PRAGMA synchronous").fetchone()[0]
        db.execute("PRAGMA foreign_keys=ON")
        current = db.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise StorageRefused(f"database {path!r} is unusable: {exc}") from exc
    expected_journal = "memory" if path == MEMORY else "wal"
    if journal != expected_journal:
        raise StorageRefused(f"database {path!r} cannot run in WAL mode (journal_mode is {journal!r})")
    if synchronous != 2:
        raise StorageRefused(f"database {path!r} did not accept synchronous=FULL (got {synchronous})")
    known = len(migrations)
    if current > known:
        raise StorageRefused(
            f"database {path!r} has schema version {current}, newer than this code knows ({known}); "
            "run a newer release or restore a matching backup"
        )
    for table, query in _table_edges(db):
        try:
            db.execute(query).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StorageRefused(
                f"database {path!r} is damaged (reading the ends of table {table}: {exc}); "
                "restore the file from a backup"
            ) from exc
    for migration in migrations[current:]:
        try:
            db.executescript(f"BEGIN IMMEDIATE;\n{migration.sql}\nPRAGMA user_version = {migration.version};\nCOMMIT;")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StorageRefused(f"migration {migration.version} ({migration.name}) failed on {path!r}: {exc}") from exc
        log.info("applied migration %04d_%s to %s", migration.version, migration.name, path)


def database_bytes(db: Any) -> int:
    """The size of the database file (its pages; the WAL beside it is not counted)."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (size,) = db.execute("PRAGMA page_size").fetchone()
    return int(pages) * int(size)


# The health probe shares the writer's thread: it must not hold up writes long.
PROBE_LOCK_WAIT_MS = 500


def probe_writable(db: sqlite3.Connection) -> None:
    """Takes the write lock and dirties a page, then rolls back: raises
    sqlite3.OperationalError when the database is locked, read-only or failing."""
    db.execute(f"PRAGMA busy_timeout={PROBE_LOCK_WAIT_MS}")
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        db.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        db.execute("ROLLBACK")
