"""Durability at start (issue 5 §7, issue 13): both services run SQLite in WAL
mode with synchronous=FULL; a file that is not a database, a schema newer than
the code, a database that declines WAL or synchronous=FULL, or a damaged end of
a table (what start-up checks in time independent of the file's size) makes the
real CLI process exit non-zero with one clear line on stderr ("<service> refuses
to start: …"), without touching the file. Damage deeper inside is found by the
full integrity check the service runs after it serves: health turns NOT_SERVING,
writes are refused, the log and the metrics say so."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from completion_service.storage.sqlite import MIGRATIONS_PACKAGE as COMPLETION_MIGRATIONS
from completion_service.storage.sqlite import SqliteCompletionStore
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime import sqlite as runtime_sqlite
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.metrics import ServiceMetrics
from funnel.runtime.server import check_integrity_after_start
from funnel.runtime.sqlite import Database, migrations_in
from funnel.runtime.storage_errors import StorageRefused, StorageUnavailable
from funnel_cli.supervisor import ServiceProcess, completion_tls_arguments, lifecycle_tls_arguments, spawn
from lifecycle_service.storage.sqlite import MIGRATIONS_PACKAGE as LIFECYCLE_MIGRATIONS
from lifecycle_service.storage.sqlite import SqliteLifecycleStore
from tests import credentials
from tests.prometheus import scrape, value
from tests.reliability.harness import Pair
from tests.reliability.workload import Workload, drain

SERVICES = ["lifecycle_service", "completion_service"]
START_TIMEOUT = 30


@pytest.fixture(scope="module")
def databases(tmp_path_factory) -> dict[str, Path]:
    """Real database files of both services, written by the real processes
    through a small workload, checkpointed after a clean stop."""
    directory = tmp_path_factory.mktemp("real")

    async def fill() -> None:
        pair = await Pair(directory).start()
        try:
            for seed in range(3):
                await Workload(pair, seed, f"ws-{seed}").run()
                assert await drain(pair, f"ws-{seed}")
        finally:
            await pair.stop()

    asyncio.run(fill())
    files = {
        "lifecycle_service": directory / "lifecycle.sqlite3",
        "completion_service": directory / "completion.sqlite3",
    }
    for path in files.values():
        db = sqlite3.connect(path)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
    return files


def service_arguments(service: str, database: Path) -> list[str]:
    args = ["--listen", "127.0.0.1:0", "--database", str(database)]
    if service == "completion_service":
        return [*args, "--lifecycle-address", "127.0.0.1:1", *completion_tls_arguments(credentials.PKI)]
    return [*args, *lifecycle_tls_arguments(credentials.PKI)]


def run_cli(service: str, database: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", service, *service_arguments(service, database)]
    return subprocess.run(args, capture_output=True, text=True, timeout=START_TIMEOUT, cwd=tmp_path)


def assert_refused(result: subprocess.CompletedProcess, service: str, *phrases: str) -> None:
    assert result.returncode != 0, result
    assert "serving on" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    refusal = [line for line in lines if line.startswith(f"{service} refuses to start: ")]
    assert refusal, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for phrase in phrases:
        assert phrase in refusal[0], refusal[0]
    assert len(refusal[0]) < 600, f"the refusal is not one readable line: {refusal[0]!r}"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def table_leaves(path: Path) -> list[int]:
    """The leaf pages (1-based) of the service's table with the most of them, in key
    order: the first and last are its ends, which start-up reads; the others lie
    deep inside, where only the full integrity check looks."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        [(table,)] = db.execute(
            "SELECT s.name FROM dbstat AS s JOIN sqlite_schema AS t ON t.name = s.name AND t.type = 'table' "
            "WHERE s.pagetype = 'leaf' AND s.name NOT LIKE 'sqlite_%' GROUP BY s.name ORDER BY count(*) DESC LIMIT 1"
        ).fetchall()
        # dbstat's path is fixed-width hex per level: its order is the b-tree's.
        pages = [
            row[0]
            for row in db.execute(
                "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY path", (table,)
            )
        ]
    finally:
        db.close()
    assert len(pages) >= 5, f"{table} has too few leaves to have a middle: {pages}"
    return pages


