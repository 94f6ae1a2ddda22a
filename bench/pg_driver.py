"""Which PostgreSQL driver for the storage adapters: the hot path's transaction
(lock a task row, update it, take the next event sequence, insert the event,
remember the request id) through three drivers, side by side in one run.

    .venv/bin/python bench/pg_driver.py [--transactions 2000] [--concurrency 1,16] [--url postgresql://…]

- psycopg-thread: psycopg 3 (sync), the whole transaction as one function on a
  pooled connection's thread (funnel.runtime.postgres.PostgresDatabase: one hop);
- psycopg-async: psycopg 3's asyncio API, one await per statement;
- asyncpg: asyncpg's pool, one await per statement.
Without --url it starts a throwaway server with the `pgserver` wheel."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# asyncpg comes with the `bench` extra, not the test extra: absent from the venv mypy runs in
# (import-not-found), untyped where installed (import-untyped: it ships no py.typed). Only one of
# the two applies in a given venv, hence unused-ignore.
import asyncpg  # type: ignore[import-not-found, import-untyped, unused-ignore]
import psycopg
from psycopg_pool import AsyncConnectionPool

from funnel.runtime.postgres import PostgresDatabase
from funnel.runtime.sqlite import Migration

SCHEMA = [
    Migration(
        1,
        "bench",
        """
CREATE TABLE tasks (id text PRIMARY KEY, revision bigint NOT NULL, state text NOT NULL);
CREATE TABLE counter (id integer PRIMARY KEY, value bigint NOT NULL);
INSERT INTO counter VALUES (1, 0);
CREATE TABLE events (sequence bigint PRIMARY KEY, task_id text NOT NULL, revision bigint NOT NULL, body text NOT NULL);
CREATE TABLE request_ids (request_id text PRIMARY KEY, response bytea NOT NULL);
""",
    )
]
TASKS = 256
BODY = "x" * 300

Row = TypeVar("Row")


def fetched(row: Row | None) -> Row:
    """The row of a statement that always returns one: every task and the counter row exist."""
    if row is None:
        raise RuntimeError("the statement returned no row")
    return row


def thread_unit(task: str, request_id: str):
    def unit(conn: psycopg.Connection) -> int:
        (revision,) = fetched(conn.execute("SELECT revision FROM tasks WHERE id = %s FOR UPDATE", (task,)).fetchone())
        conn.execute("UPDATE tasks SET revision = %s, state = 'ACTIVE' WHERE id = %s", (revision + 1, task))
        (sequence,) = fetched(
            conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1 RETURNING value").fetchone()
        )
        conn.execute("INSERT INTO events VALUES (%s, %s, %s, %s)", (sequence, task, revision + 1, BODY))
        conn.execute("INSERT INTO request_ids VALUES (%s, %s)", (request_id, b"r" * 200))
        return sequence

    return unit


async def psycopg_async_unit(pool: AsyncConnectionPool, task: str, request_id: str) -> int:
    async with pool.connection() as conn, conn.transaction():
        cursor = await conn.execute("SELECT revision FROM tasks WHERE id = %s FOR UPDATE", (task,))
        (revision,) = fetched(await cursor.fetchone())
        await conn.execute("UPDATE tasks SET revision = %s, state = 'ACTIVE' WHERE id = %s", (revision + 1, task))
        cursor = await conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1 RETURNING value")
        (sequence,) = fetched(await cursor.fetchone())
        await conn.execute("INSERT INTO events VALUES (%s, %s, %s, %s)", (sequence, task, revision + 1, BODY))
        await conn.execute("INSERT INTO request_ids VALUES (%s, %s)", (request_id, b"r" * 200))
        return sequence


async def asyncpg_unit(pool: asyncpg.Pool, task: str, request_id: str) -> int:
    async with pool.acquire() as conn, conn.transaction():
        revision = await conn.fetchval("SELECT revision FROM tasks WHERE id = $1 FOR UPDATE", task)
        await conn.execute("UPDATE tasks SET revision = $1, state = 'ACTIVE' WHERE id = $2", revision + 1, task)
        sequence = await conn.fetchval("UPDATE counter SET value = value + 1 WHERE id = 1 RETURNING value")
        await conn.execute("INSERT INTO events VALUES ($1, $2, $3, $4)", sequence, task, revision + 1, BODY)
        await conn.execute("INSERT INTO request_ids VALUES ($1, $2)", request_id, b"r" * 200)
        return sequence


async def measure(name: str, run_one, transactions: int, concurrency: int) -> float:
    counter = iter(range(transactions))

    async def worker() -> None:
        for n in counter:
            await run_one(f"t{n % TASKS}", f"{name}-{concurrency}-{n}")

    started = time.perf_counter()
    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    rate = transactions / elapsed
    print(
        f"  {name:16} {concurrency:>3} in flight: {rate:8.0f} tx/s   "
        f"client CPU {1000 * (time.process_time() - cpu) / transactions:.3f} ms/tx"
    )
    return rate


async def main(url: str, transactions: int, levels: list[int]) -> None:
    database = await PostgresDatabase.open(url, "bench", SCHEMA, pool_size=16)
    await database.write(
        lambda c: c.execute("INSERT INTO tasks SELECT 't' || n, 0, 'NEW' FROM generate_series(0, %s) n", (TASKS - 1,))
    )
    opts = {"options": "-c search_path=bench"}
    async_pool = AsyncConnectionPool(url, min_size=16, max_size=16, kwargs={"autocommit": True, **opts}, open=False)
    await async_pool.open(wait=True)
    apg = await asyncpg.create_pool(url, min_size=16, max_size=16, server_settings={"search_path": "bench"})
    try:
        for level in levels:
            print(f"{transactions} transactions, {level} in flight:")
            base = await measure("psycopg-thread", lambda t, r: database.write(thread_unit(t, r)), transactions, level)
            rates = {
                "psycopg-async": await measure(
                    "psycopg-async", lambda t, r: psycopg_async_unit(async_pool, t, r), transactions, level
                ),
                "asyncpg": await measure("asyncpg", lambda t, r: asyncpg_unit(apg, t, r), transactions, level),
            }
            print("  ratios vs psycopg-thread: " + ", ".join(f"{k} {v / base:.2f}x" for k, v in rates.items()))
    finally:
        await apg.close()
        await async_pool.close()
        await database.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        url = args.url
    else:
        import tempfile

        from bench.common import embedded_postgres

        url = embedded_postgres(Path(tempfile.mkdtemp(prefix="funnel-pg-driver-")))
    asyncio.run(main(url, args.transactions, [int(n) for n in args.concurrency.split(",")]))
