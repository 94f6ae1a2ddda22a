"""The PostgreSQL engine under the storage adapters, against a real server
(tests/postgres.py): migrations applied once by replicas starting together,
units of work rerun after a lost race, lock waits bounded, wake-ups across
connections, and errors named without the driver's types."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

from funnel.runtime import postgres
from funnel.runtime.postgres import PostgresDatabase, SqliteStyle, is_postgres_url, redacted, translate
from funnel.runtime.sqlite import Migration
from funnel.runtime.storage_errors import StorageRefused, StorageUnavailable
from tests.postgres import fresh_database

MIGRATIONS = [
    Migration(1, "items", "CREATE TABLE items (key text PRIMARY KEY, value integer NOT NULL);"),
    Migration(
        2,
        "counter",
        "CREATE TABLE counter (id integer PRIMARY KEY, value bigint NOT NULL);INSERT INTO counter VALUES (1, 0);",
    ),
]


@pytest.fixture
async def url():
    return await asyncio.to_thread(fresh_database)


async def test_replicas_starting_together_apply_each_migration_once(url):
    databases = await asyncio.gather(*(PostgresDatabase.open(url, "svc", MIGRATIONS, pool_size=2) for _ in range(4)))
    try:
        rows = await databases[0].read(lambda c: c.execute("SELECT version, name FROM schema_migrations").fetchall())
        assert rows == [(1, "items"), (2, "counter")]
    finally:
        for database in databases:
            await database.close()


async def test_a_schema_newer_than_the_code_is_refused(url):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS)
    await database.close()
    with pytest.raises(StorageRefused, match="newer than this code"):
        await PostgresDatabase.open(url, "svc", MIGRATIONS[:1])


async def test_two_services_share_a_database_in_their_own_schemas(url):
    first = await PostgresDatabase.open(url, "one", MIGRATIONS[:1])
    second = await PostgresDatabase.open(url, "two", MIGRATIONS[:1])
    try:
        await first.write(lambda c: c.execute("INSERT INTO items VALUES ('a', 1)"))
        assert await second.read(lambda c: c.execute("SELECT count(*) FROM items").fetchone()) == (0,)
    finally:
        await first.close()
        await second.close()


async def test_a_lost_race_reruns_the_unit_of_work_on_the_winning_state(url):
    """Two writers insert-if-absent the same key at once: one inserts, the other
    reruns, finds the row and reports it: one effect, two consistent answers."""
    a = await PostgresDatabase.open(url, "svc", MIGRATIONS, pool_size=4)
    b = await PostgresDatabase.open(url, "svc", MIGRATIONS, pool_size=4)
    runs = []
    # All four look before any inserts, however the machine schedules them: three
    # must lose and run again (a sleep to widen the race lost it under load).
    looked = threading.Barrier(4, timeout=30)

    def insert_once(value: int):
        def unit(conn: psycopg.Connection) -> tuple[str, int]:
            first = value not in runs
            runs.append(value)
            row = conn.execute("SELECT value FROM items WHERE key = 'k'").fetchone()
            if row is not None:
                return ("found", row[0])
            if first:
                looked.wait()
            conn.execute("INSERT INTO items VALUES ('k', %s)", (value,))
            return ("inserted", value)

        return unit

    try:
        results = await asyncio.gather(*(db.write(insert_once(n)) for n, db in enumerate([a, b, a, b])))
        assert sorted(kind for kind, _ in results) == ["found", "found", "found", "inserted"]
        assert len({value for _, value in results}) == 1
        assert len(runs) > 4  # the losers ran again
    finally:
        await a.close()
        await b.close()


async def test_the_counter_row_orders_concurrent_commits(url):
    """Sequence numbers taken from one locked row become visible in commit order."""
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS, pool_size=8)

    def take(conn: psycopg.Connection) -> int:
        (value,) = conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1 RETURNING value").fetchone()
        conn.execute("INSERT INTO items VALUES (%s, %s)", (f"seq-{value}", value))
        return value

    try:
        values = await asyncio.gather(*(database.write(take) for _ in range(50)))
        assert sorted(values) == list(range(1, 51))
    finally:
        await database.close()


async def test_a_held_lock_fails_the_write_when_its_wait_is_over(url, monkeypatch):
    """(The wait is the RPC's deadline when there is one, funnel.runtime.calls.)"""
    monkeypatch.setattr(postgres, "DEFAULT_LOCK_WAIT", 0.3)
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS, pool_size=2)
    holder = await psycopg.AsyncConnection.connect(url, autocommit=False, options="-c search_path=svc")
    try:
        await holder.execute("SELECT * FROM counter WHERE id = 1 FOR UPDATE")
        started = asyncio.get_running_loop().time()
        with pytest.raises(StorageUnavailable, match="lock"):
            await database.write(lambda c: c.execute("UPDATE counter SET value = 7 WHERE id = 1"))
        assert asyncio.get_running_loop().time() - started < 2
        await holder.rollback()
        assert await database.read(lambda c: c.execute("SELECT value FROM counter").fetchone()) == (0,)
    finally:
        await holder.close()
        await database.close()


