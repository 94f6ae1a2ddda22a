"""The lifecycle schema on PostgreSQL, inspected with raw connections on purpose:
migrations applied once by replicas starting together, the same tables and columns
as the SQLite schema's end state, immutable events, sequences without a counter,
and the notification sent after a commit, outside its transaction."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3

import psycopg
import pytest

from funnel.auth.principal import Caller
from funnel.runtime.sqlite import migrations_in
from lifecycle_service.storage import postgres as pg_adapter
from lifecycle_service.storage.postgres import EVENTS_CHANNEL, SCHEMA, PostgresLifecycleStore
from lifecycle_service.storage.sqlite import SqliteLifecycleStore
from tests.lifecycle.test_storage import T0, WS, committed_register, event_of, record
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
        assert (await stores[3].read(lambda tx: tx.tasks.load(WS, "t1"))).revision == 1
    finally:
        for store in stores:
            await store.close()
    # Reopening keeps the data and migrates nothing again.
    store = await PostgresLifecycleStore.open(url)
    try:
        assert (await store.read(lambda tx: tx.tasks.load(WS, "t1"))).revision == 1
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
    # What PostgreSQL adds for replicas: propagation claims (and no counter row).
    assert set(on_postgres) - set(on_sqlite) == {"schema_migrations"}
    assert on_postgres["pending_propagations"] - on_sqlite["pending_propagations"] == {"claimed_by", "claimed_until"}


async def test_events_are_immutable(url):
    store = await PostgresLifecycleStore.open(url)
    try:
        await committed_register(store, "t1")
        with psycopg.connect(url) as conn:
            for statement in (
                "UPDATE lifecycle_events SET cause_reason = 'rewritten'",
                "DELETE FROM lifecycle_events",
                "TRUNCATE lifecycle_events CASCADE",
            ):
                with pytest.raises(psycopg.errors.RaiseException, match="immutable"):
                    conn.execute(f"SET search_path = {SCHEMA}; {statement}")
                conn.rollback()
    finally:
        await store.close()


async def test_an_announcement_reaches_every_listener_and_a_commit_notifies_nobody_itself(url):
    """The commit takes no notification lock (funnel.runtime.postgres.Announcer):
    listeners hear of it only from the announcement sent after it."""
    store = await PostgresLifecycleStore.open(url)
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    announcer = asyncio.create_task(store.announcer.run())
    try:
        await listener.execute(f'LISTEN "{EVENTS_CHANNEL}"')
        await committed_register(store, "t1")
        with psycopg.connect(url) as conn:
            triggers = conn.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname",
                (f"{SCHEMA}.lifecycle_events",),
            ).fetchall()
        # Only the immutability triggers: nothing notifies from inside a transaction.
        assert [t[0] for t in triggers] == ["lifecycle_events_immutable", "lifecycle_events_not_truncated"]
        store.announcer.announce()
        store.announcer.announce()  # coalesced while the first is sent, or sent after it
        notification = await anext(aiter(listener.notifies(timeout=5, stop_after=1)))
        assert notification.channel == EVENTS_CHANNEL
    finally:
        announcer.cancel()
        await asyncio.gather(announcer, return_exceptions=True)
        await listener.close()
        await store.close()


async def test_a_rolled_back_write_leaves_no_event_and_the_next_is_delivered_after_the_first(url):
    store = await PostgresLifecycleStore.open(url)
    try:
        first = await committed_register(store, "t1")

        def unit(tx):
            tx.events.append(dataclasses.replace(first.event, task_id="t2", sequence=0))
            raise RuntimeError("after numbering an event")

        with pytest.raises(RuntimeError):
            await store.write(unit)
        second = await committed_register(store, "t3", now=T0 + 1)
        assert second.event.sequence > first.event.sequence
        read = await store.events_since(0, 10)
        assert [e.sequence for e in read.events] == [first.event.sequence, second.event.sequence]
        assert not read.held_back
        assert await store.latest_sequence() == second.event.sequence
    finally:
        await store.close()


async def test_a_callers_number_is_remembered_only_once_committed(url):
    """A store remembers callers' numbers (no lookup per event), but only those a
    committed transaction used: a caller first seen by a write that rolled back is
    looked up (and made) again, and every event names its own caller."""
    store = await PostgresLifecycleStore.open(url)
    try:
        newcomer = Caller("newcomer", "agent")

        def rolled_back(tx):
            task = record("t-lost")
            tx.tasks.insert(task)
            tx.events.append(event_of(task, caller=newcomer))
            raise RuntimeError("after the caller's row was made")

        with pytest.raises(RuntimeError):
            await store.write(rolled_back)
        for task_id, caller in (("t1", newcomer), ("t2", newcomer), ("t3", Caller("someone", "agent"))):
            task = record(task_id)
            await store.write(
                lambda tx, t=task, c=caller: (tx.tasks.insert(t), tx.events.append(event_of(t, caller=c)))
            )
        for task_id, caller in (("t1", newcomer), ("t2", newcomer), ("t3", Caller("someone", "agent"))):
            (event,) = await store.read(lambda tx, t=task_id: tx.events.history(WS, t, 0, 10))
            assert event.caller == caller, task_id
    finally:
        await store.close()
