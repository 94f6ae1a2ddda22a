"""A throwaway PostgreSQL for the test session, with nothing installed by hand:
the `pgserver` wheel ships PostgreSQL 16 and starts it in a second or two (one
server per test process, under a temporary directory, stopped at exit).
`FUNNEL_TEST_POSTGRES_DSN` points the suite at an existing server instead.

Each test that wants a database gets a new, empty one (`fresh_database()`)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import urllib.parse
import uuid

import psycopg

DSN_VARIABLE = "FUNNEL_TEST_POSTGRES_DSN"


@functools.cache
def server_url() -> str:
    existing = os.environ.get(DSN_VARIABLE)
    if existing:
        return existing
    # pgserver asks platformdirs for a runtime directory when imported, which warns
    # when XDG_RUNTIME_DIR is unset, as in containers and CI.
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="funnel-test-run-"))
    import pgserver  # the embedded server; only needed when none is given

    directory = tempfile.mkdtemp(prefix="funnel-test-pg-")
    atexit.register(shutil.rmtree, directory, True)
    server = pgserver.get_server(directory, cleanup_mode="stop")
    url = str(server.get_uri())
    # A throwaway server: commits need not survive an operating-system crash, and
    # skipping the flushes makes each new database and each commit much cheaper.
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    return url


def with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def fresh_database() -> str:
    """The URL of a new, empty database on the session's server."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(server_url(), name)
