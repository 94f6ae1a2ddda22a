"""Durability at start (issue 5 §7): both services run SQLite in WAL mode with
synchronous=FULL and pass PRAGMA integrity_check before they serve; a corrupt
database file, a file that is not a database, or a schema newer than the code
makes the real CLI process exit non-zero with one clear line on stderr
("<service> refuses to start: …"), without touching the file."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from completion_service.storage.sqlite import MIGRATIONS_PACKAGE as COMPLETION_MIGRATIONS
from funnel.runtime import sqlite as runtime_sqlite
from funnel.runtime.sqlite import Database, migrations_in
from funnel.runtime.storage_errors import StorageRefused
from funnel_cli.supervisor import completion_tls_arguments, lifecycle_tls_arguments
from lifecycle_service.storage.sqlite import MIGRATIONS_PACKAGE as LIFECYCLE_MIGRATIONS
from tests import credentials
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


def run_cli(service: str, database: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", service, "--listen", "127.0.0.1:0", "--database", str(database)]
    if service == "completion_service":
        args += ["--lifecycle-address", "127.0.0.1:1", *completion_tls_arguments(credentials.PKI)]
    else:
        args += lifecycle_tls_arguments(credentials.PKI)
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


def table_pages_in_the_middle(path: Path) -> list[int]:
    """Pages (1-based) in the middle of the file that hold table or index b-tree data
    (cells: the unused area of an empty b-tree's page is never read, so damage there
    is not damage)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages = [
            row[0]
            for row in db.execute(
                "SELECT pageno FROM dbstat WHERE name NOT LIKE 'sqlite_%' AND ncell > 0 ORDER BY pageno"
            )
        ]
    finally:
        db.close()
    assert len(pages) >= 4, pages
    middle = len(pages) // 2
    return pages[middle : middle + 2]


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
def test_a_database_with_corrupt_pages_refuses_to_start(service, databases, tmp_path):
    corrupt = tmp_path / "corrupt.sqlite3"
    data = bytearray(databases[service].read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    for page in table_pages_in_the_middle(databases[service]):
        start = (page - 1) * page_size + page_size // 4
        data[start : start + page_size // 2] = b"\xa5" * (page_size // 2)
    corrupt.write_bytes(data)
    before = digest(corrupt)
    result = run_cli(service, corrupt, tmp_path)
    assert_refused(result, service)
    # Either integrity_check lists the damage, or SQLite stops at the first damaged page.
    assert "failed its integrity check" in result.stderr or "malformed" in result.stderr, result.stderr
    assert digest(corrupt) == before, "the refusing service changed the file"


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
