"""PostgreSQL as the scale-out backend: the same unit-of-work shape as
`funnel.runtime.sqlite` (a transaction is one plain synchronous function), over a
pool of connections so that several transactions, and several replicas of a
service, run at once. A unit runs on the event loop (funnel.runtime.on_loop): each
of its statements is awaited there through asyncpg while the loop serves other
work, so no thread waits to win the GIL back after a round trip (docs/scaling.md,
"The units on the event loop"). The listener and the announcer of notifications
keep psycopg's connections (`notifies()`).

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
import contextlib
import functools
import logging
import time
import urllib.parse
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import asyncpg  # type: ignore[import-untyped]  # it ships no annotations; the engine's use is typed below
import psycopg

from funnel.runtime import calls, on_loop
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
RETRYABLE: tuple[type[Exception], ...] = (
    asyncpg.exceptions.UniqueViolationError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.ExclusionViolationError,
)
LOCK_NOT_AVAILABLE: type[Exception] = asyncpg.exceptions.LockNotAvailableError
POOL_TIMEOUT = 10.0
# What a write judges itself (a conflict runs it again, a lock wait has its own
# message); to any other use of a connection they are the database failing.
_JUDGED_BY_WRITE = (*RETRYABLE, LOCK_NOT_AVAILABLE)
# SQLSTATE classes of the database failing rather than the statement: connection
# (08), insufficient resources (53), object not in prerequisite state (55: a lock
# wait over), operator intervention (57: shutdown, cancel), system error (58).
_UNAVAILABLE_CLASSES = frozenset({"08", "53", "55", "57", "58"})
# Of those, the connection itself gone: its class (08) and the server ending it (57P0x).
_CONNECTION_ENDED = ("08", "57P01", "57P02", "57P03")
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
        pool: asyncpg.Pool,
        url: str,
        schema: str,
        commits: CommitObserver | None = None,
    ) -> None:
        self._pool = pool
        self.url = url
        self.schema = schema
        self._commits = commits
        # Signs this process's notifications, so that its own listener skips
        # them: its own commits wake its tail directly (funnel.runtime.tail).
        self.instance = uuid.uuid4().hex
        # The transactions under way: each finishes whoever stops waiting for it,
        # and `close` waits for them before it closes their connections.
        self._running: set[asyncio.Task[Any]] = set()

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
        dsn, url_timeout = without_connect_timeout(url)
        pool = asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=pool_size,
            server_settings={"search_path": schema, "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION},
            timeout=url_timeout or connect_timeout,
            statement_cache_size=1024,
            reset=_end_transaction,
        )
        try:
            await pool
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            await pool.close()
            raise StorageRefused(f"cannot connect to {redacted(url)}: {exc}") from exc
        database = cls(pool, url, schema, commits)
        try:
            await database._own(database._on_connection(lambda conn: database._prepare(conn, migrations)))
        except (asyncpg.PostgresError, Unavailable, StorageUnavailable) as exc:
            await database.close()
            raise StorageRefused(f"cannot prepare schema {schema!r} on {redacted(url)}: {exc}") from exc
        except BaseException:
            await database.close()
            raise
        return database

    def _prepare(self, conn: Connection, migrations: list[Migration]) -> None:
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

                def apply(conn: Connection, migration: Migration = migration) -> None:
                    conn.execute(migration.sql.encode())  # trusted SQL files of this package
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )

                in_transaction(conn, "BEGIN", apply)
                log.info("applied migration %04d_%s to schema %s", migration.version, migration.name, self.schema)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))

    async def _own(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` as a task of this database's: it runs to its end even when the
        caller stops waiting (a transaction is never cut off between two of its
        statements, and a commit's hooks run), and `close` waits for it."""
        task = asyncio.get_running_loop().create_task(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def write(self, fn: Callable[[Connection], T], after_commit: Callable[[T], None] | None = None) -> T:
        """Runs fn in a write transaction on a pooled connection and returns its
        result once committed; after_commit then runs. A conflict reruns fn (see
        the module docstring). Locks are waited for at most until the RPC's
        deadline (funnel.runtime.calls), and DEFAULT_LOCK_WAIT without one; then
        StorageUnavailable, nothing applied. Once started, a write completes even
        if its caller is cancelled."""
        loop = asyncio.get_running_loop()
        deadline = min(calls.lock_deadline() or float("inf"), loop.time() + DEFAULT_LOCK_WAIT)
        wait_ms = max(1, int((deadline - loop.time()) * 1000))
        return await self._own(self._write(fn, wait_ms, after_commit))

    async def _write(self, fn: Callable[[Connection], T], wait_ms: int, after_commit: Callable[[T], None] | None) -> T:
        delay = 0.001
        begin = f"BEGIN; SET LOCAL lock_timeout = {int(wait_ms)}"
        for attempt in range(1, MAX_ATTEMPTS + 1):
            started = time.perf_counter()
            try:
                value = await self._on_connection(lambda conn: in_transaction(conn, begin, fn), _JUDGED_BY_WRITE)
            except RETRYABLE as exc:
                if attempt == MAX_ATTEMPTS:
                    raise StorageUnavailable(f"gave up after {attempt} conflicting attempts: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
                continue
            except LOCK_NOT_AVAILABLE as exc:
                raise StorageUnavailable("a lock stayed held until the caller's deadline; nothing was applied") from exc
            if self._commits is not None:
                self._commits(time.perf_counter() - started, 1)
            if after_commit is not None:
                try:
                    after_commit(value)
                except Exception:  # publishing must not undo an acknowledged commit
                    log.exception("after-commit hook failed")
            return value
        raise AssertionError("unreachable")

    async def _on_connection(self, use: Callable[[Connection], T], passthrough: tuple[type[Exception], ...] = ()) -> T:
        """`use` on a pooled connection; a failure of the database is
        StorageUnavailable, but for the `passthrough` errors, which are the
        caller's to judge. The pool does not check a connection before lending it
        (a round trip per transaction), so one the server has closed meanwhile (a
        restart, a terminated backend) is found by its first statement: if the
        connection broke before `use` sent anything else, nothing was applied and
        `use` runs again on another connection (the pool replaces the lost one),
        at most once per pooled connection."""
        broken: Lost | None = None
        for _ in range(self._pool.get_max_size() + 1):
            try:
                async with self._pool.acquire(timeout=POOL_TIMEOUT) as conn:
                    try:
                        return await on_loop.run(use, Connection(conn))
                    except NotBegun as exc:
                        broken = exc.cause
                        # Ended here unless the pool has seen it end (and taken it back
                        # already): the pool opens another in its place.
                        with contextlib.suppress(asyncpg.InterfaceError):
                            conn.terminate()
            except passthrough:
                raise
            except (Unavailable, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                # (a unit's own exceptions never get here: on_loop.run raises them inside `use`)
                raise StorageUnavailable(str(exc)) from exc
        raise StorageUnavailable("every pooled connection was broken; the server is unreachable") from broken

    async def read(self, fn: Callable[[Connection], T], *, one_statement: bool = False) -> T:
        """Runs fn in a read-only REPEATABLE READ transaction: one snapshot across
        its statements. A read of `one_statement` runs without a transaction
        around it (the statement's own snapshot is the same thing), one round
        trip instead of three."""

        def use(conn: Connection) -> T:
            if one_statement:
                return first_statement(conn, fn)
            return in_transaction(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", fn)

        return await self._own(self._on_connection(use))

    async def last_sequence(self, table: str) -> int:
        """The largest deliverable `sequence` of an event table (below HORIZON; 0
        while there is none): where a replica's tail (funnel.runtime.tail) starts."""
        return await self.read(lambda conn: last_deliverable(conn, table), one_statement=True)

    async def check_writable(self) -> None:
        def probe(conn: Connection) -> None:
            if conn.execute(b"SELECT pg_is_in_recovery()").fetchone() == (True,):
                raise StorageUnavailable("the database is a read-only standby")
            conn.execute(b"LOCK TABLE schema_migrations IN ROW EXCLUSIVE MODE")

        begin = "BEGIN; SET LOCAL lock_timeout = 500"
        await self._own(self._on_connection(lambda conn: in_transaction(conn, begin, probe)))

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
        """Waits for the transactions under way, then closes the connections."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        await self._pool.close()


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


class Unavailable(Exception):
    """A statement failed for want of the database (the connection lost, the server
    shutting down or out of resources, a lock waited for too long), not because of
    what it said: StorageUnavailable to the store's callers."""


class Lost(Unavailable):
    """The connection itself is gone (the server ended it, the socket closed, the
    driver found it in a state no statement can follow)."""


class NotBegun(Exception):
    """The first statement on a connection failed for want of the connection:
    nothing was sent before it, so nothing was applied."""

    def __init__(self, cause: Lost) -> None:
        super().__init__(str(cause))
        self.cause = cause


def in_transaction(conn: Connection, begin: str, fn: Callable[[Connection], T]) -> T:
    """fn in a transaction that `begin` (statements without parameters) opens:
    its settings travel with the BEGIN, one round trip instead of one each, and
    COMMIT is the last. On any failure the transaction is rolled back (a broken
    connection is the pool's to discard)."""
    try:
        conn.execute(begin.encode())
    except Lost as exc:
        raise NotBegun(exc) from exc
    try:
        value = fn(conn)
    except BaseException:
        # A connection that cannot roll back is closed by the pool, or rolled back
        # there once given back (_end_transaction): the failure to raise is fn's.
        with contextlib.suppress(Exception):
            conn.execute(b"ROLLBACK")
        raise
    conn.execute(b"COMMIT")
    return value


def first_statement(conn: Connection, fn: Callable[[Connection], T]) -> T:
    """fn, a read of one statement, on a connection outside any transaction
    (autocommit): a broken connection is NotBegun, since a read applies nothing."""
    try:
        return fn(conn)
    except Lost as exc:
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


def without_connect_timeout(url: str) -> tuple[str, float | None]:
    """The URL without libpq's `connect_timeout` parameter, and its value: asyncpg
    reads the URL's other libpq parameters (host, port, sslmode, sslrootcert, …)
    but would send this one to the server as a setting, which refuses it."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    timeouts = [float(value) for key, value in query if key == "connect_timeout" and value]
    kept = urllib.parse.urlencode([(key, value) for key, value in query if key != "connect_timeout"], safe="/")
    return urllib.parse.urlunsplit(parts._replace(query=kept)), (timeouts[-1] if timeouts else None)


def redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    if "password" in info:
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **info)


class Cursor:
    """The rows and the status of a statement a unit of work sent (all its rows
    arrive with the answer: the adapters read nothing larger than a page)."""

    __slots__ = ("_conn", "_rows", "_status")

    def __init__(self, rows: list[Any], status: str, conn: Any = None) -> None:
        self._rows = rows
        self._status = status
        self._conn = conn

    @property
    def rowcount(self) -> int:
        """The rows the statement changed or returned (its status's count), -1 when it says none."""
        count = self._status.rpartition(" ")[2]
        return int(count) if count.isdigit() else -1

    def fetchone(self) -> tuple[Any, ...] | None:
        if not self._rows:
            return None
        return tuple(self._rows.pop(0))

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return [tuple(r) for r in rows]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())

    def executemany(self, query: Query, rows: Iterable[Sequence[Any]]) -> None:
        _wait(self._conn.executemany(_numbered(query), list(rows)))


class Connection:
    """A pooled asyncpg connection as the synchronous connection a unit of work is
    given, with psycopg's `%s` placeholders: each statement is awaited on the event
    loop (funnel.runtime.on_loop), the unit's code between them runs there too."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, query: Query, params: Sequence[Any] | None = None) -> Cursor:
        sql = _numbered(query)
        if params is None and ";" in sql:  # several statements (BEGIN and its settings): no rows
            return Cursor([], _wait(self._conn.execute(sql)))
        # asyncpg's public calls return the rows or the status, not both; this one
        # is what they call, prepared once per connection (its statement cache).
        rows, status, _ = _wait(self._conn._execute(sql, params or (), 0, None, return_status=True))
        return Cursor(rows, status.decode())

    def cursor(self) -> Cursor:
        return Cursor([], "", self._conn)


def _wait(awaitable: Any) -> Any:
    """A statement's answer; a failure of the database raised as Unavailable."""
    try:
        return on_loop.wait(awaitable)
    except asyncpg.PostgresError as exc:
        state = exc.sqlstate or ""
        if state.startswith(_CONNECTION_ENDED):
            raise Lost(str(exc)) from exc
        if state[:2] in _UNAVAILABLE_CLASSES:
            raise Unavailable(str(exc)) from exc
        raise
    except (asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError) as exc:
        # (InternalClientError: an ending the server sent while the connection was
        # idle in the pool, found by the next statement before the socket's close)
        raise Lost(str(exc)) from exc


async def _end_transaction(conn: Any) -> None:
    """What the pool does to a connection given back, instead of asyncpg's reset
    (a round trip each time): a transaction left open is rolled back. No unit
    leaves anything else on a connection (no session settings, no cursors, no
    session-level locks)."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


@functools.lru_cache(maxsize=1024)
def _numbered(query: Query) -> str:
    """psycopg's `%s` placeholders as asyncpg's `$1`, `$2`, … and `%%` as `%`
    (translate's output, and the engine's own statements)."""
    text = query.decode() if isinstance(query, bytes) else query
    if "%" not in text:
        return text
    parts = text.split("%%")
    count = 0
    for i, part in enumerate(parts):
        pieces = part.split("%s")
        numbered = [pieces[0]]
        for piece in pieces[1:]:
            count += 1
            numbered.append(f"${count}{piece}")
        parts[i] = "".join(numbered)
    return "%".join(parts)


# A statement: the adapters' SQL is text or bytes.
Query = str | bytes


class Statements(Protocol):
    """What SqliteStyle needs of a connection: a unit's `Connection`, or psycopg's
    own synchronous one (the reliability harness reads through it)."""

    def execute(self, query: Query, params: Sequence[Any] | None = None, /) -> Any: ...

    def cursor(self) -> Any: ...


class SqliteStyle:
    """A PostgreSQL connection that takes SQLite's `?` placeholders, so that the row
    mapping a storage adapter writes once runs on both engines; what differs
    (row locks, sequence numbers) is all the PostgreSQL adapter overrides."""

    def __init__(self, conn: Statements) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(translate(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
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
