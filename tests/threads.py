"""The threads of SQLite connections: aiosqlite runs each on a thread of its own."""

from __future__ import annotations

import threading
import time


def database_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}


def database_threads_left(before: set[threading.Thread], wait: float = 5.0) -> list[str]:
    """The names of database threads started since `before` that still run after
    `wait` seconds (a closed connection's thread ends just after its close)."""
    deadline = time.monotonic() + wait
    while (left := database_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sorted(t.name for t in left)