def damaged_copy(source: Path, target: Path, page: int) -> Path:
    """A copy of `source` whose page `page` has its header and cell pointers overwritten."""
    data = bytearray(source.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    start = (page - 1) * page_size
    data[start : start + page_size // 2] = b"\xa5" * (page_size // 2)
    target.write_bytes(data)
    return target


@pytest.mark.parametrize("service", SERVICES)
def test_a_started_service_runs_wal(service, databases):
    db = sqlite3.connect(databases[service])
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()


@pytest.mark.parametrize("package", [LIFECYCLE_MIGRATIONS, COMPLETION_MIGRATIONS])
async def test_an_opened_database_runs_wal_with_synchronous_full(package, tmp_path):
    database = await Database.open(str(tmp_path / "db.sqlite3"), migrations_in(package))
    try:
        journal, synchronous = await database.run(
            lambda db: (db.execute("PRAGMA journal_mode").fetchone()[0], db.execute("PRAGMA synchronous").fetchone()[0])
        )
    finally:
        await database.close()
    assert (journal, synchronous) == ("wal", 2)  # 2 = FULL


@pytest.mark.parametrize("service", SERVICES)
def test_a_damaged_end_of_a_table_refuses_to_start(service, databases, tmp_path):
    last_leaf = table_leaves(databases[service])[-1]
    corrupt = damaged_copy(databases[service], tmp_path / "corrupt.sqlite3", last_leaf)
    before = digest(corrupt)
    result = run_cli(service, corrupt, tmp_path)
    assert_refused(result, service, "is damaged", "restore the file from a backup")
    assert digest(corrupt) == before, "the refusing service changed the file"


def test_start_up_reads_each_table_end_through_its_key_without_a_sort_or_a_scan(databases):
    """What makes start-up independent of the file's size: each probe walks one
    path of a b-tree (SEARCH or SCAN without a sort, stopped by LIMIT 1)."""
    for path in databases.values():
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            probes = runtime_sqlite._table_edges(db)
            assert len(probes) >= 8
            for table, query in probes:
                # In key order, a scan stops at its first row; a sort would read them all.
                plan = " | ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {query}"))
                assert "TEMP B-TREE" not in plan and query.endswith("LIMIT 1"), (table, query, plan)
        finally:
            db.close()


