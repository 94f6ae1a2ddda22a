"""What a statement costs the process that sends it, per engine and driver: the
CPU this process spends (every thread) per unit of work shaped like the services'
(three reads by key and three inserts in one write transaction), 16 units in
flight from one event loop, on PostgreSQL what the server spends beside it, and
both per statement (BEGIN and COMMIT are not counted as statements: their cost is
spread over the others).

    .venv/bin/python bench/drivers.py [--units 3000] [--concurrency 16]

- sqlite:  funnel.runtime.sqlite.SqliteEngine, as the services run it (group commit
           on the database thread);
- psycopg: funnel.runtime.postgres.PostgresDatabase, as the services run it (each
           unit one hop onto a pooled connection's thread);
- psycopg, reads merged: the same, with the unit's three reads sent as one
           statement (four statements instead of six): what merging saves;
- asyncpg: the same statements on asyncpg's pool on the event loop, when asyncpg is
           importable (`pip install asyncpg`; not a dependency of funnel): what the
           fastest Python driver we know of costs, for docs/scaling.md's ceiling.

PostgreSQL is a throwaway pgserver with production durability (bench.common). The
ratios are against psycopg as used, measured in the same run."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.capacity import postgres_cpu_seconds
from bench.common import embedded_postgres, load_average
from funnel.runtime.postgres import PostgresDatabase
from funnel.runtime.sqlite import Migration, SqliteEngine

TABLE = "CREATE TABLE items (ws text, id text, gen integer, payload bytea, n bigint, PRIMARY KEY (ws, id, gen))"
READS_AND_INSERTS = 3  # pairs per unit
PAYLOAD = b"x" * 200


# The unit's two statements in asyncpg's placeholders ($n), rewritten for the others.
READ = "SELECT ws, id, gen, payload, n FROM items WHERE ws = $1 AND id = $2 AND gen = $3"
INSERT = "INSERT INTO items (ws, id, gen, payload, n) VALUES ($1, $2, $3, $4, $5)"


def unit_on(db: Any, key: str, placeholder: str) -> None:
    """The unit of work, on a DB-API connection whose placeholder is `placeholder`."""
    read, insert = (re.sub(r"\$\d", placeholder, sql) for sql in (READ, INSERT))
    for gen in range(READS_AND_INSERTS):
        db.execute(read, ("w", key, gen)).fetchone()
        db.execute(insert, ("w", key, gen, PAYLOAD, gen))


# The unit's three reads as one statement (each a scalar subquery), for the
# variant that sends four statements instead of six: what merging a unit's reads saves.
MERGED_READ = "SELECT " + ", ".join(
    "(SELECT json_build_array(ws, id, gen, encode(payload, 'base64'), n) FROM items "
    f"WHERE ws = %s AND id = %s AND gen = {gen})"
    for gen in range(READS_AND_INSERTS)
)


def merged_unit_on(db: Any, key: str) -> None:
    """The unit with its reads merged, on psycopg."""
    db.execute(MERGED_READ, ("w", key) * READS_AND_INSERTS).fetchone()
    insert = re.sub(r"\$\d", "%s", INSERT)
    for gen in range(READS_AND_INSERTS):
        db.execute(insert, ("w", key, gen, PAYLOAD, gen))


async def asyncpg_unit(conn: Any, key: str) -> None:
    async with conn.transaction():
        for gen in range(READS_AND_INSERTS):
            await conn.fetchrow(READ, "w", key, gen)
            await conn.execute(INSERT, "w", key, gen, PAYLOAD, gen)


async def drive(
    units: int, concurrency: int, one: Callable[[str], Awaitable[None]], server_cpu: Callable[[], float]
) -> dict[str, float]:
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int) -> None:
        async with gate:
            await one(f"k{i}")

    await asyncio.gather(*(run(i) for i in range(concurrency)))  # warm: connections, prepared statements
    cpu, server, wall = time.process_time(), server_cpu(), time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(concurrency, concurrency + units)))
    wall, cpu, server = time.perf_counter() - wall, time.process_time() - cpu, server_cpu() - server
    return {"units_per_s": units / wall, "client_us": cpu / units * 1e6, "server_us": server / units * 1e6}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="funnel-drivers-"))
    url = embedded_postgres(work / "pg")
    migrations = [Migration(1, "items", TABLE + ";")]
    shape = f"{args.units} units of {READS_AND_INSERTS * 2} statements, {args.concurrency} in flight"
    print(f"drivers: {shape}; load average {load_average()}")
    # Per variant: its statements per unit, and what drive() measured.
    results: dict[str, tuple[int, dict[str, float]]] = {}
    six = READS_AND_INSERTS * 2

    sqlite = await SqliteEngine.open(str(work / "items.sqlite3"), migrations)
    results["sqlite"] = (
        six,
        await drive(
            args.units, args.concurrency, lambda key: sqlite.write(lambda db: unit_on(db, key, "?")), lambda: 0.0
        ),
    )
    await sqlite.close()

    postgres = await PostgresDatabase.open(url, "drivers_psycopg", migrations)
    results["psycopg"] = (
        six,
        await drive(
            args.units,
            args.concurrency,
            lambda k: postgres.write(lambda db: unit_on(db, k, "%s")),
            postgres_cpu_seconds,
        ),
    )
    await postgres.close()
    merged = await PostgresDatabase.open(url, "drivers_merged", migrations)
    results["psycopg, reads merged"] = (
        READS_AND_INSERTS + 1,
        await drive(
            args.units, args.concurrency, lambda k: merged.write(lambda db: merged_unit_on(db, k)), postgres_cpu_seconds
        ),
    )
    await merged.close()

    try:
        # Absent (import-not-found) or, once installed, untyped (import-untyped): one of
        # the two applies in a given venv, hence unused-ignore.
        import asyncpg  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        print("asyncpg: not installed (pip install asyncpg), not measured")
    else:
        pool = await asyncpg.create_pool(url, min_size=8, max_size=8)
        async with pool.acquire() as conn:
            await conn.execute("CREATE SCHEMA drivers_asyncpg; SET search_path = drivers_asyncpg; " + TABLE)
        await pool.close()
        schema = {"search_path": "drivers_asyncpg"}
        pool = await asyncpg.create_pool(url, min_size=8, max_size=8, server_settings=schema)

        async def one(key: str) -> None:
            async with pool.acquire() as conn:
                await asyncpg_unit(conn, key)

        results["asyncpg"] = six, await drive(args.units, args.concurrency, one, postgres_cpu_seconds)
        await pool.close()

    base = results["psycopg"][1]["client_us"]
    print(f"{'':22} {'units/s':>8} {'statements':>10} {'CPU per unit: sender':>30} {'server':>8} {'per statement':>20}")
    for name, (count, r) in results.items():
        client = f"{r['client_us']:8.0f} us ({r['client_us'] / base:4.2f}x psycopg)"
        each = f"{r['client_us'] / count:5.0f} us"
        if name == "sqlite":  # the server is this process
            server = "   (in)"
        else:
            server, each = f"{r['server_us']:5.0f} us", f"{each} + {r['server_us'] / count:3.0f} us"
        print(f"{name:22} {r['units_per_s']:8.0f} {count:10} {client:>30} {server:>8} {each:>20}")


if __name__ == "__main__":
    asyncio.run(main())
