"""The inputs of the capacity model in docs/scaling.md, measured in one run on
PostgreSQL, and the model's arithmetic from them.

    .venv/bin/python bench/capacity.py [--seconds 10] [--concurrency 16] [--url postgresql://...]
                                       [--primary-cores 16] [--replica-cores 2]

Both services run as real processes on one PostgreSQL database (a throwaway
pgserver with production durability, or --url); pre-claimed tasks are attempted
for --seconds at --concurrency in flight (bench/client.py's attempt workload).
Around the measured window it reads, per attempt:

- the transactions each service committed (its funnel_db_commit_seconds count),
- the rows each service's schema inserted, updated and deleted (pg_stat_user_tables),
- the WAL written (pg_current_wal_lsn) and the bytes its tables grew by,
- the CPU of each service, and of every PostgreSQL server process (/proc).

Then it prints what a primary of --primary-cores sustains if its CPU is the
limit, how many replicas of each service of --replica-cores that takes, and the
WAL rate and connections at that point. The figures depend on this machine;
the model in docs/scaling.md says which ones carry over."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import CLK_TCK, embedded_postgres, ensure_pki, load_average, start_services
from bench.run import commit_seconds, log, measure

SCHEMAS = {"lifecycle": "funnel_lifecycle", "completion": "funnel_completion"}
POOL_SIZE = 8  # connections per service process (PostgresDatabase's default)


def postgres_cpu_seconds() -> float:
    """CPU (user + system) of every process named `postgres` on this machine: the server."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name == "postgres":
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def database_figures(url: str) -> dict:
    import psycopg

    def one(conn: psycopg.Connection, sql: str, params: tuple = ()) -> tuple:
        row = conn.execute(sql.encode(), params).fetchone()
        assert row is not None, "an aggregate returns a row"
        return row

    with psycopg.connect(url, autocommit=True) as conn:
        (wal,) = one(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
        figures: dict = {"wal_bytes": float(wal)}
        for service, schema in SCHEMAS.items():
            rows = one(
                conn,
                "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0) "
                "FROM pg_stat_user_tables WHERE schemaname = %s",
                (schema,),
            )
            (size,) = one(
                conn,
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            )
            figures[service] = {
                "inserted": int(rows[0]),
                "updated": int(rows[1]),
                "deleted": int(rows[2]),
                "bytes": int(size),
            }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the measured window (default 10)")
    parser.add_argument("--concurrency", type=int, default=16, help="attempts in flight (default 16)")
    parser.add_argument("--url", default=None, help="a PostgreSQL database URL (default: a throwaway server)")
    parser.add_argument("--primary-cores", type=int, default=16, help="cores of the modelled primary (default 16)")
    parser.add_argument("--replica-cores", type=int, default=2, help="cores of one service replica (default 2)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="funnel-capacity-"))
    try:
        pki = ensure_pki(data_dir)
        url = args.url or embedded_postgres(data_dir / "pgdata")
        metrics_listen = ["--metrics-listen", "127.0.0.1:0"]
        services = start_services(data_dir / "run", metrics_listen, metrics_listen, pki=pki, database_url=url)
        try:
            assert services.lifecycle.metrics_url is not None and services.completion.metrics_url is not None
            urls = {"lifecycle": services.lifecycle.metrics_url, "completion": services.completion.metrics_url}

            def snapshot() -> dict:
                return {
                    "database": database_figures(url),
                    "commits": {name: commit_seconds(u, "funnel_db_commit_seconds_count") for name, u in urls.items()},
                    "postgres_cpu_s": postgres_cpu_seconds(),
                }

            pool = math.ceil(args.seconds * 600) + 4 * args.concurrency
            config = {
                "mode": "attempt",
                "lifecycle": services.lifecycle.address,
                "completion": services.completion.address,
                "tls_dir": services.tls_dir,
                "concurrency": args.concurrency,
                "seconds": args.seconds,
                "request_ids": True,
                "task_prefix": f"cap-{os.getpid()}",
                "pool": pool,
                "prep_max_s": max(60.0, 6 * args.seconds),
            }
            log(f"attempts at {args.concurrency} in flight: preparing up to {pool} claimed tasks ...")
            result = measure(config, services.pids, urls, url, snapshot)
        finally:
            services.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)

    before, after = result["snapshots"]
    ops = max(result["ops"], 1)
    per: dict = {
        "attempts_per_s": result["ops_per_s"],
        "wal_bytes": (after["database"]["wal_bytes"] - before["database"]["wal_bytes"]) / ops,
        "postgres_cpu_ms": (after["postgres_cpu_s"] - before["postgres_cpu_s"]) * 1000 / ops,
    }
    for service in SCHEMAS:
        a, b = after["database"][service], before["database"][service]
        per[service] = {
            "transactions": (after["commits"][service] - before["commits"][service]) / ops,
            "rows_written": (a["inserted"] + a["updated"] + a["deleted"] - b["inserted"] - b["updated"] - b["deleted"])
            / ops,
            "table_bytes": (a["bytes"] - b["bytes"]) / ops,
            "cpu_ms": result["cpu_ms_per_op"][service],
        }
    report = {
        "per_attempt": per,
        "waits": result.get("waits", {}),
        "load_average": load_average(),
        "failures": result["failures"],
        "args": vars(args),
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print_model(report, args.primary_cores, args.replica_cores)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


def print_model(report: dict, primary_cores: int, replica_cores: int) -> None:
    per = report["per_attempt"]
    print(f"\nmeasured {report['measured']}, load average {report['load_average']}, {report['failures']} failed")
    print(f"  attempts/s at {report['args']['concurrency']} in flight: {per['attempts_per_s']:.0f}")
    print("  per attempt:")
    for service in SCHEMAS:
        s = per[service]
        print(
            f"    {service:<10} {s['transactions']:.2f} transactions, {s['rows_written']:.1f} rows written, "
            f"{s['table_bytes']:.0f} table bytes, {s['cpu_ms']:.2f} ms CPU"
        )
    print(f"    WAL        {per['wal_bytes']:.0f} bytes")
    print(f"    PostgreSQL {per['postgres_cpu_ms']:.2f} ms CPU (every server process)")
    lock = report["waits"].get("lock_share")
    if lock is not None:
        print(f"  lock wait: {lock:.1%} of transaction time")
    if per["postgres_cpu_ms"] <= 0:
        return
    ceiling = primary_cores * 1000 / per["postgres_cpu_ms"]
    print(f"\nmodel: a primary of {primary_cores} cores, its CPU the limit")
    print(f"  attempts/s it sustains        {ceiling:,.0f}")
    print(f"  WAL it writes then            {ceiling * per['wal_bytes'] / 2**20:,.1f} MiB/s")
    print(f"  table growth then             {ceiling * sum(per[s]['table_bytes'] for s in SCHEMAS) / 2**20:,.1f} MiB/s")
    replicas = {s: math.ceil(ceiling * per[s]["cpu_ms"] / 1000 / replica_cores) for s in SCHEMAS}
    print(
        f"  replicas of {replica_cores} cores        "
        + ", ".join(f"{s} {n}" for s, n in replicas.items())
        + f" (connections: {POOL_SIZE * sum(replicas.values())} at {POOL_SIZE} per process)"
    )


if __name__ == "__main__":
    sys.exit(main())