async def test_notifications_wake_a_listener_on_another_connection(url):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS)
    listening, woken = asyncio.Event(), asyncio.Event()

    async def listen() -> None:
        count = 0
        async for _ in database.notifications("svc_events", poll=30):
            count += 1
            if count == 1:  # the first wake-up is the one after LISTEN
                listening.set()
            if count == 2:
                woken.set()
                return

    listener = asyncio.create_task(listen())
    try:
        await asyncio.wait_for(listening.wait(), 30)
        await database.write(lambda c: c.execute("SELECT pg_notify('svc_events', '1')"))
        await asyncio.wait_for(woken.wait(), 25)  # within the poll of 30 s: the notification woke it
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await database.close()


async def test_a_transaction_costs_its_statements_and_no_more_round_trips(url, monkeypatch):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS)
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def counted(conn, query, *args, **kwargs):
        sent.append(bytes(query).decode() if isinstance(query, bytes) else str(query))
        return execute(conn, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    try:
        await database.write(lambda c: c.execute("INSERT INTO items VALUES ('a', 1)"))
        # BEGIN with its settings, the insert, COMMIT: no check on checkout before them.
        assert sent[0].startswith("BEGIN; SET LOCAL lock_timeout = ") and sent[1:] == [
            "INSERT INTO items VALUES ('a', 1)",
            "COMMIT",
        ], sent
        sent.clear()
        assert await database.read(lambda c: c.execute("SELECT value FROM items").fetchone()) == (1,)
        assert sent == ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "SELECT value FROM items", "COMMIT"]
        sent.clear()
        read = database.read(lambda c: c.execute("SELECT value FROM items").fetchone(), one_statement=True)
        assert await read == (1,)
        assert sent == ["SELECT value FROM items"]
    finally:
        await database.close()


def _terminate_clients(url: str) -> int:
    """Ends every client connection to the test's database but the caller's, as a
    restart of the server would: how many it ended."""
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchone()
    assert ended is not None
    return int(ended[0])


async def test_connections_the_server_closed_are_replaced_without_failing_a_call(url):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS, pool_size=3)
    hold = threading.Barrier(3)

    async def fill_the_pool() -> None:  # three connections, each used once, then all ended
        await asyncio.gather(*(database.write(lambda c: hold.wait(10)) for _ in range(3)))
        assert await asyncio.to_thread(_terminate_clients, url) >= 3

    try:
        await fill_the_pool()
        await database.write(lambda c: c.execute("INSERT INTO items VALUES ('b', 2)"))
        await fill_the_pool()
        assert await database.read(lambda c: c.execute("SELECT value FROM items").fetchone()) == (2,)
        await fill_the_pool()
        read = database.read(lambda c: c.execute("SELECT count(*) FROM items").fetchone(), one_statement=True)
        assert await read == (1,)
        await fill_the_pool()
        await database.check_writable()
    finally:
        await database.close()


