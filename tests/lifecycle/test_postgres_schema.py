"""The lifecycle schema on PostgreSQL, inspected with raw connections on purpose:
migrations applied once by replicas starting together, the same tables and columns
as the SQLite schema's end state, immutable events, the sequence counter, and the
notification every committed event sends."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3

import psycopg
import pytest

from funnel.runtime.sqlite import migrations_in
from lifecycle_service.storage import postgres as pg_adapter
from lifecycle_service.storage.postgres import EVENTS_CHANNEL, SCHEMA, PostgresLifecycleStore
from lifecycle_service.storage.sqlite import SqliteLifecycleStore
from tests.lifecycle.test_storage import T0, WS, committed_register
from tests.postgres import fresh_database

VERSIONS = len(migrations_in(pg_adapter.MIGRATIONS_PACKAGE))


@pytest.fixture
async def url() -> str:
    return await asyncio.to_thread(fresh_database)


def columns_of_postgres(url: str) -> dict[str, set[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s", (SCHEMA,)
        ).fetchall()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    return found


def columns_of_sqlite(path: str) -> dict[str, set[str]]:
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: {r[1] for r in db.execute(f'PRAGMA table_info("{table}")')}
            for table in tables
            if not table.startswith("sqlite_")
        }


async def test_replicas_starting_together_migrate_once(url):
    stores = await asyncio.gather(*(PostgresLifecycleStore.open(url, pool_size=2) for _ in range(4)))
    try:
        with psycopg.connect(url) as conn:
            rows = conn.execute(f"SELECT version FROM {SCHEMA}.schema_migrations ORDER BY version").fetchall()
        assert [r[0] for r in rows] == list(range(1, VERSIONS + 1))
        await committed_register(stores[0], "t1")
        assert (await stores[3].read(lambda tx: tx.load_task(WS, "t1"))).revision == 1
    finally:
        for store in stores:
            await store.close()
    # Reopening keeps the data and migrates nothing again.
    store = await PostgresLifecycleStore.open(url)
    try:
        assert (await store.read(lambda tx: tx.load_task(WS, "t1"))).revision == 1
    finally:
        await store.close()


async def test_the_tables_and_columns_are_those_of_the_sqlite_schema(url, tmp_path):
    path = str(tmp_path / "lifecycle.sqlite3")
    await (await SqliteLifecycleStore.open(path)).close()
    await (await PostgresLifecycleStore.open(url)).close()
    on_sqlite, on_postgres = columns_of_sqlite(path), columns_of_postgres(url)
    for table, columns in on_sqlite.items():
        assert on_postgres.get(table) is not None, f"no table {table} on PostgreSQL"
        assert columns <= on_postgres[table], (table, columns - on_postgres[table])
    # What PostgreSQL adds for replicas: the sequence counter and propagation claims.
    assert set(on_postgres) - set(on_sqlite) == {"lifecycle_event_sequence", "schema_migrations"}
    assert on_postgres["pending_propagations"] - on_sqlite["pending_propagations"] == {"claimed_by", "claimed_until"}


async def test_events_are_immutable_and_each_commit_notifies_every_listener(url):
    store = await PostgresLifecycleStore.open(url)
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        await listener.execute(f'LISTEN "{EVENTS_CHANNEL}"')
        committed = await committed_register(store, "t1")
        notification = await anext(aiter(listener.notifies(timeout=5, stop_after=1)))
        assert notification.payload == str(committed.event.sequence)

        with psycopg.connect(url) as conn:
            for statement in (
                "UPDATE lifecycle_events SET cause_reason = 'rewritten'",
                "DELETE FROM lifecycle_events",
                "TRUNCATE lifecycle_events CASCADE",
            ):
                with pytest.raises(psycopg.errors.RaiseException, match="immutable"):
                    conn.execute(f"SET search_path = {SCHEMA}; {statement}")
                conn.rollback()
            assert conn.execute(f"SELECT value FROM {SCHEMA}.lifecycle_event_sequence").fetchone() == (
                committed.event.sequence,
            )
    finally:
        await listener.close()
        await store.close()


async def test_a_rolled_back_write_gives_its_sequence_back(url):
    store = await PostgresLifecycleStore.open(url)
    try:
        first = await committed_register(store, "t1")

        def unit(tx):
            tx.append_event(dataclasses.replace(first.event, task_id="t2", sequence=0))
            raise RuntimeError("after taking a sequence")

        with pytest.raises(RuntimeError):
            await store.write(unit)
        second = await committed_register(store, "t3", now=T0 + 1)
        assert second.event.sequence == first.event.sequence + 1
    finally:
        await store.close()
