"""Hostile input (issue 5, item 6): at least 10,000 adversarial but well-formed
requests across every RPC of both services (TaskLifecycleService's 15,
CompletionService's 11 and TranscriptService's 5; the CompletionGate is served by
others), generated from one seeded random.

Ids are drawn from a pool of known ids (so that many requests reach real tasks,
runs and completions in every state, out of order), random valid ids and hostile
ones (whitespace, control, format, private-use and unassigned characters, non-NFC,
emoji, exactly 128 / 129 code points, very long); numbers from the edges of their
ranges; enums include unspecified and unknown numbers; text fields sit near and
over their documented limits; requests name the wrong workspace; page tokens are
real, bound to another listing, or forged.

Every answer must be OK or a documented business code with exactly one ErrorInfo
of the service's domain whose reason belongs to the service's catalogue and is
sent with its catalogue code; never UNKNOWN or INTERNAL. The generator knows
which requests break a documented field rule, and those must be INVALID_ARGUMENT.

Databases: in a sequential phase every rejected request (at least 500) is checked
individually: the content of every table of both SQLite files is the same before
and after it. In the concurrent phase (the bulk of the requests, in parallel from
a pool of workers) every row that changed must belong to a task, run or request
id that an accepted request touched. A separate pair of servers with a small
`max_message_bytes` shows that larger requests get RESOURCE_EXHAUSTED
(`MESSAGE_TOO_LARGE`, with ErrorInfo) without reaching a handler.

FUNNEL_HOSTILE_SEED and FUNNEL_HOSTILE_REQUESTS change the seed and the number of
requests (for example 200000 for a long run)."""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import json
import os
import random
import sqlite3
import string
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import completion_service.api.imports
from completion_service.authority.transcripts import reopen_request_id
from completion_service.errors import Reason as CompletionReason
from completion_service.server import CompletionConfig
from funnel.client.retry import stream_until_answered
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import ManualClock
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.paging import encode_token
from lifecycle_service.errors import Reason as LifecycleReason
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.e2e_support import CLOCK_START_MICROS, Funnel, eventually, query
from tests.completion.e2e_support import WS as E2E_WS

SEED = int(os.environ.get("FUNNEL_HOSTILE_SEED", "20240611"))
TOTAL_REQUESTS = int(os.environ.get("FUNNEL_HOSTILE_REQUESTS", "10000"))
# Rejected requests whose effect on both databases is checked one by one.
SEQUENTIAL_REJECTIONS = int(os.environ.get("FUNNEL_HOSTILE_SEQUENTIAL", "500"))
WORKERS = 48
CALL_TIMEOUT = 60.0
# A live watch stream is left after this long; an invalid one must fail within INVALID_WATCH_WAIT.
WATCH_WAIT = 0.25
INVALID_WATCH_WAIT = 15.0

WS = "ws-h"
OTHER_WS = "ws-o"
MAX_SAFE = 2**53 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

LIFECYCLE_RPCS = [
    "RegisterTask",
    "ActivateGeneration",
    "SuspendGeneration",
    "ResumeWithGeneration",
    "RequestCancellation",
    "SettleCancellation",
    "SettleCompletion",
    "SettleFailure",
    "SettleTimeout",
    "PropagateParentTermination",
    "SetWorkStatus",
    "GetTask",
    "ListTasks",
    "ListLifecycleEvents",
    "WatchLifecycleEvents",
]
COMPLETION_RPCS = [
    "ClaimTask",
    "RenewLease",
    "CompleteRun",
    "GetRun",
    "ListRuns",
    "RecordEvidence",
    "AttemptCompletion",
    "GetCompletion",
    "ListCompletions",
    "ListAuditLog",
    "WatchCompletionEvents",
]
TRANSCRIPT_RPCS = ["AppendTranscript", "LoadTranscript", "ExportTranscript", "ImportTranscript", "ResolveResume"]
SERVICE_OF = {
    **{rpc: "lc" for rpc in LIFECYCLE_RPCS},
    **{rpc: "cs" for rpc in COMPLETION_RPCS},
    **{rpc: "ts" for rpc in TRANSCRIPT_RPCS},
}
READ_ONLY = {
    "GetTask",
    "ListTasks",
    "ListLifecycleEvents",
    "WatchLifecycleEvents",
    "GetRun",
    "ListRuns",
    "GetCompletion",
    "ListCompletions",
    "ListAuditLog",
    "WatchCompletionEvents",
    "ExportTranscript",
    "ResolveResume",
}
Code = grpc.StatusCode
BUSINESS_CODES = {
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.ALREADY_EXISTS,
    Code.ABORTED,
    Code.FAILED_PRECONDITION,
    Code.RESOURCE_EXHAUSTED,
}
# INVALID_ARGUMENT reasons that a request with well-formed fields can still get.
SEMANTIC_INVALID = {"REQUEST_ID_REUSED", "WORK_STATUS_RESERVED", "TRANSCRIPT_LINE_INVALID"}


# -- the oracle: the documented field rules, written independently of the services ---------


def id_ok(value: str, required: bool = True) -> bool:
    """Ids are 1 to 128 code points in NFC, each a letter (L*), mark (M*), digit
    (N*) or one of `-_.:@+=~`, without `..`."""
    if value == "":
        return not required
    if len(value) > 128 or ".." in value:
        return False
    if any(ch not in "-_.:@+=~" and unicodedata.category(ch)[0] not in "LMN" for ch in value):
        return False
    return unicodedata.normalize("NFC", value) == value


HOSTILE_IDS = [
    "",
    " ",
    "a b",
    " lead",
    "trail ",
    "tab\tid",
    "new\nline",
    "cr\rid",
    "nul\x00id",
    "\x00",
    "del\x7fid",
    "c1\x85id",
    "zero\u200bwidth",
    "bom\ufeffid",
    "rtl\u202eid",
    "dev\u200d\U0001f4bb",
    "e\u0301",
    "A\u030a",
    "\u212b",
    "\u2126",
    "\ue000priv",
    "\U000f0000",
    "un\u0378assigned",
    "\uffff",
    "\U0010ffff",
    "nbsp\u00a0id",
    "ideo\u3000sp",
    "ls\u2028",
    "ps\u2029",
    "soft\u00adhyphen",
    "x" * 129,
    "\u00e9" * 129,
    "\U0001f600" * 129,
    "y" * 5000,
    "\u0644\u064e" * 70,
    "tag\U000e0041",
    # Outside the safe set: path, quoting and shell characters, symbols.
    "\U0001f600",
    "x';DROP/**/TABLE/**/tasks;--",
    "../../etc/passwd",
    "a..b",
    "..",
    "%s%n%x",
    "{}",
    "\\",
    "a.b:c/d@e",
    "\U0001f44d\U0001f3fd",
    "a/b",
    "a\\b",
    'a"b',
    "<tag>",
    "a,b",
    "a;b",
    "a*b",
    "a?b",
]
ODD_VALID_IDS = [
    "x" * 128,
    "\u00e9" * 128,
    "\ufb01",
    "\u03a9",
    "t\u00e2che-\u00e9t\u00e9",
    "\u30bf\u30b9\u30af",
    "null",
    "NaN",
    "-1",
    "0",
    "\u2460",
    "\u00c5",
    "a.b:c@e",
    "\u05d0\u05d1",
    "\u0915\u093f",
    "\u0644\u064e" * 64,
    ".",
    "a.b",
    "run_1+2=3~",
    "user@host:7",
    "-",
    "_",
]
EDGE_INTS = [
    0,
    1,
    2,
    3,
    -1,
    -2,
    7,
    100,
    MAX_SAFE,
    MAX_SAFE + 1,
    2**62,
    INT64_MAX,
    INT64_MIN,
    -MAX_SAFE,
    2**31 - 1,
    2**31,
    -(2**31),
]
EDGE_INT32 = [0, 1, 2, -1, 99, 100, 999, 1000, 1001, 5000, 2**31 - 1, -(2**31)]


def _chars(rng: random.Random, n: int) -> str:
    """n code points of a random flavour (ASCII, Latin-1, CJK, emoji, controls mixed in)."""
    flavour = rng.randrange(5)
    if flavour == 0:
        return "a" * n
    if flavour == 1:
        return "\u00e9" * n
    if flavour == 2:
        return "\u4e2d" * n
    if flavour == 3:
        return "\U0001f600" * n
    base = "ab\x00\n\t \u200b\ufeff\U0001f600\u0301\x7f"
    return "".join(rng.choice(base) for _ in range(n))


