"""Fault injection at named points, for the crash and lost-reply tests.

Off unless the process was started with FUNNEL_FAULTS set, e.g.
    FUNNEL_FAULTS="lifecycle.after_commit_before_reply:drop:2,completion.outbox_retry:crash:1"
which drops the reply the 2nd time the first point is reached and kills the process
(SIGKILL: no cleanup, no flush) the 1st time the second one is. No default
configuration sets it.

FUNNEL_FAULTS_FILE names a file holding the same kind of spec instead; it is
re-read whenever it changes (hit counts start again from zero), so that a test
can re-arm a long-lived process between runs without restarting it. An empty
or missing file disarms it.

Every fault that fires is logged (WARNING, "fault injected: ...") before it acts,
so that a test can count the faults it injected from the service's log.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

ENV = "FUNNEL_FAULTS"
FILE_ENV = "FUNNEL_FAULTS_FILE"

POINTS = frozenset(
    {
        # completion_service
        "completion.after_commit_before_settle",
        "completion.after_settle_before_publish",
        "completion.outbox_retry",
        "completion.transcript_repair",
        # lifecycle_service
        "lifecycle.before_commit",
        "lifecycle.after_commit_before_reply",
        "lifecycle.between_parent_and_propagation",
    }
)
ACTIONS = frozenset({"crash", "drop"})


class DroppedReply(Exception):
    """The reply of this call is lost: the caller sees UNAVAILABLE."""


class Faults:
    def __init__(self, plan: dict[str, tuple[str, int]] | None = None) -> None:
        self._plan = dict(plan or {})
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()

    def hit(self, point: str) -> None:
        planned = self._plan.get(point)
        if planned is None:
            return
        action, nth = planned
        with self._lock:
            self._hits[point] = count = self._hits.get(point, 0) + 1
        if count != nth:
            return
        log.warning("fault injected: %s:%s:%d", point, action, nth)
        if action == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        raise DroppedReply(point)


def parse(spec: str) -> Faults:
    plan = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        try:
            point, action, nth = item.split(":")
            count = int(nth)
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} is not point:action:nth") from None
        if point not in POINTS or action not in ACTIONS or count < 1:
            raise ValueError(f"{ENV}: unknown point or action in {item!r}; points: {sorted(POINTS)}")
        plan[point] = (action, count)
    return Faults(plan)


class FileFaults(Faults):
    """Faults planned in a file, re-read (and counted afresh) whenever it changes."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._seen: tuple[int, int, int] | None = None

    def hit(self, point: str) -> None:
        try:
            stat = os.stat(self._path)
            seen: tuple[int, int, int] | None = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            seen = None
        with self._lock:
            if seen != self._seen:
                self._seen = seen
                self._plan, self._hits = self._read(seen), {}
        super().hit(point)

    def _read(self, seen: tuple[int, int, int] | None) -> dict[str, tuple[str, int]]:
        if seen is None:
            return {}
        try:
            with open(self._path, encoding="utf-8") as file:
                return parse(file.read())._plan
        except (OSError, ValueError) as exc:
            log.error("%s: %s; faults disarmed", FILE_ENV, exc)
            return {}


def from_environment() -> Faults:
    if os.environ.get(FILE_ENV):
        return FileFaults(os.environ[FILE_ENV])
    return parse(os.environ.get(ENV, ""))


NO_FAULTS = Faults()