async def health_status(address: str, identity: str | None) -> int:
    async with credentials.tls_channel(address, identity=identity) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[attr-defined]
        try:
            return (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status
        except grpc.aio.AioRpcError as error:  # before the first probe has reported
            assert error.code() == grpc.StatusCode.NOT_FOUND, error
            return health_pb2.HealthCheckResponse.UNKNOWN


def integrity_checks(url: str, result: str) -> float | None:
    return value(scrape(url), "funnel_db_integrity_checks_total", result=result)


def start_service(service: str, database: Path, tmp_path: Path, *more: str) -> ServiceProcess:
    args = [*service_arguments(service, database), "--health-interval", "0.2", "--metrics-listen", "127.0.0.1:0", *more]
    return spawn(service, service, args, tmp_path / f"{service}.log")


FOUND_WITHIN = 30.0


async def until_damage_is_found(process: ServiceProcess, identity: str | None) -> None:
    """Waits (FOUND_WITHIN at most) for the service's health to turn NOT_SERVING."""
    deadline = time.monotonic() + FOUND_WITHIN
    while await health_status(process.address, identity) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline, "health never turned NOT_SERVING"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("service", SERVICES)
async def test_damage_deep_inside_a_table_is_found_after_the_service_serves(service, databases, tmp_path):
    leaves = table_leaves(databases[service])
    corrupt = damaged_copy(databases[service], tmp_path / "corrupt.sqlite3", leaves[len(leaves) // 2])
    identity = "completion-identity" if service == "lifecycle_service" else None
    process = start_service(service, corrupt, tmp_path)  # it serves: start-up does not read the middle
    try:
        await until_damage_is_found(process, identity)
        assert process.metrics_url is not None
        assert integrity_checks(process.metrics_url, "damaged") == 1.0
        assert integrity_checks(process.metrics_url, "ok") == 0.0
        if service == "lifecycle_service":  # a write through the real service is refused, with the reason
            async with credentials.tls_channel(process.address) as channel:
                stub = lifecycle_grpc.TaskLifecycleServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.RegisterTask(
                        lifecycle_messages.RegisterTaskRequest(
                            workspace_id="ws-damaged",
                            task_id="t-1",
                            request_id="r-1",
                            cause=lifecycle_types.Cause(source="host", reason="planned"),
                        ),
                        timeout=5,
                    )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(refused.value).reason == "STORAGE_UNAVAILABLE"
            assert "failed its integrity check" in refused.value.details()
    finally:
        process.stop()
    log = (tmp_path / f"{service}.log").read_text()
    assert "integrity check found damage" in log and "ERROR" in log, log[-3000:]
    # The offline check finds it too.
    check = subprocess.run(
        [sys.executable, "-m", "funnel_cli.main", "check", str(corrupt)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    assert check.returncode != 0 and "DAMAGED" in check.stdout, check


@pytest.mark.parametrize("service", SERVICES)
async def test_the_integrity_check_after_start_can_be_turned_off(service, databases, tmp_path):
    leaves = table_leaves(databases[service])
    corrupt = damaged_copy(databases[service], tmp_path / "corrupt.sqlite3", leaves[len(leaves) // 2])
    identity = "completion-identity" if service == "lifecycle_service" else None
    twin = damaged_copy(databases[service], tmp_path / "twin.sqlite3", leaves[len(leaves) // 2])
    (tmp_path / "on").mkdir()
    process = start_service(service, corrupt, tmp_path, "--integrity-check", "off")
    # Beside it, the same damage with the check on: once the twin has found it, so
    # would the service have, had its check run (no fixed wait sized for some machine).
    checked = start_service(service, twin, tmp_path / "on")
    try:
        await until_damage_is_found(checked, identity)
        assert await health_status(process.address, identity) == health_pb2.HealthCheckResponse.SERVING
        assert process.metrics_url is not None
        assert integrity_checks(process.metrics_url, "damaged") == integrity_checks(process.metrics_url, "ok") == 0.0
    finally:
        checked.stop()
        process.stop()
    assert "integrity check" not in (tmp_path / f"{service}.log").read_text()


@pytest.mark.parametrize("service", SERVICES)
async def test_a_sound_database_passes_its_integrity_check_after_start(service, databases, tmp_path):
    copy = tmp_path / "sound.sqlite3"
    copy.write_bytes(databases[service].read_bytes())
    process = start_service(service, copy, tmp_path)
    try:
        assert process.metrics_url is not None
        deadline = time.monotonic() + FOUND_WITHIN
        while integrity_checks(process.metrics_url, "ok") != 1.0:
            assert time.monotonic() < deadline, "the integrity check never reported"
            await asyncio.sleep(0.1)
        assert integrity_checks(process.metrics_url, "damaged") == 0.0
    finally:
        process.stop()
    assert "integrity check passed" in (tmp_path / f"{service}.log").read_text()


@pytest.mark.parametrize("store", [SqliteLifecycleStore, SqliteCompletionStore])
async def test_once_damage_is_known_the_store_refuses_every_write(store, databases, tmp_path):
    source = databases["lifecycle_service" if store is SqliteLifecycleStore else "completion_service"]
    leaves = table_leaves(source)
    corrupt = damaged_copy(source, tmp_path / "corrupt.sqlite3", leaves[len(leaves) // 2])
    opened = await store.open(str(corrupt))
    try:
        await opened.check_writable()  # nothing known yet
        damage = await opened.check_integrity()
        assert damage is not None and "failed its integrity check" in damage
        with pytest.raises(StorageUnavailable, match="failed its integrity check"):
            await opened.write(lambda tx: None)
        with pytest.raises(StorageUnavailable, match="failed its integrity check"):
            await opened.check_writable()
    finally:
        await opened.close()


@pytest.mark.parametrize("service", SERVICES)
def test_a_file_of_garbage_refuses_to_start(service, tmp_path):
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(hashlib.sha512(b"not a database").digest() * 128)
    before = digest(garbage)
    result = run_cli(service, garbage, tmp_path)
    assert_refused(result, service, "is unusable", "not a database")
    assert digest(garbage) == before


@pytest.mark.parametrize("service", SERVICES)
def test_a_schema_newer_than_the_code_refuses_to_start(service, databases, tmp_path):
    newer = tmp_path / "newer.sqlite3"
    newer.write_bytes(databases[service].read_bytes())
    db = sqlite3.connect(newer)
    db.execute("PRAGMA user_version = 999")
    db.close()
    before = digest(newer)
    result = run_cli(service, newer, tmp_path)
    assert_refused(result, service, "schema version 999", "newer than this code")
    assert digest(newer) == before


# SQLite itself decides whether WAL and synchronous=FULL took effect; a stand-in
# connection that declines them shows that the real CLI refuses to run without.
DECLINING = textwrap.dedent(
    """
    import sys
    from funnel.runtime import sqlite as runtime

    class Declining:
        def __init__(self, db):
            self._db = db

        def execute(self, sql, *args):
            if sql == {pragma!r}:
                self._db.execute(sql, *args)
                return self._db.execute("SELECT ?", ({answer!r},))
            return self._db.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._db, name)

    prepare = runtime._prepare
    runtime._prepare = lambda db, *args: prepare(Declining(db), *args)
    sys.argv[0] = {service!r}
    from {service}.server import main
    main(sys.argv[1:])
    """
)


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(
    "pragma, answer, phrase",
    [
        ("PRAGMA journal_mode=WAL", "delete", "cannot run in WAL mode"),
        ("PRAGMA synchronous", 1, "did not accept synchronous=FULL"),
    ],
)
def test_a_database_that_declines_wal_or_synchronous_full_refuses_to_start(service, pragma, answer, phrase, tmp_path):
    script = DECLINING.format(pragma=pragma, answer=answer, service=service)
    args = [sys.executable, "-c", script, "--listen", "127.0.0.1:0", "--database", str(tmp_path / "db.sqlite3")]
    if service == "completion_service":
        args += ["--lifecycle-address", "127.0.0.1:1", *completion_tls_arguments(credentials.PKI)]
    else:
        args += lifecycle_tls_arguments(credentials.PKI)
    result = subprocess.run(args, capture_output=True, text=True, timeout=START_TIMEOUT, cwd=Path.cwd())
    assert_refused(result, service, phrase)


async def test_stopping_ends_a_running_integrity_check_at_once(tmp_path, monkeypatch):
    """A service stopping while its integrity check reads a large file must not wait
    for the whole file (found at one million tasks: the stop outlasted its grace)."""
    path = tmp_path / "large.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE filler (id INTEGER PRIMARY KEY, body BLOB)")
    db.executemany("INSERT INTO filler (body) VALUES (randomblob(400))", ([] for _ in range(400_000)))
    db.commit()
    db.close()
    # What the check's own thread saw: its statement started, then how it ended.
    reading, ended = threading.Event(), []
    check_on_its_thread = runtime_sqlite._integrity_problems

    def watched(db: sqlite3.Connection) -> list[str]:
        db.set_trace_callback(lambda sql: reading.set())  # called once the statement runs
        try:
            ended.append(check_on_its_thread(db))
        except sqlite3.OperationalError as error:
            ended.append(str(error))
            raise
        return ended[-1]

    monkeypatch.setattr(runtime_sqlite, "_integrity_problems", watched)
    database = await Database.open(str(path), [])
    try:
        check = asyncio.ensure_future(database.check_integrity())
        assert await asyncio.to_thread(reading.wait, 60), "the check never started reading"
        check.cancel()
        with pytest.raises(asyncio.CancelledError):
            await check
        # Interrupted mid-file, not read to its end (which would have returned [], a sound file).
        assert ended == ["interrupted"]
    finally:
        await database.close()


async def test_an_integrity_check_stopped_while_it_opens_the_file_waits_for_the_opening(tmp_path, monkeypatch):
    """Stopped (a service stopping just after it started) while its connection's
    thread still opens the file, the check ends only once that thread has answered:
    else the thread answers an event loop that may be closed by then (an exception
    on the thread, seen on a loaded machine at the end of short tests)."""
    database = await Database.open(str(tmp_path / "db.sqlite3"), [])
    opening, may_open = threading.Event(), threading.Event()
    connect = sqlite3.connect

    def held_open(location, *args, **kwargs):
        if "mode=ro" in str(location):  # the check's own connection, not the database's
            opening.set()
            assert may_open.wait(60)
        return connect(location, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", held_open)
    try:
        check = asyncio.ensure_future(database.check_integrity())
        assert await asyncio.to_thread(opening.wait, 60)
        check.cancel()
        for _ in range(10):  # the cancellation reaches the check, which would end at once
            await asyncio.sleep(0)
        ended_while_opening = check.done()
        may_open.set()
        with pytest.raises(asyncio.CancelledError):
            await check
        assert not ended_while_opening
    finally:
        may_open.set()
        await database.close()


async def test_a_write_that_meets_damage_refuses_the_writes_after_it(tmp_path):
    database = await Database.open(str(tmp_path / "db.sqlite3"), migrations_in(LIFECYCLE_MIGRATIONS))

    def meets_a_damaged_page(db: sqlite3.Connection) -> None:
        damage = sqlite3.DatabaseError("database disk image is malformed")
        damage.sqlite_errorcode = sqlite3.SQLITE_CORRUPT  # what SQLite sets when a page fails its checks
        raise damage

    try:
        with pytest.raises(StorageUnavailable, match="is damaged"):
            await database.write(meets_a_damaged_page)
        with pytest.raises(StorageUnavailable, match="writes are refused"):
            await database.write(lambda db: None)
        with pytest.raises(StorageUnavailable, match="writes are refused"):
            await database.check_writable()
    finally:
        await database.close()


def test_the_refusal_summarises_a_long_integrity_report():
    problems = [
        "*** in database main ***\n" + "\n".join(f"On tree page {n} cell 1: invalid page number" for n in range(50))
    ]
    summary = runtime_sqlite._summary(problems)
    assert summary.startswith("On tree page 0 cell 1")
    assert "(and 47 more)" in summary and len(summary) < 300


async def test_a_corrupt_database_is_refused_in_process_too(tmp_path):
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"\x00" * 100 + b"garbage" * 1000)
    with pytest.raises(StorageRefused):
        await Database.open(str(garbage), migrations_in(LIFECYCLE_MIGRATIONS))


async def test_an_integrity_check_that_cannot_run_is_tried_again_and_stops_nothing():
    """Not damage (nothing is known): the check is postponed, not counted, and an
    unexpected failure does not escape into the Background that owns the other loops."""
    outcomes: list[BaseException | None] = [StorageUnavailable("database is locked"), RuntimeError("surprise"), None]

    async def check() -> str | None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return None

    metrics = ServiceMetrics()
    await asyncio.wait_for(check_integrity_after_start(check, metrics, retry_interval=0.01), timeout=10)
    assert outcomes == []
    assert metrics.registry.get_sample_value("funnel_db_integrity_checks_total", {"result": "ok"}) == 1.0
    assert metrics.registry.get_sample_value("funnel_db_integrity_checks_total", {"result": "damaged"}) == 0.0