class Pick:
    """Hostile and ordinary values, each with its validity: True (the documented
    rules accept it), False (they reject it), None (either is acceptable)."""

    def __init__(self, rng: random.Random, world: World) -> None:
        self.rng = rng
        self.w = world
        # Benign requests use known ids and valid values only: they reach the
        # business rules of tasks, runs and completions in every state, in any order.
        self.benign = False

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def random_id(self) -> str:
        n = self.rng.randrange(1, 12)
        return "".join(self.rng.choice(string.ascii_letters + string.digits + "-_.") for _ in range(n))

    def any_id(self, known: list[str], required: bool = True, p_known: float = 0.6) -> tuple[str, bool]:
        if self.benign:
            if not known or (not required and self.chance(0.5)):
                return ("", True) if not required else (self.random_id(), True)
            return self.rng.choice(known), True
        r = self.rng.random()
        if not required and r < 0.25:
            value = ""
        elif r < p_known and known:
            value = self.rng.choice(known)
        elif r < p_known + 0.12:
            value = self.random_id()
        elif r < p_known + 0.2:
            value = self.rng.choice(ODD_VALID_IDS)
        else:
            value = self.rng.choice(HOSTILE_IDS)
        return value, id_ok(value, required)

    def ws(self) -> tuple[str, bool]:
        r = self.rng.random()
        if self.benign:
            return (WS if r < 0.9 else OTHER_WS), True
        if r < 0.75:
            return WS, True
        if r < 0.85:
            return OTHER_WS, True
        return self.any_id([], p_known=0.0)

    def task(self, required: bool = True) -> tuple[str, bool]:
        return self.any_id(self.w.task_ids, required)

    def run(self, required: bool = True) -> tuple[str, bool]:
        return self.any_id(self.w.run_ids, required)

    def request_id(self) -> tuple[str, bool]:
        r = self.rng.random()
        if self.benign:
            return ("", True) if r < 0.7 else (f"req-{self.rng.randrange(10**9)}", True)
        if r < 0.45:
            return "", True
        if r < 0.75:
            return f"req-{self.rng.randrange(10**9)}", True
        if r < 0.9:  # a small pool: replays and REQUEST_ID_REUSED
            return f"dup-{self.rng.randrange(40)}", True
        return self.any_id([], required=False, p_known=0.0)

    def int64(self, valid: Callable[[int], bool], typical: list[int]) -> tuple[int, bool]:
        if self.benign and typical:
            value = self.rng.choice(typical)
            return value, valid(value)
        value = self.rng.choice(typical) if self.chance(0.7) and typical else self.rng.choice(EDGE_INTS)
        return value, valid(value)

    def generation(self) -> tuple[int, bool]:
        return self.int64(lambda v: 1 <= v <= MAX_SAFE, [1, 1, 1, 2, 2, 3])

    def optional_revision(self) -> tuple[int | None, bool]:
        if self.chance(0.6) or (self.benign and self.chance(0.7)):
            return None, True
        return self.int64(lambda v: 0 <= v <= MAX_SAFE, [0, 1, 2, 3, 4, 5, 6])

    def page_size(self) -> tuple[int, bool]:
        if self.benign:
            return self.rng.choice([0, 1, 2, 10]), True
        value = self.rng.choice([0, 0, 1, 2, 5, 1000] if self.chance(0.7) else EDGE_INT32)
        return value, 0 <= value <= 1000

    def text(self, limit: int, required: bool = False, near: int | None = None) -> tuple[str, bool]:
        """Free text judged against `limit`, with lengths around `near` (default: the limit)."""
        near = limit if near is None else near
        r = self.rng.random()
        if self.benign:
            r = 0.3 + 0.45 * r  # short, non-empty text
        if r < 0.3:
            value = ""
        elif r < 0.75:
            value = _chars(self.rng, self.rng.randrange(1, 40))
        elif r < 0.9:
            value = _chars(self.rng, near)
        elif r < 0.98:
            value = _chars(self.rng, near + 1)
        else:
            value = _chars(self.rng, min(near * 2, near + 70_000))
        if value == "":
            return value, not required
        return value, len(value) <= limit

    def enum(self, allowed: list[int], optional: bool = False) -> tuple[int, bool]:
        if self.benign or self.chance(0.75):
            value = self.rng.choice(allowed)
        else:
            value = self.rng.choice([0, 0, 6, 42, 99, -1, 2**31 - 1, -(2**31)])
        return value, value in allowed or (optional and value == 0)

    def cause(self) -> tuple[lifecycle_types.Cause | None, bool]:
        if self.benign or self.chance(0.5):
            return None, True
        cause = lifecycle_types.Cause(source=self.text(128)[0], reason=self.text(1024)[0])
        count = self.rng.choice([0, 0, 1, 2, 16, 17]) if self.chance(0.9) else 40
        for _ in range(count):
            key, _ = self.any_id(["run_id", "completion_id", "parent_task_id"], p_known=0.5)
            cause.originating_ids[key] = self.text(256)[0]
        return cause, self._cause_ok(cause)

    @staticmethod
    def _cause_ok(cause: lifecycle_types.Cause) -> bool:
        return (
            len(cause.source) <= 128
            and len(cause.reason) <= 1024
            and len(cause.originating_ids) <= 16
            and all(id_ok(k) and len(v) <= 256 for k, v in cause.originating_ids.items())
        )

    def duration(self) -> tuple[Duration | None, bool | None]:
        r = self.rng.random()
        if self.benign:
            r = 0.05 + 0.7 * r
        if r < 0.05:
            return None, False
        if r < 0.75:
            seconds = self.rng.choice([1, 5, 60, 3600, 86400])
            return Duration(seconds=seconds), True
        seconds = self.rng.choice([0, -1, 86401, 10**6, INT64_MAX // 10**7, -(10**9), 315_576_000_000])
        nanos = self.rng.choice([0, 999_000_000, -999_999_999, 1000])
        micros = seconds * 1_000_000 + nanos // 1000
        good = 1_000_000 <= micros <= 86400 * 1_000_000
        # A duration whose nanos carry another sign than its seconds is outside the
        # WKT rules; how it is read is not documented, so either answer is fine.
        return Duration(seconds=seconds, nanos=nanos), (None if seconds * nanos < 0 else good)

    def timestamp(self) -> tuple[Timestamp | None, bool]:
        r = self.rng.random()
        if self.benign:
            r = 0.1 + 0.65 * r
        if r < 0.1:
            return None, False
        if r < 0.75:
            micros = CLOCK_START_MICROS + self.rng.randrange(-(10**9), 10**9)
            return Timestamp(seconds=micros // 10**6, nanos=(micros % 10**6) * 1000), True
        seconds = self.rng.choice([0, -1, -62135596800, -62135596801, 253402300799, 253402300800, INT64_MAX, INT64_MIN])
        nanos = self.rng.choice([0, 999_999_999, 1_000_000_000, -1, 2**31 - 1])
        return (
            Timestamp(seconds=seconds, nanos=nanos),
            -62135596800 <= seconds <= 253402300799 and 0 <= nanos <= 999_999_999,
        )


# -- the world: tasks, runs and completions in every state -------------------------------------


@dataclasses.dataclass
class World:
    f: Funnel
    ts: transcript_grpc.TranscriptServiceStub
    task_ids: list[str]
    run_ids: list[str]
    epochs: list[int]
    # Each run claimed, as (workspace, task, run, epoch): what a benign call names
    # together, so calls on runs reach their business answers whatever the load
    # (runs, tasks and epochs picked apart rarely match: AttemptCompletion was
    # answered OK 3 times in 333 calls, and 0 in 349 on a loaded machine).
    claims: list[tuple[str, str, str, int]]
    completion_ids: list[str]
    checkpoints: list[str]
    tokens: list[tuple[tuple, str]]  # ((rpc, workspace, *filters), token)
    jsonl: bytes  # an exported transcript

    def snapshot(self) -> tuple[dict, dict]:
        return dump(self.f.lifecycle_config.database), dump(self.f.completion_db)


def dump(path: str) -> dict[str, list[tuple]]:
    """The content of every table of one SQLite file (sqlite_sequence included)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    finally:
        db.close()


def columns(path: str) -> dict[str, list[str]]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [c[1] for c in db.execute(f'PRAGMA table_info("{t}")')] for t in tables}
    finally:
        db.close()


def ev(**body) -> completion_types.SessionEvent:
    return completion_types.SessionEvent(**body)


async def build_world(tmp: Path) -> World:
    clock = ManualClock(CLOCK_START_MICROS)
    f = Funnel(
        clock,
        tmp,
        LifecycleConfig(listen="127.0.0.1:0", database=str(tmp / "lifecycle.sqlite3"), health_interval=5.0),
        CompletionConfig(
            listen="127.0.0.1:0",
            database=str(tmp / "completion.sqlite3"),
            lifecycle_timeout=30.0,
            settle_interval=0.2,
            health_interval=5.0,
        ),
        {"workspaces": {OTHER_WS: {"required_evidence": ["tests"]}}},
    )
    await f.start()
    channel = credentials.insecure_channel(f.completion.address, options=[("grpc.max_receive_message_length", -1)])
    f._channels.append(channel)
    ts = transcript_grpc.TranscriptServiceStub(channel)
    day = 24 * 3600

    async def append(task: str, *events: completion_types.SessionEvent, workspace: str = WS):
        await ts.AppendTranscript(
            transcript_messages.AppendTranscriptRequest(workspace_id=workspace, task_id=task, events=list(events)),
            timeout=10,
        )

    closed_turn = [
        ev(turn_start=completion_types.TurnStart(turn_id="turn-1")),
        ev(turn_end=completion_types.TurnEnd(turn_id="turn-1", reason=completion_enums.TURN_END_REASON_COMPLETED)),
    ]
    runs: list[completion_messages.ClaimTaskResponse] = []
    completions: list[str] = []

    await f.register("t-reg", workspace=WS)
    await f.register("t-reg2", workspace=WS)  # more registered tasks: activations succeed whatever the seed
    await f.register("t-reg3", workspace=WS)
    await f.register("t-empty", workspace=WS)
    runs.append(await f.registered_and_claimed("t-act", workspace=WS, ttl_seconds=day))
    runs.append(await f.registered_and_claimed("t-short", workspace=WS, ttl_seconds=5))
    runs.append(await f.registered_and_claimed("t-done", workspace=WS, ttl_seconds=day))
    await append(
        "t-done",
        ev(checkpoint=completion_types.Checkpoint(checkpoint_id="cp-1")),
        *closed_turn,
        ev(checkpoint=completion_types.Checkpoint(checkpoint_id="cp-2")),
    )
    completions.append((await f.attempt(runs[-1])).completion.completion_id)
    runs.append(await f.registered_and_claimed("t-fence", workspace=WS, ttl_seconds=day))
    await f.request_cancellation("t-fence", workspace=WS)
    runs.append(await f.registered_and_claimed("t-cancel", workspace=WS, ttl_seconds=day))
    await f.complete_run(runs[-1], workspace=WS, outcome=completion_enums.RUN_OUTCOME_CANCELLED)
    runs.append(await f.registered_and_claimed("t-fail", workspace=WS, ttl_seconds=day))
    completions.append(
        (await f.attempt(runs[-1], outcome=completion_enums.REQUESTED_OUTCOME_FAILED)).completion.completion_id
    )
    await f.complete_run(runs[-1], workspace=WS, outcome=completion_enums.RUN_OUTCOME_STALLED)
    await f.register("t-susp", workspace=WS)
    await f.lc.ActivateGeneration(
        lifecycle_messages.ActivateGenerationRequest(workspace_id=WS, task_id="t-susp", generation=1), timeout=10
    )
    await f.lc.SuspendGeneration(
        lifecycle_messages.SuspendGenerationRequest(workspace_id=WS, task_id="t-susp", generation=1), timeout=10
    )
    runs.append(await f.registered_and_claimed("t-parent", workspace=WS, ttl_seconds=day))
    await f.register("t-child", workspace=WS, parent="t-parent")
    await f.register("t-dchild", workspace=WS, parent="t-parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    runs.append(await f.claim("t-child", workspace=WS, ttl_seconds=day))
    await f.register("t-grandchild", workspace=WS, parent="t-child")
    # A parent suspended under a registered attached child: claiming the child is refused by the lifecycle.
    await f.registered_and_claimed("t-psusp", workspace=WS, ttl_seconds=day)
    await f.register("t-pchild", workspace=WS, parent="t-psusp")
    await f.lc.SuspendGeneration(
        lifecycle_messages.SuspendGenerationRequest(workspace_id=WS, task_id="t-psusp", generation=1), timeout=10
    )
    runs.append(await f.registered_and_claimed("t-tr", workspace=WS, ttl_seconds=day))
    await append(
        "t-tr",
        ev(user_message=completion_types.UserMessage(text="fix it")),
        ev(checkpoint=completion_types.Checkpoint(checkpoint_id="cp-a")),
        ev(turn_start=completion_types.TurnStart(turn_id="turn-a")),
        ev(step_start=completion_types.StepStart(step_id="step-a")),
        ev(tool_call=completion_types.ToolCall(call_id="call-a", tool_name="bash", arguments="ls")),
    )
    runs.append(await f.registered_and_claimed("t-gen2", workspace=WS, ttl_seconds=day))
    await append("t-gen2", ev(checkpoint=completion_types.Checkpoint(checkpoint_id="cp-1")), *closed_turn)
    completions.append((await f.attempt(runs[-1])).completion.completion_id)
    await append("t-gen2", ev(user_feedback=completion_types.UserFeedback(text="not quite")))
    # The same task ids in another workspace.
    runs.append(await f.registered_and_claimed("t-act", workspace=OTHER_WS, ttl_seconds=day))
    await f.register("t-reg", workspace=OTHER_WS)
    await f.evidence(runs[-1])

    tokens = []
    for rpc, call, key in [
        (
            "ListTasks",
            f.lc.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, page_size=1)),
            ("ListTasks", WS, ""),
        ),
        (
            "ListTasks",
            f.lc.ListTasks(
                lifecycle_messages.ListTasksRequest(workspace_id=WS, page_size=1, parent_task_id="t-parent")
            ),
            ("ListTasks", WS, "t-parent"),
        ),
        (
            "ListLifecycleEvents",
            f.lc.ListLifecycleEvents(
                lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="t-done", page_size=1)
            ),
            ("ListLifecycleEvents", WS, "t-done"),
        ),
        (
            "ListRuns",
            f.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS, page_size=1)),
            ("ListRuns", WS, ""),
        ),
        (
            "ListCompletions",
            f.cs.ListCompletions(completion_messages.ListCompletionsRequest(workspace_id=WS, page_size=1)),
            ("ListCompletions", WS, ""),
        ),
        (
            "ListAuditLog",
            f.cs.ListAuditLog(completion_messages.ListAuditLogRequest(workspace_id=WS, page_size=1)),
            ("ListAuditLog", WS, "", ""),
        ),
        (
            "LoadTranscript",
            ts.LoadTranscript(
                transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="t-done", page_size=1)
            ),
            ("LoadTranscript", WS, "t-done"),
        ),
    ]:
        response = await call
        assert response.next_page_token, rpc
        tokens.append((key, response.next_page_token))
    jsonl = b""
    async for chunk in ts.ExportTranscript(
        transcript_messages.ExportTranscriptRequest(workspace_id=WS, task_id="t-done"), timeout=10
    ):
        jsonl += chunk.jsonl
    await f.lifecycle.authority.deliver_pending()
    task_ids = [
        "t-reg",
        "t-reg2",
        "t-reg3",
        "t-empty",
        "t-act",
        "t-short",
        "t-done",
        "t-fence",
        "t-cancel",
        "t-fail",
        "t-susp",
        "t-parent",
        "t-child",
        "t-dchild",
        "t-grandchild",
        "t-psusp",
        "t-pchild",
        "t-tr",
        "t-gen2",
        "t-new-1",
        "t-new-2",
    ]
    return World(
        f,
        ts,
        task_ids,
        [r.run.run_id for r in runs] + ["run_99999999"],
        [r.lease.epoch for r in runs],
        [(r.run.workspace_id, r.run.task_id, r.run.run_id, r.lease.epoch) for r in runs],
        completions + ["cmp_99999999"],
        ["cp-1", "cp-2", "cp-a", "cp-zz"],
        tokens,
        jsonl,
    )


# -- the generator: one request of a named RPC, with its validity -----------------------------


@dataclasses.dataclass
class Call:
    rpc: str
    request: Any  # a message; for ImportTranscript the list of stream messages
    valid: bool | None
    oversize: bool = False
    bad: tuple = ()

    @property
    def service(self) -> str:
        return SERVICE_OF[self.rpc]


class Generator:
    def __init__(self, rng: random.Random, world: World) -> None:
        self.rng = rng
        self.w = world
        self.p = Pick(rng, world)
        self._builders = {rpc: getattr(self, f"_{rpc}") for rpc in SERVICE_OF}

    def next(self, rpc: str | None = None) -> Call:
        rpc = rpc or self.rng.choice(list(SERVICE_OF))
        self.bad = []
        self.p.benign = self.rng.random() < 0.3
        fields, valid = self._builders[rpc]()
        call = self._finish(rpc, fields, valid)
        call.bad = tuple(self.bad)
        return call

    def _finish(self, rpc: str, request: Any, valid: bool | None) -> Call:
        if isinstance(request, list):
            size = max(m.ByteSize() for m in request) if request else 0
        else:
            size = request.ByteSize()
        return Call(rpc, request, valid, oversize=size > MAX_MESSAGE_BYTES - 64)

    # helpers

    def _collect(self, **picks: tuple[Any, bool | None]) -> tuple[dict, bool | None]:
        fields = {}
        valid: bool | None = True
        for name, (value, good) in picks.items():
            if value is not None:
                fields[name] = value
            if good is False:
                self.bad.append(name)
            valid = _and(valid, good)
        return fields, valid

    def _header(self, generation: bool = True) -> dict[str, tuple[Any, bool | None]]:
        p = self.p
        picks = {
            "workspace_id": p.ws(),
            "task_id": p.task(),
            "request_id": p.request_id(),
            "expected_revision": p.optional_revision(),
            "cause": p.cause(),
        }
        if generation:
            picks["generation"] = p.generation()
        return picks

    def _plain(self, message_type) -> tuple[Any, bool | None]:
        fields, valid = self._collect(**self._header())
        return message_type(**fields), valid

    def _token(self, key: tuple) -> tuple[str, bool | None]:
        """A page token for the listing `key`: none, real (maybe of another listing) or forged."""
        r = self.rng.random()
        if r < 0.6 or self.p.benign:
            return "", True
        if r < 0.8:
            issued_for, token = self.rng.choice(self.w.tokens)
            return token, issued_for == key
        forged = self.rng.choice(
            [
                "garbage",
                "%%%",
                "=",
                "a" * 2000,
                base64.urlsafe_b64encode(b"[" * 50_000 + b"]" * 50_000).decode(),
                base64.urlsafe_b64encode(b'{"a":' * 20_000 + b"1" + b"}" * 20_000).decode(),
                base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
                base64.urlsafe_b64encode(b"[1, 2, 3]").decode(),
                base64.urlsafe_b64encode(b'[["x"], NaN]').decode(),
                encode_token(list(key[:1]) + list(key[1:]), 10**30),
                encode_token(["tasks", WS, ""], "\x00"),
                encode_token(["events", WS, "t-done"], -5),
                encode_token(["runs", WS, ""], [2**70, "run"]),
                encode_token(["runs", WS, ""], [1, 2]),
                encode_token(["completions", WS, ""], [1.5, "c"]),
                encode_token(["audit", WS, "", ""], True),
                encode_token(["transcript", WS, "t-done"], 2**63),
            ]
        )
        return forged, None  # a forged cursor of the right type and listing is accepted

    # lifecycle

    def _RegisterTask(self):
        p = self.p
        picks = self._header(generation=False)
        picks["task_id"] = p.any_id(self.w.task_ids + [f"t-new-{self.rng.randrange(10**6)}"] * 6)
        fields, valid = self._collect(**picks)
        if self.p.chance(0.5):
            parent_id, good_parent = p.task()
            generation, good_generation = p.generation()
            mode, good_mode = p.enum(
                [lifecycle_enums.PARENT_LINK_MODE_ATTACHED, lifecycle_enums.PARENT_LINK_MODE_DETACHED]
            )
            fields["parent"] = lifecycle_types.ParentLink(task_id=parent_id, generation=generation, mode=mode)
            self_parent = parent_id != "" and parent_id == fields.get("task_id")
            valid = _and(valid, good_parent and good_generation and good_mode and not self_parent)
        return lifecycle_messages.RegisterTaskRequest(**fields), valid

    def _ActivateGeneration(self):
        picks = self._header()
        status, good = self.p.enum([1, 2, 3], optional=True)
        picks["work_status"] = (status, good)
        fields, valid = self._collect(**picks)
        return lifecycle_messages.ActivateGenerationRequest(**fields), valid

    def _SuspendGeneration(self):
        return self._plain(lifecycle_messages.SuspendGenerationRequest)

    def _ResumeWithGeneration(self):
        return self._plain(lifecycle_messages.ResumeWithGenerationRequest)

    def _RequestCancellation(self):
        return self._plain(lifecycle_messages.RequestCancellationRequest)

    def _SettleCancellation(self):
        return self._plain(lifecycle_messages.SettleCancellationRequest)

    def _SettleFailure(self):
        return self._plain(lifecycle_messages.SettleFailureRequest)

    def _SettleTimeout(self):
        return self._plain(lifecycle_messages.SettleTimeoutRequest)

    def _PropagateParentTermination(self):
        return self._plain(lifecycle_messages.PropagateParentTerminationRequest)

    def _SettleCompletion(self):
        picks = self._header()
        picks["completion_id"] = self.p.any_id(self.w.completion_ids + ["cmp-client-1"])
        picks["authoritative_time"] = self.p.timestamp()
        fields, valid = self._collect(**picks)
        return lifecycle_messages.SettleCompletionRequest(**fields), valid

    def _SetWorkStatus(self):
        picks = self._header()
        picks["work_status"] = self.p.enum([1, 2, 3])
        fields, valid = self._collect(**picks)
        return lifecycle_messages.SetWorkStatusRequest(**fields), valid

    def _GetTask(self):
        fields, valid = self._collect(workspace_id=self.p.ws(), task_id=self.p.task())
        return lifecycle_messages.GetTaskRequest(**fields), valid

    def _ListTasks(self):
        ws, parent = self.p.ws(), self.p.task(required=False)
        fields, valid = self._collect(
            workspace_id=ws,
            parent_task_id=parent,
            page_size=self.p.page_size(),
            page_token=self._token(("ListTasks", ws[0], parent[0])),
        )
        return lifecycle_messages.ListTasksRequest(**fields), valid

    def _ListLifecycleEvents(self):
        ws, task = self.p.ws(), self.p.task()
        fields, valid = self._collect(
            workspace_id=ws,
            task_id=task,
            page_size=self.p.page_size(),
            page_token=self._token(("ListLifecycleEvents", ws[0], task[0])),
        )
        return lifecycle_messages.ListLifecycleEventsRequest(**fields), valid

    def _WatchLifecycleEvents(self):
        after = self.p.int64(lambda v: v >= 0, [0, 0, 1, 5, 10**6])
        fields, valid = self._collect(
            workspace_id=self.p.ws(), task_id=self.p.task(required=False), after_sequence=after
        )
        return lifecycle_messages.WatchLifecycleEventsRequest(**fields), valid

    # completion

    def _epoch(self) -> tuple[int, bool]:
        return self.p.int64(lambda v: 1 <= v <= MAX_SAFE, self.w.epochs + [1, 2, 3])

    def _claimed(self) -> dict[str, tuple[Any, bool | None]]:
        """Workspace, task, run and epoch of one call on a run: in a benign call
        those of one claim, else each picked on its own."""
        if self.p.benign:
            workspace, task, run, epoch = self.rng.choice(self.w.claims)
            return {
                "workspace_id": (workspace, True),
                "task_id": (task, True),
                "run_id": (run, True),
                "epoch": (epoch, True),
            }
        p = self.p
        return {"workspace_id": p.ws(), "task_id": p.task(), "run_id": p.run(), "epoch": self._epoch()}

    def _ClaimTask(self):
        p = self.p
        fields, valid = self._collect(
            workspace_id=p.ws(),
            task_id=p.task(),
            agent_id=p.any_id(["agent-1", "agent-2"]),
            lease_ttl=p.duration(),
            request_id=p.request_id(),
        )
        return completion_messages.ClaimTaskRequest(**fields), valid

    def _RenewLease(self):
        p = self.p
        claimed = self._claimed()
        del claimed["task_id"]  # a renewal names the run only
        fields, valid = self._collect(**claimed, lease_ttl=p.duration(), request_id=p.request_id())
        return completion_messages.RenewLeaseRequest(**fields), valid

    def _CompleteRun(self):
        p = self.p
        picks = {
            "workspace_id": p.ws(),
            "run_id": p.run(),
            "outcome": p.enum([1, 2, 3, 4]),
            "notes": p.text(1024 * 1024) if p.chance(0.05) else p.text(1024 * 1024, near=2000),
            "error": p.text(8192),
            "final_status": p.enum([1, 2, 3, 4, 5], optional=True),
            "request_id": p.request_id(),
        }
        for field in ("tokens_input", "tokens_output", "tokens_total"):
            picks[field] = (None, True) if p.chance(0.5) else p.int64(lambda v: 0 <= v <= MAX_SAFE, [0, 10, 1500])
        fields, valid = self._collect(**picks)
        return completion_messages.CompleteRunRequest(**fields), valid

    def _GetRun(self):
        fields, valid = self._collect(workspace_id=self.p.ws(), run_id=self.p.run())
        return completion_messages.GetRunRequest(**fields), valid

    def _ListRuns(self):
        ws, task = self.p.ws(), self.p.task(required=False)
        fields, valid = self._collect(
            workspace_id=ws,
            task_id=task,
            page_size=self.p.page_size(),
            page_token=self._token(("ListRuns", ws[0], task[0])),
        )
        return completion_messages.ListRunsRequest(**fields), valid

    def _RecordEvidence(self):
        p = self.p
        fields, valid = self._collect(
            workspace_id=p.ws(),
            task_id=p.task(),
            generation=p.generation(),
            kind=p.any_id(["tests", "lint"]),
            verdict=p.enum([1, 2]),
            checkpoint=p.any_id(self.w.checkpoints, required=False),
            details=p.text(8192),
            run_id=p.run(required=False),
            request_id=p.request_id(),
        )
        return completion_messages.RecordEvidenceRequest(**fields), valid

    def _AttemptCompletion(self):
        p = self.p
        state_version = (None, True) if p.chance(0.6) else p.int64(lambda v: 0 <= v <= MAX_SAFE, [0, 1, 2, 3, 4])
        result = p.text(16384) if p.chance(0.9) else ("   ", True)
        fields, valid = self._collect(
            **self._claimed(),
            outcome=p.enum([1, 2]),
            result=result,
            state_version=state_version,
            request_id=p.request_id(),
        )
        return completion_messages.AttemptCompletionRequest(**fields), valid

    def _GetCompletion(self):
        fields, valid = self._collect(workspace_id=self.p.ws(), task_id=self.p.task(), generation=self.p.generation())
        return completion_messages.GetCompletionRequest(**fields), valid

    def _ListCompletions(self):
        ws, task = self.p.ws(), self.p.task(required=False)
        fields, valid = self._collect(
            workspace_id=ws,
            task_id=task,
            page_size=self.p.page_size(),
            page_token=self._token(("ListCompletions", ws[0], task[0])),
        )
        return completion_messages.ListCompletionsRequest(**fields), valid

    def _ListAuditLog(self):
        ws, task, run = self.p.ws(), self.p.task(required=False), self.p.run(required=False)
        fields, valid = self._collect(
            workspace_id=ws,
            task_id=task,
            run_id=run,
            page_size=self.p.page_size(),
            page_token=self._token(("ListAuditLog", ws[0], task[0], run[0])),
        )
        return completion_messages.ListAuditLogRequest(**fields), valid

    def _WatchCompletionEvents(self):
        after = self.p.int64(lambda v: v >= 0, [0, 0, 1, 5, 10**6])
        fields, valid = self._collect(
            workspace_id=self.p.ws(), task_id=self.p.task(required=False), after_sequence=after
        )
        return completion_messages.WatchCompletionEventsRequest(**fields), valid

    # transcripts

    def event(self) -> tuple[completion_types.SessionEvent, bool | None]:
        """One appended event: mostly well-formed, sometimes breaking a field rule."""
        p = self.p
        kind = self.rng.choice(
            [
                "turn_start",
                "turn_end",
                "step_start",
                "step_end",
                "tool_call",
                "tool_result",
                "user_message",
                "assistant_message",
                "checkpoint",
                "checkpoint_restore",
                "user_feedback",
                "prompt_resend",
                None,
            ]
        )
        refs = {
            "turn_start": "turn_id",
            "turn_end": "turn_id",
            "step_start": "step_id",
            "step_end": "step_id",
            "tool_call": "call_id",
            "tool_result": "call_id",
            "checkpoint": "checkpoint_id",
            "checkpoint_restore": "checkpoint_id",
        }
        texts = {
            "tool_call": "arguments",
            "tool_result": "content",
            "user_message": "text",
            "assistant_message": "text",
            "user_feedback": "text",
            "prompt_resend": "text",
        }
        if kind is None:
            return completion_types.SessionEvent(), False
        message = completion_types.SessionEvent()
        body = getattr(message, kind)
        body.SetInParent()
        valid: bool | None = True
        if kind in refs:
            ref, good = p.any_id(["turn-1", "turn-a", "step-a", "call-a", "cp-1", "cp-2", "cp-a", "k"], p_known=0.8)
            setattr(body, refs[kind], ref)
            valid = _and(valid, good)
        if kind in texts:
            text, good = p.text(1024 * 1024) if p.chance(0.03) else p.text(1024 * 1024, near=200)
            setattr(body, texts[kind], text)
            valid = _and(valid, good)
        if kind == "tool_call":
            name, good = p.text(256, required=True) if p.chance(0.3) else ("bash", True)
            body.tool_name = name
            valid = _and(valid, good)
        if kind == "tool_result":
            body.is_error = p.chance(0.3)
        if kind == "turn_end":
            reason, good = p.enum([1, 2, 3, 4])
            body.reason = reason
            valid = _and(valid, good)
        if p.chance(0.04):
            message.sequence = self.rng.choice([1, 7, -1])
            valid = False
        if p.chance(0.03):
            message.synthetic = True
            valid = False
        if p.chance(0.02):
            message.record_time.seconds = 5
            valid = False
        return message, valid

    def _AppendTranscript(self):
        p = self.p
        count = self.rng.choice([0, 1, 1, 2, 3, 5, 1000, 1001]) if p.chance(0.9) else self.rng.randrange(1, 20)
        events = []
        valid: bool | None = 1 <= count <= 1000
        if count > 20:  # large batches of one cheap, valid event each
            events = [completion_types.SessionEvent(user_message=completion_types.UserMessage(text="x"))] * count
        else:
            for _ in range(count):
                event, good = self.event()
                events.append(event)
                valid = _and(valid, good)
        expected = (None, True) if p.chance(0.7) else p.int64(lambda v: 0 <= v <= MAX_SAFE, [0, 1, 2, 3, 4])
        fields, base_valid = self._collect(
            workspace_id=p.ws(), task_id=p.task(), request_id=p.request_id(), expected_state_version=expected
        )
        return transcript_messages.AppendTranscriptRequest(events=events, **fields), _and(base_valid, valid)

    def _LoadTranscript(self):
        ws, task = self.p.ws(), self.p.task()
        fields, valid = self._collect(
            workspace_id=ws,
            task_id=task,
            page_size=self.p.page_size(),
            page_token=self._token(("LoadTranscript", ws[0], task[0])),
        )
        return transcript_messages.LoadTranscriptRequest(**fields), valid

    def _ExportTranscript(self):
        fields, valid = self._collect(workspace_id=self.p.ws(), task_id=self.p.task())
        return transcript_messages.ExportTranscriptRequest(**fields), valid

    def _ResolveResume(self):
        fields, valid = self._collect(workspace_id=self.p.ws(), task_id=self.p.task())
        return transcript_messages.ResolveResumeRequest(**fields), valid

    def _ImportTranscript(self):
        p = self.p
        messages = []
        ws, task = p.ws(), p.task()
        valid: bool | None = _and(ws[1], task[1])
        shape = self.rng.random()
        if shape < 0.05:
            valid = False  # no target at all, or the file first
            if p.chance(0.5):
                messages.append(transcript_messages.ImportTranscriptRequest(jsonl_chunk=b"{}\n"))
        else:
            messages.append(
                transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=ws[0], task_id=task[0])
                )
            )
        body = self._jsonl()
        cut = sorted(self.rng.randrange(len(body) + 1) for _ in range(self.rng.randrange(0, 4)))
        for start, end in zip([0, *cut], [*cut, len(body)], strict=True):
            messages.append(transcript_messages.ImportTranscriptRequest(jsonl_chunk=body[start:end]))
        if shape > 0.97 and messages:
            messages.append(
                transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=WS, task_id="t-empty")
                )
            )
        # The file's content is judged by the service (TRANSCRIPT_LINE_INVALID, grammar): either way.
        return messages, (None if valid else valid)

    def _jsonl(self) -> bytes:
        lines = self.w.jsonl.splitlines(keepends=True)
        r = self.rng.random()
        if r < 0.3:
            return self.w.jsonl
        if r < 0.4:
            return b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2]  # torn final line
        if r < 0.5:
            return b""
        damage = self.rng.choice(
            [
                b"not json\n",
                b"[" * 30_000 + b"]" * 30_000 + b"\n",
                b'{"a":' * 10_000 + b"1" + b"}" * 10_000 + b"\n",
                b"\xff\xfe\n",
                b"{}\n",
                b"null\n",
                b'{"sequence": 1, "generation": 1, "turn_start": {"turn_id": "x y"}}\n',
                b'{"sequence": 99, "generation": 1, "user_message": {"text": "skip"}}\n',
                b'{"sequence": 1, "generation": 0, "user_message": {}}\n',
                b'{"sequence": 1, "generation": 1, "turn_end": {"turn_id": "t", "reason": 77}}\n',
                b'{"sequence": 1, "generation": 1, "record_time": "9999-12-31T23:59:59Z", "user_message": {}}\n',
                b'{"sequence": 1, "generation": 9007199254740991, "user_message": {"text": "far"}}\n',
                b'{"sequence": 1e400, "user_message": {}}\n',
                b'{"unknown_field": 1}\n',
                b'{"sequence": 1, "generation": 1, "turn_start": {"turn_id": "\\ud800"}}\n',
                b'{"sequence": 1, "generation": 1, "tool_result": {"call_id": "nope"}}\n',
                b"\n",
                b"\r\n",
                b" " * 100 + b"\n",
            ]
        )
        where = self.rng.randrange(len(lines) + 1)
        return b"".join(lines[:where]) + damage + b"".join(lines[where:])


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


# -- sending and judging ---------------------------------------------------------------------


@dataclasses.dataclass
class Answer:
    code: grpc.StatusCode
    response: Any = None
    details: str = ""
    infos: list = dataclasses.field(default_factory=list)

    @property
    def info(self):
        return self.infos[0] if self.infos else None

    @property
    def ok(self) -> bool:
        return self.code == Code.OK


def _error_infos(error: grpc.aio.AioRpcError) -> list:
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # the status details disagree with the call's code
        return []
    found = []
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            found.append(info)
    return found


async def send(world: World, call: Call, watch_wait: float = WATCH_WAIT) -> Answer:
    f = world.f
    stub = {"lc": f.lc, "cs": f.cs, "ts": world.ts}[call.service]
    method = getattr(stub, call.rpc)
    try:
        if call.rpc in ("WatchLifecycleEvents", "WatchCompletionEvents"):
            stream = method(call.request, timeout=CALL_TIMEOUT)
            try:
                wait = INVALID_WATCH_WAIT if call.valid is False else watch_wait
                item = await asyncio.wait_for(stream.read(), timeout=wait)
                return Answer(Code.OK, item)
            except TimeoutError:
                return Answer(Code.OK, None)  # a live stream with nothing to say yet
            finally:
                stream.cancel()
        if call.rpc == "ExportTranscript":
            chunks = [chunk async for chunk in method(call.request, timeout=CALL_TIMEOUT)]
            return Answer(Code.OK, chunks)
        if call.rpc == "ImportTranscript":
            return Answer(
                Code.OK, await stream_until_answered(lambda: method(iter(call.request), timeout=CALL_TIMEOUT))
            )
        return Answer(Code.OK, await method(call.request, timeout=CALL_TIMEOUT))
    except grpc.aio.AioRpcError as error:
        return Answer(error.code(), None, error.details() or "", _error_infos(error))


def judge(call: Call, answer: Answer) -> str | None:
    """The problem with an answer, or None."""
    where = f"{call.rpc} valid={call.valid} bad={call.bad}: {answer.code.name} {answer.details[:200]!r}"
    if answer.ok:
        if call.valid is False:
            return f"accepted a request that breaks a documented field rule: {where}"
        return None
    if answer.code not in BUSINESS_CODES:
        return f"not a business code: {where}"
    if call.oversize:
        # Larger than the message limit: refused before any handler, with ErrorInfo.
        if answer.code != Code.RESOURCE_EXHAUSTED or [i.reason for i in answer.infos] != ["MESSAGE_TOO_LARGE"]:
            return f"an oversize request was not MESSAGE_TOO_LARGE: {where}"
        return None
    if len(answer.infos) != 1:
        return f"{len(answer.infos)} ErrorInfo details: {where}"
    info = answer.info
    domain, catalogue = (
        ("funnel.lifecycle.v1", LifecycleReason) if call.service == "lc" else ("funnel.completion.v1", CompletionReason)
    )
    if info.domain != domain:
        return f"ErrorInfo domain {info.domain!r}: {where}"
    if info.reason not in catalogue.__members__:
        return f"reason {info.reason!r} is not in the catalogue: {where}"
    if catalogue[info.reason].value.code.name != answer.code.name:
        return f"reason {info.reason} is sent with {answer.code.name}: {where}"
    if "Traceback" in answer.details or 'File "' in answer.details:
        return f"a stack trace leaked: {where}"
    if call.valid is False and answer.code != Code.INVALID_ARGUMENT:
        return f"a request breaking a field rule got {info.reason}: {where}"
    if call.valid is True and answer.code == Code.INVALID_ARGUMENT and info.reason not in SEMANTIC_INVALID:
        return f"a well-formed request got {info.reason} ({dict(info.metadata)}): {where}"
    return None


# -- the run ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    per_rpc: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ok_per_rpc: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    codes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    problems: list = dataclasses.field(default_factory=list)
    sequential_rejections_checked: int = 0
    changed_rows: int = 0

    def add(self, call: Call, answer: Answer) -> None:
        self.per_rpc[call.rpc] += 1
        self.codes[answer.code.name] += 1
        if answer.ok:
            self.ok_per_rpc[call.rpc] += 1
        elif answer.info is not None:
            self.reasons[f"{call.service}:{answer.info.reason}"] += 1
        problem = judge(call, answer)
        if problem:
            self.problems.append(problem)

    @property
    def total(self) -> int:
        return sum(self.per_rpc.values())


def describe_diff(before: dict, after: dict) -> list[str]:
    changes = []
    for table in sorted(set(before) | set(after)):
        old, new = collections.Counter(before.get(table, [])), collections.Counter(after.get(table, []))
        for row in new - old:
            changes.append(f"+ {table} {row!r:.300}")
        for row in old - new:
            changes.append(f"- {table} {row!r:.300}")
    return changes


@dataclasses.dataclass
class Touched:
    """What accepted requests may have changed."""

    tasks: set = dataclasses.field(default_factory=set)  # (workspace, task)
    runs: set = dataclasses.field(default_factory=set)  # (workspace, run)
    request_ids: set = dataclasses.field(default_factory=set)  # (workspace, request id)


def note_accepted(world: World, touched: Touched, call: Call, answer: Answer) -> None:
    if call.rpc in READ_ONLY and call.rpc != "LoadTranscript":
        return
    request = call.request[0].target if call.rpc == "ImportTranscript" else call.request
    workspace = request.workspace_id
    if getattr(request, "request_id", ""):
        touched.request_ids.add((workspace, request.request_id))
    if getattr(request, "task_id", ""):
        touched.tasks.add((workspace, request.task_id))
    if getattr(request, "run_id", ""):
        touched.runs.add((workspace, request.run_id))
    response = answer.response
    if call.rpc == "RegisterTask" and len(world.task_ids) < 60:
        world.task_ids.append(request.task_id)  # more registered tasks to activate, claim, settle
    if call.rpc == "ClaimTask":
        touched.runs.add((workspace, response.run.run_id))
        world.run_ids.append(response.run.run_id)
        world.epochs.append(response.lease.epoch)
        world.claims.append((workspace, response.run.task_id, response.run.run_id, response.lease.epoch))
    for completion in [getattr(response, "completion", None)]:
        if completion is not None and completion.completion_id:
            world.completion_ids.append(completion.completion_id)


def attribute(
    paths: dict[str, str], before: dict, after: dict, touched: Touched, run_tasks: dict
) -> tuple[list[str], int]:
    """Rows that changed although no accepted request touched their task, run or
    request id; and how many rows changed in all."""
    unexplained = []
    changed = 0
    for service, path in paths.items():
        names = columns(path)
        for table in sorted(set(before[service]) | set(after[service])):
            if table in ("sqlite_sequence",):
                continue
            old = collections.Counter(before[service].get(table, []))
            new = collections.Counter(after[service].get(table, []))
            for row in list((new - old).elements()) + list((old - new).elements()):
                changed += 1
                values = dict(zip(names[table], row, strict=True))
                workspace = values.get("workspace_id")
                if table == "request_ids":
                    if (workspace, values["request_id"]) in touched.request_ids or _derived_request_id(
                        workspace, values["request_id"], touched, run_tasks
                    ):
                        continue
                elif "task_id" in values and (workspace, values["task_id"]) in touched.tasks:
                    continue
                elif table == "tasks" and (workspace, values.get("parent_task_id")) in touched.tasks:
                    continue  # propagated from a touched parent
                elif "run_id" in values and (workspace, values["run_id"]) in touched.runs:
                    continue
                elif table in ("transcript_staging", "pending_propagations"):
                    pass
                unexplained.append(f"{service}.{table}: {row!r:.300}")
    return unexplained, changed


def _derived_request_id(workspace: str, request_id: str, touched: Touched, run_tasks: dict) -> bool:
    """Request ids the completion service derives for its own lifecycle calls."""
    if request_id.startswith("reopen:"):
        # reopen:<task>:<generation>:<hash>, or reopen:<generation>:<hash> for a task whose
        # id makes the first too long (reopen_request_id): task ids may hold colons, so
        # the id is read from its right.
        named = request_id.removeprefix("reopen:").rsplit(":", 2)
        tasks = {task for ws, task in touched.tasks if ws == workspace}
        if len(named) == 3:
            return named[0] in tasks
        return any(not reopen_request_id(task, int(named[0]), None).startswith(f"reopen:{task}:") for task in tasks)
    if request_id.startswith("settle:"):
        return True  # one per completion row, which is checked by its task
    run = request_id.split(":")[0]
    return (workspace, run) in touched.runs or (workspace, run_tasks.get(run)) in touched.tasks


async def quiesce(world: World) -> None:
    """Lets background work that accepted requests started (propagations, settlements) finish."""
    await world.f.lifecycle.authority.deliver_pending()
    await world.f.completion.authority.settler.settle_due()


def _tasks_of_runs(touched: Touched, completion_dump: dict, completion_columns: dict, run_tasks: dict) -> None:
    """A request naming a run touches the run's task (its lease, completion, lifecycle state)."""
    names = completion_columns["agent_runs"]
    for row in completion_dump["agent_runs"]:
        values = dict(zip(names, row, strict=True))
        if (values["workspace_id"], values["run_id"]) in touched.runs:
            touched.tasks.add((values["workspace_id"], values["task_id"]))
            run_tasks[values["run_id"]] = values["task_id"]


def _expand_touched(touched: Touched, lifecycle_dump: dict, lifecycle_columns: dict) -> None:
    """Children (any depth) of touched tasks may change through propagation."""
    names = lifecycle_columns["tasks"]
    rows = [dict(zip(names, r, strict=True)) for r in lifecycle_dump["tasks"]]
    grew = True
    while grew:
        grew = False
        for row in rows:
            key = (row["workspace_id"], row["task_id"])
            if key not in touched.tasks and (row["workspace_id"], row["parent_task_id"]) in touched.tasks:
                touched.tasks.add(key)
                grew = True


@pytest.mark.slow
async def test_hostile_requests_get_business_answers_and_rejections_change_nothing(tmp_path):
    started = time.monotonic()
    rng = random.Random(SEED)
    world = await build_world(tmp_path)
    tally = Tally()
    try:
        generator = Generator(rng, world)
        paths = {"lifecycle": world.f.lifecycle_config.database, "completion": world.f.completion_db}

        # Phase 1: sequential, every rejection checked against both databases on its own.
        before = world.snapshot()
        sequential = 0
        rpcs = list(SERVICE_OF)
        while tally.sequential_rejections_checked < SEQUENTIAL_REJECTIONS and sequential < SEQUENTIAL_REJECTIONS * 4:
            call = generator.next(rpcs[sequential % len(rpcs)])
            sequential += 1
            answer = await send(world, call, watch_wait=0.05)
            tally.add(call, answer)
            if answer.ok:
                note_accepted(world, Touched(), call, answer)
                await quiesce(world)
                before = world.snapshot()
                continue
            after = world.snapshot()
            if after != before:
                tally.problems.append(
                    f"rejected {call.rpc} ({answer.code.name} {answer.info and answer.info.reason}) changed the "
                    f"databases: {describe_diff(before[0], after[0]) + describe_diff(before[1], after[1])}"
                )
                before = after
            tally.sequential_rejections_checked += 1
        assert tally.sequential_rejections_checked >= SEQUENTIAL_REJECTIONS, tally.sequential_rejections_checked

        # Phase 2: the rest concurrently, from a pool of workers; changes attributed afterwards.
        await quiesce(world)
        before = world.snapshot()
        touched = Touched()
        run_tasks: dict[str, str] = {}
        queue: asyncio.Queue = asyncio.Queue()
        remaining = max(TOTAL_REQUESTS - tally.total, 0)
        for index in range(remaining):
            queue.put_nowait(index)

        async def worker() -> None:
            while True:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if index % 500 == 499:
                    world.f.clock.advance(rng.choice([1, 3, 7, 60]) * 1_000_000)  # leases lapse
                call = generator.next()
                answer = await send(world, call)
                tally.add(call, answer)
                if answer.ok:
                    note_accepted(world, touched, call, answer)
                    if call.rpc == "ClaimTask":
                        run_tasks[answer.response.run.run_id] = answer.response.run.task_id

        await asyncio.gather(*(worker() for _ in range(WORKERS)))
        await quiesce(world)
        after = world.snapshot()
        _tasks_of_runs(touched, after[1], columns(paths["completion"]), run_tasks)
        _expand_touched(touched, after[0], columns(paths["lifecycle"]))
        unexplained, tally.changed_rows = attribute(
            paths,
            {"lifecycle": before[0], "completion": before[1]},
            {"lifecycle": after[0], "completion": after[1]},
            touched,
            run_tasks,
        )
        tally.problems += [f"changed by no accepted request: {row}" for row in unexplained[:20]]
        for table in ("transcript_staging",):
            assert after[1][table] == [], f"{table} keeps debris of rejected imports"
        assert after[0]["pending_propagations"] == []
    finally:
        await world.f.close()

    elapsed = time.monotonic() - started
    print(
        f"\nhostile input: seed {SEED}, {tally.total} requests in {elapsed:.1f}s, "
        f"{tally.sequential_rejections_checked} rejections checked one by one; "
        f"{tally.changed_rows} rows changed in the concurrent phase; codes {dict(tally.codes)}"
    )
    print("per rpc (ok/total): " + ", ".join(f"{r} {tally.ok_per_rpc[r]}/{tally.per_rpc[r]}" for r in SERVICE_OF))
    assert not tally.problems, f"{len(tally.problems)} problems, first ones:\n" + "\n".join(tally.problems[:25])
    assert tally.total >= TOTAL_REQUESTS
    assert set(tally.per_rpc) == set(SERVICE_OF), set(SERVICE_OF) - set(tally.per_rpc)
    assert all(tally.per_rpc[rpc] >= 50 for rpc in SERVICE_OF), tally.per_rpc
    # Every RPC was also answered OK at least once: the generator reaches past validation everywhere.
    assert all(tally.ok_per_rpc[rpc] > 0 for rpc in SERVICE_OF), {r: tally.ok_per_rpc[r] for r in SERVICE_OF}


# -- the message size limit ------------------------------------------------------------------


async def test_messages_over_the_size_limit_are_resource_exhausted_before_any_handler(tmp_path, monkeypatch):
    from completion_service.api.service import CompletionService
    from completion_service.api.transcript_service import TranscriptService
    from lifecycle_service.api.service import LifecycleService

    reached: collections.Counter = collections.Counter()

    def counting(cls, name):
        original = getattr(cls, name)

        async def handler(self, request, context):
            reached[name] += 1
            return await original(self, request, context)

        return handler

    for cls, name in [
        (LifecycleService, "RegisterTask"),
        (CompletionService, "CompleteRun"),
        (CompletionService, "RecordEvidence"),
        (TranscriptService, "AppendTranscript"),
        (TranscriptService, "ImportTranscript"),
        (LifecycleService, "GetTask"),
    ]:
        monkeypatch.setattr(cls, name, counting(cls, name))

    limit = 64 * 1024
    clock = ManualClock(CLOCK_START_MICROS)
    f = Funnel(
        clock,
        tmp_path,
        LifecycleConfig(
            listen="127.0.0.1:0", database=str(tmp_path / "l.sqlite3"), health_interval=5.0, max_message_bytes=limit
        ),
        CompletionConfig(
            listen="127.0.0.1:0",
            database=str(tmp_path / "c.sqlite3"),
            lifecycle_timeout=5.0,
            settle_interval=0.2,
            health_interval=5.0,
            max_message_bytes=limit,
        ),
        {},
    )
    await f.start()
    try:
        channel = credentials.insecure_channel(f.completion.address)
        f._channels.append(channel)
        ts = transcript_grpc.TranscriptServiceStub(channel)
        claim = await f.registered_and_claimed("task-1")
        await f.lifecycle.authority.deliver_pending()
        paths = (f.lifecycle_config.database, f.completion_db)
        snapshot = lambda: tuple(dump(p) for p in paths)  # noqa: E731
        before = snapshot()
        reached.clear()
        big = "x" * (limit + 1)
        calls = [
            lambda: f.lc.RegisterTask(
                lifecycle_messages.RegisterTaskRequest(
                    workspace_id=E2E_WS, task_id="task-2", cause=lifecycle_types.Cause(reason=big)
                ),
                timeout=10,
            ),
            lambda: f.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=E2E_WS, task_id=big), timeout=10),
            lambda: f.cs.CompleteRun(
                completion_messages.CompleteRunRequest(
                    workspace_id=E2E_WS,
                    run_id=claim.run.run_id,
                    outcome=completion_enums.RUN_OUTCOME_SUCCEEDED,
                    notes=big,
                ),
                timeout=10,
            ),
            lambda: f.cs.RecordEvidence(
                completion_messages.RecordEvidenceRequest(
                    workspace_id=E2E_WS,
                    task_id="task-1",
                    generation=1,
                    kind="tests",
                    verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                    details=big,
                ),
                timeout=10,
            ),
            lambda: ts.AppendTranscript(
                transcript_messages.AppendTranscriptRequest(
                    workspace_id=E2E_WS,
                    task_id="task-1",
                    events=[completion_types.SessionEvent(user_message=completion_types.UserMessage(text="y" * 1000))]
                    * 100,
                ),
                timeout=10,
            ),
            lambda: ts.ImportTranscript(
                iter(
                    [
                        transcript_messages.ImportTranscriptRequest(
                            target=transcript_messages.ImportTarget(workspace_id=E2E_WS, task_id="task-1")
                        ),
                        transcript_messages.ImportTranscriptRequest(jsonl_chunk=b"z" * (limit + 1)),
                    ]
                ),
                timeout=10,
            ),
        ]
        for index, call in enumerate(calls):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call()
            assert caught.value.code() == Code.RESOURCE_EXHAUSTED, (caught.value.code(), caught.value.details())
            info = error_info(caught.value)
            assert info.reason == "MESSAGE_TOO_LARGE" and info.metadata["max_bytes"] == str(limit), info
            if index == len(calls) - 2:
                assert reached == {}, reached  # no unary handler saw an oversized request
        assert snapshot() == before
        # A streamed import is opened (its first, small message reaches the handler,
        # which looks the task up); the oversized chunk never does, the broken-off
        # stream is not taken for a complete file, and nothing is staged or imported.
        assert set(reached) <= {"ImportTranscript", "GetTask"}, reached
        # A request just under the limit is served normally.
        response = await f.lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(
                workspace_id=E2E_WS, task_id="task-2", cause=lifecycle_types.Cause(reason="r" * 1000)
            ),
            timeout=10,
        )
        assert response.task.revision == 1 and reached["RegisterTask"] == 1
    finally:
        await f.close()


