"""SQLite as brief §2 wants it: WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` for
read-then-write transactions, versioned migrations applied at start, and a refusal
to start when any of that cannot be had.

A transaction is one plain function over a `sqlite3.Connection`, run on the
connection's own thread in a single hop: aiosqlite would otherwise cost one thread
hop per statement, which dominates the cost of a small transaction.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import re
import sqlite3
from dataclasses import dataclass
from typing import Callable, TypeVar

import aiosqlite

from funnel.runtime.storage_errors import StorageRefused, StorageUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

MEMORY = ":memory:"
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
    """One SQLite connection with its own thread."""

    def __init__(self, connection: aiosqlite.Connection, path: str) -> None:
        self._connection = connection
        self.path = path
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        path: str,
        migrations: list[Migration],
        *,
        busy_timeout_ms: int = 5000,
        check_integrity: bool = True,
    ) -> "Database":
        """Opens (creating if needed) and prepares the database, or raises StorageRefused."""
        try:
            connection = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise StorageRefused(f"cannot open database {path!r}: {exc}") from exc
        database = cls(connection, path)
        try:
            await database.run(lambda db: _prepare(db, path, migrations, busy_timeout_ms, check_integrity))
        except BaseException:
            await connection.close()
            raise
        return database

    @classmethod
    async def open_reader(cls, writer: "Database", *, busy_timeout_ms: int = 5000) -> "Database":
        """A second, read-only connection for reads that must not queue behind writes.
        An in-memory database has no second connection: the writer serves reads."""
        if writer.path == MEMORY:
            return writer
        connection = await aiosqlite.connect(writer.path, isolation_level=None)
        reader = cls(connection, writer.path)

        def configure(db: sqlite3.Connection) -> None:
            db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            db.execute("PRAGMA query_only=ON")

        await reader.run(configure)
        return reader

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs fn on the connection's thread. sqlite3 operational faults become StorageUnavailable."""
        connection = self._connection
        # aiosqlite has no public "run this callable on your thread"; _execute is that
        # primitive (pinned range in pyproject.toml, covered by the storage tests).
        try:
            return await connection._execute(lambda: fn(connection._conn))
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(str(exc)) from exc

    async def write(self, fn: Callable[[sqlite3.Connection], T], after_commit: Callable[[T], None] | None = None) -> T:
        """Runs fn inside BEGIN IMMEDIATE … COMMIT (ROLLBACK if it raises).

        after_commit runs on the event loop right after the commit and before the
        next write starts, so whatever it publishes is published in commit order."""
        # Shielded: once queued, a transaction commits and publishes even when the
        # caller is cancelled (deadline, disconnect), so nothing committed goes unpublished.
        return await asyncio.shield(self._write_in_order(fn, after_commit))

    async def _write_in_order(self, fn: Callable[[sqlite3.Connection], T], after_commit: Callable[[T], None] | None) -> T:
        async with self._write_lock:
            result = await self.run(lambda db: in_write_transaction(db, fn))
            if after_commit is not None:
                after_commit(result)
            return result

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Runs fn in a read transaction: a consistent snapshot across its statements."""
        return await self.run(lambda db: in_read_transaction(db, fn))

    async def close(self) -> None:
        await self._connection.close()


def in_write_transaction(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn(db)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result


def in_read_transaction(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    if db.in_transaction:
        return fn(db)
    db.execute("BEGIN")
    try:
        return fn(db)
    finally:
        db.execute("ROLLBACK")


def _prepare(db: sqlite3.Connection, path: str, migrations: list[Migration], busy_timeout_ms: int, check_integrity: bool) -> None:
    try:
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        journal = db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower()
        db.execute("PRAGMA synchronous=FULL")
        synchronous = db.execute("PRAGMA synchronous").fetchone()[0]
        db.execute("PRAGMA foreign_keys=ON")
        if check_integrity:
            problems = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
            if problems != ["ok"]:
                raise StorageRefused(f"database {path!r} failed its integrity check: {'; '.join(problems[:5])}")
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
    for migration in migrations[current:]:
        try:
            db.executescript(
                f"BEGIN IMMEDIATE;\n{migration.sql}\nPRAGMA user_version = {migration.version};\nCOMMIT;"
            )
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StorageRefused(f"migration {migration.version} ({migration.name}) failed on {path!r}: {exc}") from exc
        log.info("applied migration %04d_%s to %s", migration.version, migration.name, path)


def probe_writable(db: sqlite3.Connection) -> None:
    """Takes the write lock and dirties a page, then rolls back: raises
    sqlite3.OperationalError when the database is locked, read-only or failing."""
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        db.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        db.execute("ROLLBACK")
