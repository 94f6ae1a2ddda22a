"""PostgreSQL as the scale-out backend: the same unit-of-work shape as
`funnel.runtime.sqlite` (a transaction is one plain synchronous function run in
one hop on a connection's thread), over a pool of connections so that several
transactions, and several replicas of a service, run at once.

Concurrency is the database's: READ COMMITTED transactions in which the storage
adapters lock what they are about to change (`SELECT … FOR UPDATE`) and insert
under unique keys. A transaction that loses a race (a unique key taken by a
concurrent commit, a deadlock, a serialization failure) is rolled back and its
function runs again from the start on fresh data, so a unit of work must have
no effect besides its transaction: that is what makes two replicas receiving
the same request id give one effect and one answer.

Each service keeps its tables in its own schema (`funnel_lifecycle`,
`funnel_completion`), so both may share one database. Migrations are versioned
files per engine, applied at start under an advisory lock: replicas that start
together apply each migration once, the others wait and find it done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from funnel.runtime import calls
from funnel.runtime.sqlite import CommitObserver, Migration
from funnel.runtime.storage_errors import StorageRefused, StorageUnavailable
from funnel.runtime.tail import TailRead

log = logging.getLogger(__name__)
T = TypeVar("T")
E = TypeVar("E")

# How long a write waits for a lock held by another transaction when its caller
# set no deadline (background work): then it fails with StorageUnavailable.
DEFAULT_LOCK_WAIT = 5.0
# A unit of work that keeps losing races gives up after this many runs.
MAX_ATTEMPTS = 20
# Conflicts that undo the whole transaction and leave nothing applied: the unit
# of work runs again and decides on the state that won.
RETRYABLE = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.ExclusionViolation,
)
POOL_TIMEOUT = 10.0
# What a write judges itself (a conflict runs it again, a lock wait has its own
# message); to any other use of a connection they are the database failing.
_JUDGED_BY_WRITE = (*RETRYABLE, psycopg.errors.LockNotAvailable)
# A transaction left open by a process that hangs (not one that dies: the server
# ends those at once) would hold every watcher's horizon back (see HORIZON); no
# unit of work of this package pauses inside a transaction, so this much idle
# time means its process is stuck, and the server ends the transaction.
IDLE_IN_TRANSACTION = "30s"

# Numbers of the logs read by cursor (event and audit tables): see
# docs/architecture.md, "Numbers on PostgreSQL". A transaction numbers its rows
# from its own transaction id shifted left by POSITION_BITS, plus an ordinal, so
# writers share no row and none waits for another's commit. Every transaction
# still running has an id at least the oldest one a snapshot sees running
# (pg_snapshot_xmin), and no row is numbered below its writer's own position, so
# every number below HORIZON is final: a reader by cursor delivers only those,
# and a late commit is never skipped. The numbers skip values (and a rolled-back
# transaction leaves a hole); they increase, which is all a cursor needs.
POSITION_BITS = 16
OWN_POSITION = f"(pg_current_xact_id()::text::bigint << {POSITION_BITS})"
HORIZON = f"(pg_snapshot_xmin(pg_current_snapshot())::text::bigint << {POSITION_BITS})"


def is_postgres_url(database: str) -> bool:
    return database.startswith(("postgresql://", "postgres://"))


class PostgresDatabase:
    """A pool of connections to one schema of a PostgreSQL database."""

    def __init__(
        self,
        pool: ConnectionPool,
        executor: concurrent.futures.ThreadPoolExecutor,
        url: str,
        schema: str,
        commits: CommitObserver | None = None,
    ) -> None:
        self._pool = pool
        self._executor = executor
        self.url = url
        self.schema = schema
        self._commits = commits
        # Signs this process's notifications, so that its own listener skips
        # them: its own commits wake its tail directly (funnel.runtime.tail).
        self.instance = uuid.uuid4().hex

    @classmethod
    async def open(
        cls,
        url: str,
        schema: str,
        migrations: list[Migration],
        *,
        pool_size: int = 8,
        connect_timeout: float = POOL_TIMEOUT,
        commits: CommitObserver | None = None,
    ) -> PostgresDatabase:
        """Connects, creates the schema and applies its migrations, or raises StorageRefused.
        `commits` is told of each committed write transaction (the commit metrics)."""
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix=f"pg-{schema}")
        pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={
                "autocommit": True,
                "options": f"-c search_path={schema} -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION}",
            },
            open=False,
            name=schema,
            # No check on checkout: it cost a round trip per transaction. A
            # connection the server closed meanwhile fails at its first statement,
            # and `_on_connection` begins again on another (see there).
        )
        database = cls(pool, executor, url, schema, commits)
        try:
            await database._in_thread(lambda: pool.open(wait=True, timeout=connect_timeout))
            await database._in_thread(lambda: database._prepare(migrations))
        except PoolTimeout as exc:
            await database.close()
            raise StorageRefused(f"cannot connect to {redacted(url)}: {exc}") from exc
        except psycopg.Error as exc:
            await database.close()
            raise StorageRefused(f"cannot prepare schema {schema!r} on {redacted(url)}: {exc}") from exc
        except BaseException:
            await database.close()
            raise
        return database

    def _prepare(self, migrations: list[Migration]) -> None:
        with self._pool.connection() as conn:
            lock = zlib.crc32(f"funnel-migrations:{self.schema}".encode())
            conn.execute("SELECT pg_advisory_lock(%s)", (lock,))
            try:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    "version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
                current = row[0] if row else 0
                if current > len(migrations):
                    raise StorageRefused(
                        f"schema {self.schema!r} has version {current}, newer than this code knows "
                        f"({len(migrations)}); run a newer release"
                    )
                for migration in migrations[current:]:
                    with conn.transaction():
                        conn.execute(migration.sql.encode())  # trusted SQL files of this package
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                            (migration.version, migration.name),
                        )
                    log.info("applied migration %04d_%s to schema %s", migration.version, migration.name, self.schema)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def write(
        self, fn: Callable[[psycopg.Connection[Any]], T], after_commit: Callable[[T], None] | None = None
    ) -> T:
        """Runs fn in a write transaction on a pooled connection's thread and returns
        its result once committed; after_commit then runs on the event loop. A
        conflict reruns fn (see the module docstring). Locks are waited for at most
        until the RPC's deadline (funnel.runtime.calls), and DEFAULT_LOCK_WAIT
        without one; then StorageUnavailable, nothing applied. Once started, a
        write completes even if its caller is cancelled."""
        loop = asyncio.get_running_loop()
        deadline = min(calls.lock_deadline() or float("inf"), loop.time() + DEFAULT_LOCK_WAIT)
        wait_ms = max(1, int((deadline - loop.time()) * 1000))
        future = loop.run_in_executor(self._executor, self._write_sync, fn, wait_ms)
        value = await asyncio.shield(future)
        if after_commit is not None:
            try:
                after_commit(value)
            except Exception:  # publishing must not undo an acknowledged commit
                log.exception("after-commit hook failed")
        return value

    def _write_sync(self, fn: Callable[[psycopg.Connection[Any]], T], wait_ms: int) -> T:
        delay = 0.001
        begin = f"BEGIN; SET LOCAL lock_timeout = {int(wait_ms)}"
        for attempt in range(1, MAX_ATTEMPTS + 1):
            started = time.perf_counter()
            try:
                value = self._on_connection(lambda conn: in_transaction(conn, begin, fn), _JUDGED_BY_WRITE)
                if self._commits is not None:
                    self._commits(time.perf_counter() - started, 1)
                return value
            except RETRYABLE as exc:
                if attempt == MAX_ATTEMPTS:
                    raise StorageUnavailable(f"gave up after {attempt} conflicting attempts: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except psycopg.errors.LockNotAvailable as exc:
                raise StorageUnavailable("a lock stayed held until the caller's deadline; nothing was applied") from exc
        raise AssertionError("unreachable")

    def _on_connection(
        self, use: Callable[[psycopg.Connection[Any]], T], passthrough: tuple[type[Exception], ...] = ()
    ) -> T:
        """`use` on a pooled connection; a failure of the database is
        StorageUnavailable, but for the `passthrough` errors, which are the
        caller's to judge. The pool does not check a connection before lending it
        (a round trip per transaction), so one the server has closed meanwhile (a
        restart, a terminated backend) is found by its first statement: if the
        connection broke before `use` sent anything else, nothing was applied and
        `use` runs again on another connection (the pool discards the broken one),
        at most once per pooled connection."""
        broken: psycopg.OperationalError | None = None
        for _ in range(self._pool.max_size + 1):
            try:
                with self._pool.connection(timeout=POOL_TIMEOUT) as conn:
                    try:
                        return use(conn)
                    except NotBegun as exc:
                        if not conn.broken:
                            raise exc.cause from None
                        broken = exc.cause
            except passthrough:
                raise
            except (psycopg.OperationalError, PoolTimeout) as exc:
                raise StorageUnavailable(str(exc)) from exc
        raise StorageUnavailable("every pooled connection was broken; the server is unreachable") from broken

    async def read(self, fn: Callable[[psycopg.Connection[Any]], T], *, one_statement: bool = False) -> T:
        """Runs fn in a read-only REPEATABLE READ transaction: one snapshot across
        its statements. A read of `one_statement` runs without a transaction
        around it (the statement's own snapshot is the same thing), one round
        trip instead of three."""

        def use(conn: psycopg.Connection[Any]) -> T:
            if one_statement:
                return first_statement(conn, fn)
            return in_transaction(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", fn)

        return await self._in_thread(lambda: self._on_connection(use))

    async def last_sequence(self, table: str) -> int:
        """The largest deliverable `sequence` of an event table (below HORIZON; 0
        while there is none): where a replica's tail (funnel.runtime.tail) starts."""
        return await self.read(lambda conn: last_deliverable(conn, table), one_statement=True)

    async def check_writable(self) -> None:
        def probe(conn: psycopg.Connection[Any]) -> None:
            if conn.execute(b"SELECT pg_is_in_recovery()").fetchone() == (True,):
                raise StorageUnavailable("the database is a read-only standby")
            conn.execute(b"LOCK TABLE schema_migrations IN ROW EXCLUSIVE MODE")

        begin = "BEGIN; SET LOCAL lock_timeout = 500"
        await self._in_thread(lambda: self._on_connection(lambda conn: in_transaction(conn, begin, probe)))

    async def notifications(self, channel: str, poll: float = 1.0) -> AsyncIterator[None]:
        """Yields once per wake-up: after each NOTIFY on `channel` sent by another
        process's `Announcer` (this one's own commits wake its tail directly), and
        at least every `poll` seconds as a safety net. A lost connection is
        reopened; the caller reads the table by its cursor after each wake-up, so
        a missed notification costs latency only."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            except psycopg.OperationalError as exc:
                log.warning("LISTEN %s: cannot connect (%s); polling", channel, exc)
                await asyncio.sleep(poll)
                yield
                continue
            try:
                await conn.execute(f'LISTEN "{channel}"')
                yield  # whatever committed before LISTEN
                woken = loop.time()
                while True:
                    others = False
                    # At most `poll` after the last wake-up, however often this
                    # process's own notifications come meanwhile.
                    left = max(0.0, poll - (loop.time() - woken))
                    async for note in conn.notifies(timeout=left, stop_after=1):
                        others = others or note.payload != self.instance
                    if others or loop.time() - woken >= poll:
                        woken = loop.time()
                        yield
            except psycopg.OperationalError as exc:
                log.warning("LISTEN %s lost its connection (%s); reconnecting", channel, exc)
            finally:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._pool.close)
        self._executor.shutdown(wait=True)


class Announcer:
    """Tells the other replicas' tails that this one committed events: `announce()`
    after such a commit, and `run()` (under the server's background owner) sends
    NOTIFY on `channel`, signed with the database's `instance`, from one
    connection of its own. A NOTIFY inside the writing transaction would take the
    database's notification lock at its commit and hold it through the commit's
    flush, so that every notifying writer of both services committed one after
    another; here each NOTIFY is its own short
    transaction, and the commits announced while one is sent share the next."""

    def __init__(self, database: PostgresDatabase, channel: str) -> None:
        self._url = database.url
        self._instance = database.instance
        self.channel = channel
        self._wanted = asyncio.Event()

    def announce(self) -> None:
        self._wanted.set()

    async def run(self) -> None:
        """Sends a NOTIFY after each announcement (coalesced), until cancelled."""
        while True:
            await self._wanted.wait()
            try:
                conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
            except psycopg.OperationalError as exc:
                log.warning("NOTIFY %s: cannot connect (%s); the other replicas poll", self.channel, exc)
                await asyncio.sleep(1.0)
                continue
            try:
                while True:
                    await self._wanted.wait()
                    self._wanted.clear()
                    await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, self._instance))
            except psycopg.OperationalError as exc:
                log.warning("NOTIFY %s lost its connection (%s); reconnecting", self.channel, exc)
                self._wanted.set()  # what was wanted is not known to be sent
            finally:
                with contextlib.suppress(Exception):
                    await conn.close()


def task_number(table: str) -> str:
    """The SQL value that numbers a task's next row of `table` inside its INSERT
    (parameters: the transaction's ordinal, the workspace and the task): the
    transaction's own position plus the ordinal, and above the task's last row,
    read under the task's lock, so that a writer that got its id before waiting
    for that lock still numbers after the holder's rows. (A number taken meanwhile
    by another transaction is a unique violation, and the unit runs again with a
    new id.)"""
    return (
        f"(SELECT greatest({OWN_POSITION} + ?, coalesce(max(sequence), 0) + 1) FROM {table}"
        " WHERE workspace_id = ? AND task_id = ?)"
    )


def tail_read(rows: Sequence[Sequence[Any]], event: Callable[[Sequence[Any]], E]) -> TailRead[E]:
    """A tail's read from rows of (sequence, ..., HORIZON): the events below the
    horizon, and whether committed ones beyond it wait."""
    deliverable = [event(r[:-1]) for r in rows if r[0] < r[-1]]
    return TailRead(deliverable, held_back=len(deliverable) < len(rows))


class NotBegun(Exception):
    """The first statement on a connection failed for want of the connection:
    nothing was sent before it, so nothing was applied."""

    def __init__(self, cause: psycopg.OperationalError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def in_transaction(conn: psycopg.Connection[Any], begin: str, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
    """fn in a transaction that `begin` (statements without parameters) opens:
    its settings travel with the BEGIN, one round trip instead of one each, and
    COMMIT is the last. On any failure the transaction is rolled back (a broken
    connection is the pool's to discard)."""
    try:
        conn.execute(begin.encode())
    except psycopg.OperationalError as exc:
        raise NotBegun(exc) from exc
    try:
        value = fn(conn)
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            conn.execute(b"ROLLBACK")
        raise
    conn.execute(b"COMMIT")
    return value


def first_statement(conn: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]) -> T:
    """fn, a read of one statement, on a connection outside any transaction
    (autocommit): a broken connection is NotBegun, since a read applies nothing."""
    try:
        return fn(conn)
    except psycopg.OperationalError as exc:
        raise NotBegun(exc) from exc


def last_deliverable(conn: Any, table: str) -> int:
    """The largest `sequence` of an event table below HORIZON (0: none yet)."""
    row = conn.execute(f"SELECT coalesce(max(sequence), 0) FROM {table} WHERE sequence < {HORIZON}").fetchone()
    assert row is not None, "an aggregate returns a row"
    return int(row[0])


# What the tables of the connection's schema (the service's own) take, with their
# indexes and TOAST: what `funnel_db_size_bytes` reports on PostgreSQL.
SCHEMA_BYTES = (
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind = 'r'"
)


def redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    if "password" in info:
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **info)


class SqliteStyle:
    """A psycopg connection that takes SQLite's `?` placeholders, so that the row
    mapping a storage adapter writes once runs on both engines; what differs
    (row locks, sequence numbers) is all the PostgreSQL adapter overrides."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self.conn.execute(translate(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        cursor = self.conn.cursor()
        cursor.executemany(translate(sql), rows)
        return cursor


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> bytes:
    """`?` placeholders to psycopg's `%s` (and a literal `%` to `%%`), outside
    quoted strings and identifiers."""
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            if ch == quote:
                quote = None
            out.append("%%" if ch == "%" else ch)
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out).encode()