async def test_an_import_stream_that_breaks_off_imports_nothing(start_funnel_pair, monkeypatch):
    """A client that cancels, or whose deadline passes, in the middle of an upload
    must not leave a truncated transcript behind: to the handler the broken-off
    stream ends like a complete one."""
    # Batches are cut by their count alone here (the decoded-bytes cut would end a
    # batch of these events at ~420), so that the part sent is one whole batch.
    monkeypatch.setattr(completion_service.api.imports, "BATCH_DECODED_BYTES", 2**40)
    f, ts = start_funnel_pair
    await f.register("task-a")
    await f.register("task-src")
    lines = []
    for i in range(3000):
        event = completion_types.SessionEvent(
            sequence=i + 1, generation=1, user_message=completion_types.UserMessage(text=f"message {i}")
        )
        lines.append(json.dumps(json_format.MessageToDict(event, preserving_proto_field_name=True)).encode() + b"\n")
    # The first part ends on a whole staging batch (1000 lines): nothing is left to
    # stage when the stream ends, so the handler would go straight to its commit.
    first, rest = b"".join(lines[:1000]), b"".join(lines[1000:])

    async def upload(stop: asyncio.Event):
        yield transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=E2E_WS, task_id="task-a")
        )
        yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=first)
        await stop.wait()
        yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=rest)

    async def tail():
        page = await ts.LoadTranscript(
            transcript_messages.LoadTranscriptRequest(workspace_id=E2E_WS, task_id="task-a"), timeout=10
        )
        return len(page.events), page.state_version

    async def staged(rows: int) -> bool:
        """Whether the staging table holds `rows` rows: 1000 once the first part is
        staged, none again once the handler has let the broken-off import go."""
        count = await asyncio.to_thread(query, f.completion_db, "SELECT count(*) FROM transcript_staging")
        return count == [(rows,)]

    stop = asyncio.Event()
    call = ts.ImportTranscript(upload(stop), timeout=30)
    await eventually(lambda: staged(1000), timeout=30)
    call.cancel()
    await eventually(lambda: staged(0), timeout=30)
    assert await tail() == (0, 0)
    # The deadline passes while the handler holds the first part.
    deadline = ts.ImportTranscript(upload(asyncio.Event()), timeout=5)
    await eventually(lambda: staged(1000), timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await deadline
    assert caught.value.code() == Code.DEADLINE_EXCEEDED
    await eventually(lambda: staged(0), timeout=30)
    assert await tail() == (0, 0)
    # The whole file, sent again, is imported in full.
    stop.set()
    done = asyncio.Event()
    done.set()
    response = await ts.ImportTranscript(upload(done), timeout=30)
    assert response.imported_events == 3000
    assert (await tail())[1] == 1


@pytest.fixture
async def start_funnel_pair(tmp_path):
    f = Funnel(
        ManualClock(CLOCK_START_MICROS),
        tmp_path,
        LifecycleConfig(listen="127.0.0.1:0", database=str(tmp_path / "l.sqlite3"), health_interval=5.0),
        CompletionConfig(
            listen="127.0.0.1:0",
            database=str(tmp_path / "c.sqlite3"),
            lifecycle_timeout=5.0,
            settle_interval=0.2,
            health_interval=5.0,
        ),
        {},
    )
    await f.start()
    channel = credentials.insecure_channel(f.completion.address)
    f._channels.append(channel)
    try:
        yield f, transcript_grpc.TranscriptServiceStub(channel)
    finally:
        await f.close()


async def test_pages_larger_than_the_message_limit_are_cut_short_not_refused(start_funnel_pair):
    """A full page (`page_size` up to 1000) of large items can exceed the 4 MiB
    message limit: lifecycle events with maximal causes, runs with long errors,
    completions with long results, transcript events of 1 MiB. Each listing still
    answers OK, with a shorter page and a token, and yields every item once."""
    f, ts = start_funnel_pair
    emoji = "\U0001f600"
    wide_letter = "\U00020000"  # four UTF-8 bytes, and allowed in ids (emoji are not)
    await f.register("t-big")
    for _ in range(6):
        await ts.AppendTranscript(
            transcript_messages.AppendTranscriptRequest(
                workspace_id=E2E_WS,
                task_id="t-big",
                events=[ev(user_message=completion_types.UserMessage(text="b" * (1024 * 1024 - 64)))],
            ),
            timeout=10,
        )
    await f.register("t-noisy")  # 200 events of about 28 KB
    cause = lifecycle_types.Cause(
        source=emoji * 128,
        reason=emoji * 1024,
        originating_ids={f"{wide_letter * 120}{i:02d}": emoji * 256 for i in range(16)},
    )
    for i in range(200):
        await f.lc.SetWorkStatus(
            lifecycle_messages.SetWorkStatusRequest(
                workspace_id=E2E_WS, task_id="t-noisy", generation=1, work_status=1 + i % 3, cause=cause
            ),
            timeout=10,
        )
    await f.register("t-runs")  # 110 closed runs of about 40 KB
    for _ in range(110):
        claim = await f.claim("t-runs", ttl_seconds=60)
        await f.complete_run(
            claim, outcome=completion_enums.RUN_OUTCOME_STALLED, error=emoji * 8192, notes=emoji * 2500
        )
    for i in range(70):  # 70 completions of about 66 KB
        claim = await f.registered_and_claimed(f"t-long-{i}")
        assert (
            await f.attempt(claim, result=emoji * 16384)
        ).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED

    async def drain(method, request, items: str, size: int) -> int:
        seen, pages, token = [], 0, ""
        while True:
            request.page_size, request.page_token = size, token
            response = await method(request, timeout=30)
            seen += [item.SerializeToString(deterministic=True) for item in getattr(response, items)]
            pages += 1
            token = response.next_page_token
            if not token:
                assert len(seen) == len(set(seen))
                return len(seen)

    for size in (0, 1000):
        assert (
            await drain(
                f.lc.ListLifecycleEvents,
                lifecycle_messages.ListLifecycleEventsRequest(workspace_id=E2E_WS, task_id="t-noisy"),
                "events",
                size,
            )
            == 201
        )
        assert (
            await drain(
                f.cs.ListRuns, completion_messages.ListRunsRequest(workspace_id=E2E_WS, task_id="t-runs"), "runs", size
            )
            == 110
        )
        assert (
            await drain(
                f.cs.ListCompletions,
                completion_messages.ListCompletionsRequest(workspace_id=E2E_WS),
                "completions",
                size,
            )
            == 70
        )
        assert (
            await drain(
                ts.LoadTranscript,
                transcript_messages.LoadTranscriptRequest(workspace_id=E2E_WS, task_id="t-big"),
                "events",
                size,
            )
            == 6
        )
    chunks = [
        c.jsonl
        async for c in ts.ExportTranscript(
            transcript_messages.ExportTranscriptRequest(workspace_id=E2E_WS, task_id="t-big"), timeout=30
        )
    ]
    assert len(chunks) > 1 and all(c.endswith(b"\n") for c in chunks)
    assert len(b"".join(chunks).splitlines()) == 6
    # One event of 1 MiB control characters is a JSONL line of 6 MiB: it is exported
    # in pieces, and the file imports back.
    await f.register("t-nul")
    await f.register("t-nul-copy")
    await ts.AppendTranscript(
        transcript_messages.AppendTranscriptRequest(
            workspace_id=E2E_WS,
            task_id="t-nul",
            events=[ev(user_message=completion_types.UserMessage(text="\x00" * 1024 * 1024))],
        ),
        timeout=10,
    )
    chunks = [
        c.jsonl
        async for c in ts.ExportTranscript(
            transcript_messages.ExportTranscriptRequest(workspace_id=E2E_WS, task_id="t-nul"), timeout=30
        )
    ]
    assert len(chunks) > 1 and len(b"".join(chunks).splitlines()) == 1
    imported = await ts.ImportTranscript(
        iter(
            [
                transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=E2E_WS, task_id="t-nul-copy")
                )
            ]
            + [transcript_messages.ImportTranscriptRequest(jsonl_chunk=c) for c in chunks]
        ),
        timeout=30,
    )
    assert imported.imported_events == 1