async def test_a_lock_wait_outside_a_write_is_the_database_unavailable(url):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS)
    try:
        with psycopg.connect(url) as holder:  # in a transaction until closed
            holder.execute("LOCK TABLE svc.schema_migrations IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(StorageUnavailable):
                await database.check_writable()
    finally:
        await database.close()


@pytest.fixture
def notes_received(monkeypatch):
    """The payloads of every notification a listener of this process received."""
    received: list[str] = []
    notifies = psycopg.AsyncConnection.notifies

    async def recording(conn, **kwargs):
        async for note in notifies(conn, **kwargs):
            received.append(note.payload)
            yield note

    monkeypatch.setattr(psycopg.AsyncConnection, "notifies", recording)
    return received


async def test_a_listener_skips_its_own_announcements_and_wakes_on_another_process(url, notes_received):
    mine, other = [await PostgresDatabase.open(url, "svc", MIGRATIONS) for _ in range(2)]
    wakeups: list[float] = []
    listening = asyncio.Event()

    async def listen() -> None:
        async for _ in mine.notifications("svc_events", poll=30):
            wakeups.append(asyncio.get_running_loop().time())
            listening.set()

    announcers = [postgres.Announcer(db, "svc_events") for db in (mine, other)]
    tasks = [asyncio.create_task(t) for t in (listen(), *(a.run() for a in announcers))]
    try:
        await asyncio.wait_for(listening.wait(), 30)  # the wake-up after LISTEN
        announcers[0].announce()  # its own commits wake its tail directly
        async with asyncio.timeout(25):
            while mine.instance not in notes_received:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert len(wakeups) == 1
        announcers[1].announce()
        async with asyncio.timeout(25):
            while len(wakeups) == 1:
                await asyncio.sleep(0.01)
        assert other.instance in notes_received
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await mine.close()
        await other.close()


async def test_a_listener_polls_while_only_its_own_announcements_come(url, notes_received):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS)
    wakeups: list[float] = []

    async def listen() -> None:
        async for _ in database.notifications("svc_events", poll=0.5):
            wakeups.append(asyncio.get_running_loop().time())

    announcer = postgres.Announcer(database, "svc_events")

    async def announce_often() -> None:
        while True:
            announcer.announce()
            await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(t) for t in (listen(), announcer.run(), announce_often())]
    try:
        async with asyncio.timeout(30):
            while not wakeups:  # the wake-up after LISTEN
                await asyncio.sleep(0.01)
        await asyncio.sleep(3.0)
        assert len(notes_received) >= 5, "its own announcements kept coming"
        assert len(wakeups) >= 4, wakeups  # the poll's every 0.5 s, not held off by them
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await database.close()


async def test_an_unreachable_server_is_refused_with_a_redacted_url():
    url = "postgresql://funnel:secret@127.0.0.1:1/nowhere?connect_timeout=1"
    assert is_postgres_url(url) and not is_postgres_url("/var/lib/funnel/lifecycle.sqlite3")
    assert "secret" not in redacted(url)
    with pytest.raises(StorageRefused) as refused:
        await PostgresDatabase.open(url, "svc", MIGRATIONS, connect_timeout=1)
    assert "secret" not in str(refused.value)


def test_sqlite_placeholders_translate_outside_quotes():
    assert translate("SELECT a FROM t WHERE b = ? AND c LIKE 'x%?' AND \"q?\" = ?") == (
        b"SELECT a FROM t WHERE b = %s AND c LIKE 'x%%?' AND \"q?\" = %s"
    )


async def test_sqlite_style_statements_run_on_postgres(url):
    database = await PostgresDatabase.open(url, "svc", MIGRATIONS)
    try:

        def unit(conn: psycopg.Connection) -> list[tuple]:
            db = SqliteStyle(conn)
            db.executemany("INSERT INTO items (key, value) VALUES (?, ?)", [("a", 1), ("b%", 2)])
            db.execute("INSERT INTO items VALUES (?, ?) ON CONFLICT (key) DO NOTHING", ("a", 9))
            return db.execute(
                "SELECT key, value FROM items WHERE key LIKE 'b%' OR value = ? ORDER BY key", (1,)
            ).fetchall()

        assert await database.write(unit) == [("a", 1), ("b%", 2)]
    finally:
        await database.close()
