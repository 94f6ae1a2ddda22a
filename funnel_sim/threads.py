"""The SQLite connections' threads (aiosqlite's, one per connection) under virtual
time, deterministic.

A thread runs on real time, and both what it reads of the program's state (the
writer's queue of pending writes, which the event loop appends to) and when its
answers reach the loop would depend on how fast it runs. So the threads run in
lockstep with the loop: handing a job to a connection's thread waits, the loop
blocked, until the thread has run it and posted its answers; nothing else runs
meanwhile, so the job sees the state it was handed in. The answers are held by
the loop (VirtualTimeLoop.call_soon_threadsafe) and delivered after a seeded
virtual delay, the time the job takes on the database: meanwhile the loop goes
on, writes pile up behind a group on its way (group commit), and a crash can
come between a commit and its answer, as on a real database.

The hook is aiosqlite's job queue (`aiosqlite.core.SimpleQueue`, what each
Connection hands its thread work through; the version range is pinned in
pyproject.toml, and funnel.runtime.sqlite relies on the same queue), replaced
for the length of a simulation by one that waits."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import aiosqlite.core

from funnel_sim.loop import VirtualTimeLoop

# Real seconds a database thread may take over one job before the run is declared hung.
JOB_LIMIT_SECONDS = 60.0


class ThreadHung(Exception):
    """A database thread did not finish a job in JOB_LIMIT_SECONDS of real time."""


class Lockstep:
    """The threads of one simulation: the seeded virtual time each job takes, and
    every queue made meanwhile (to tell, at the end, which connection was left open)."""

    def __init__(self, rng: random.Random, job_seconds: float) -> None:
        self._rng = rng
        self._job_seconds = job_seconds
        self.queues: list[LockstepQueue] = []

    def job_took(self) -> float:
        return self._rng.uniform(0, self._job_seconds)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Every aiosqlite connection made meanwhile hands its thread work in lockstep."""
        lockstep = self

        class Bound(LockstepQueue):
            def __init__(self) -> None:
                super().__init__(lockstep)

        namespace = vars(aiosqlite.core)  # where Connection looks its queue's class up
        original, namespace["SimpleQueue"] = namespace["SimpleQueue"], Bound
        try:
            yield
        finally:
            namespace["SimpleQueue"] = original
            self._stop_threads_left()

    def _stop_threads_left(self) -> None:
        """Ends the threads of connections never closed (a run that failed half-way, or
        the defect `unwound` reports): they are not daemons, and would keep the process
        from exiting. Straight on the queue: the loop they answered is gone."""
        for left in self.queues:
            if left.worker is not None and left.worker.is_alive():
                left._stopping = True
                queue.SimpleQueue.put(left, (None, lambda: aiosqlite.core._STOP_RUNNING_SENTINEL))
                left.worker.join(JOB_LIMIT_SECONDS)

    def open_connections(self) -> int:
        """How many connection threads are still running (never closed)."""
        return sum(1 for q in self.queues if q.worker is not None and q.worker.is_alive())


class LockstepQueue(queue.SimpleQueue[Any]):
    """A connection's job queue whose put() returns once the thread has run the job
    (it came back for the next one, or ended after the stop job), then has the loop
    deliver the job's answers after the job's virtual time."""

    def __init__(self, lockstep: Lockstep) -> None:
        super().__init__()
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop), "lockstep threads need the simulation's loop"
        self._loop = loop
        self._lockstep = lockstep
        self._turns = threading.Condition()
        self._given = 0
        # get() calls by the thread: one more than the jobs it has finished.
        self._asked = 0
        self._stopping = False
        self.worker: threading.Thread | None = None
        lockstep.queues.append(self)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self._turns:
            self.worker = threading.current_thread()
            self._asked += 1
            self._turns.notify_all()
        return super().get(block, timeout)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._stopping:  # the thread ends or ended: the job is never run (as with aiosqlite's own queue)
            super().put(item)
            return
        future, function = item
        super().put((future, self._watched(function)))
        with self._turns:
            self._given += 1
            finished = self._turns.wait_for(lambda: self._asked > self._given or self._stopping, JOB_LIMIT_SECONDS)
        if not finished:
            raise ThreadHung(f"a database thread did not finish a job in {JOB_LIMIT_SECONDS} s")
        if self._stopping and self.worker is not None:
            self.worker.join(JOB_LIMIT_SECONDS)  # it posts its last answer, then ends
        self._loop.deliver_posted(self._lockstep.job_took())

    def put_nowait(self, item: Any) -> None:
        self.put(item)

    def _watched(self, function: Callable[[], Any]) -> Callable[[], Any]:
        def job() -> Any:
            result = function()
            if result is aiosqlite.core._STOP_RUNNING_SENTINEL:  # the thread ends after this job
                with self._turns:
                    self._stopping = True
                    self._turns.notify_all()
            return result

        return job
