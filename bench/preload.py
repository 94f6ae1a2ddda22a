"""Bulk preload of N registered-and-completed tasks into both databases, for the
"1,000,000 tasks already in the databases" figure.

The rows are not invented here: the calibration run walks a template task through
the real services (RegisterTask, ClaimTask, AttemptCompletion -> SETTLED,
CompleteRun), and this module clones every row that task left in every table of both
databases N times, directly in SQLite, while the services are stopped. Each clone
gets its own task id, run id, completion id and completion identity; the ids have
the template's length, so ids can be replaced inside stored protobuf responses too.

Consistency kept per clone:
  - lifecycle event sequences: fresh, increasing, in clone order; the completion
    rows and stored responses that quote a lifecycle sequence quote the clone's;
  - the completion identity is recomputed from the clone's canonical payload (and
    checked to reproduce the template's identity with the template's payload);
  - request-id fingerprints are recomputed from the clone's requests with the
    services' own formula, found by matching the template's stored fingerprints
    against the template's requests (client requests and the completion service's
    calls to the lifecycle service, captured by the calibration proxy). A replay of a
    preloaded request therefore gets the stored answer, as for a real one.
Timestamps are the template's (all clones share them). Tables the template did not
touch get no rows. Columns that do not name the template (the request ids' scope
`caller` and `method`, the events' `caller_id`, the audit rows' `caller_subject`/
`caller_role`) are copied as they are: the clones were made by the same callers as
the template, so a replay by those callers (bench/client.py verify_preload) finds them.

The schema is the services' own: before cloning, each database is opened with
funnel.runtime.sqlite.Database.open and the service's migrations (a no-op on the
databases calibration just made, an upgrade for an older one), and the columns the
clone relies on are checked.

It writes with journal_mode=MEMORY and synchronous=OFF (a scratch benchmark database;
the services switch back to WAL + FULL when they open it) and puts WAL back at the end.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import WORKSPACE
from completion_service.storage import compact
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime.idempotency import fingerprint as service_fingerprint
from funnel.runtime.idempotency import response_of, stored_response
from funnel.runtime.sqlite import Database, migrations_in

CLONE_TASK_PREFIX = "pre-"
CHUNK = 20_000
MESSAGES = {"lifecycle": lifecycle_messages, "completion": completion_messages}
MIGRATIONS = {
    "lifecycle": "lifecycle_service.storage.migrations",
    "completion": "completion_service.storage.migrations",
}
# Columns the clone reads by name (request_ids' shape since migration 0004 of both services).
REQUIRED_COLUMNS = {
    "lifecycle": {
        "lifecycle_events": {"sequence", "workspace_id", "task_id", "caller_id"},
        "request_ids": {"workspace_id", "caller", "method", "request_id", "fingerprint", "response", "created_at"},
    },
    "completion": {
        "task_completions": {"completion_id", "payload"},
        "audit_log": {"caller_subject", "caller_role"},
        "request_ids": {"workspace_id", "caller", "method", "request_id", "fingerprint", "response", "created_at"},
    },
}


# Columns stored deflated: (to plain, from plain) per (database, column).
COMPACT = {
    ("completion", "decision"): (compact.decode_decision_json, compact.encode_decision_json),
    ("completion", "payload"): (compact.decode_payload, compact.encode_payload),
}


def migrate(path: str, which: str) -> int:
    """Brings the database to the current schema with the service's own migrations
    and checks the columns the clone relies on; returns the schema version."""
    import asyncio

    migrations = migrations_in(MIGRATIONS[which])

    async def open_and_close() -> None:
        database = await Database.open(path, migrations)
        await database.close()

    asyncio.run(open_and_close())
    db = sqlite3.connect(path)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        for table, wanted in REQUIRED_COLUMNS[which].items():
            present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if not wanted <= present:
                raise RuntimeError(
                    f"{which} database {path}: table {table} lacks {sorted(wanted - present)}; "
                    "bench/preload.py does not know this schema"
                )
    finally:
        db.close()
    if version != len(migrations):
        raise RuntimeError(f"{which} database {path} is at schema version {version}, expected {len(migrations)}")
    return version


def same_length_id(template: str, index: int, tag: str = "b0") -> str:
    """An id shaped like `template` (its `prefix_` kept) that encodes index."""
    prefix, sep, rest = template.partition("_")
    if not sep:
        prefix, rest = "", template
    else:
        prefix += sep
    width = len(rest) - len(tag)
    body = f"{tag}{index:0{width}x}"
    if len(body) != len(rest):
        raise ValueError(f"index {index} does not fit an id shaped like {template!r}")
    return prefix + body


def clone_task_id(template_task_id: str, index: int) -> str:
    width = len(template_task_id) - len(CLONE_TASK_PREFIX)
    task_id = f"{CLONE_TASK_PREFIX}{index:0{width}d}"
    if len(task_id) != len(template_task_id):
        raise ValueError(f"{index} clones do not fit task ids shaped like {template_task_id!r}")
    return task_id


@dataclass
class Template:
    task_id: str
    run_id: str
    completion_id: str
    identity: str
    requests: list  # [service, method, request bytes]

    def clone_ids(self, index: int) -> list[tuple[str, str]]:
        return [
            (self.task_id, clone_task_id(self.task_id, index)),
            (self.run_id, same_length_id(self.run_id, index)),
            (self.completion_id, same_length_id(self.completion_id, index)),
        ]


def _replace_bytes(value: bytes, pairs: list[tuple[bytes, bytes]]) -> bytes:
    for old, new in pairs:
        value = value.replace(old, new)
    return value


def _mentions(value, needles: list[str]) -> bool:
    if isinstance(value, str):
        return any(n in value for n in needles)
    if isinstance(value, bytes):
        return any(n.encode() in value for n in needles)
    return False


class FingerprintPlan:
    """How to recompute the fingerprint of one template request_ids row for a clone."""

    def __init__(self, service: str, method: str, raw: bytes) -> None:
        self.method = method
        self.request_type = getattr(MESSAGES[service], f"{method}Request")
        self.response_type = getattr(MESSAGES[service], f"{method}Response", None)
        self.raw = raw

    def fingerprint(self, pairs: list[tuple[bytes, bytes]]) -> bytes:
        request = self.request_type.FromString(_replace_bytes(self.raw, pairs))
        return service_fingerprint(self.method, request.SerializeToString(deterministic=True))


def _match_fingerprint(stored: bytes, template: Template, service: str) -> FingerprintPlan | None:
    for svc, method, raw_hex in template.requests:
        if svc != service:
            continue
        try:
            plan = FingerprintPlan(svc, method, bytes.fromhex(raw_hex))
        except AttributeError:
            continue
        if plan.fingerprint([]) == stored:
            return plan
    return None


def clone_database(
    path: str,
    which: str,
    template: Template,
    count: int,
    sequence_base: int,
    lifecycle_sequences: list[int],
    warnings: list,
) -> dict:
    """Clones the template task's rows of one database `count` times. Clone i's
    lifecycle events get sequences sequence_base + i * len(lifecycle_sequences) + j,
    in the template's order (the same numbers in both databases, so the completion
    rows quote the right lifecycle events)."""
    db = sqlite3.connect(path, isolation_level=None)
    needles = [template.task_id, template.run_id, template.completion_id]
    per_clone_events = len(lifecycle_sequences)
    seq_offset = {seq: j for j, seq in enumerate(lifecycle_sequences)}
    payload = _template_payload(db, template, warnings) if which == "completion" else None
    plans = []
    inserted = {}
    for table, sql in db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall():
        info = db.execute(f"PRAGMA table_info({table})").fetchall()
        columns = [c[1] for c in info]
        rows = [r for r in db.execute(f"SELECT * FROM {table}").fetchall() if any(_mentions(v, needles) for v in r)]
        if not rows:
            continue
        autoincrement = "AUTOINCREMENT" in (sql or "").upper()
        rowid_pk = [c[1] for c in info if c[5] == 1 and c[2].upper() == "INTEGER" and sum(x[5] > 0 for x in info) == 1]
        for row in rows:
            plans.append(_row_plan(table, columns, row, rowid_pk, autoincrement, template, which, seq_offset, warnings))
        inserted[table] = 0

    db.execute("PRAGMA journal_mode=MEMORY")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA cache_size=-262144")  # 256 MiB
    statements = {}
    for table, columns, _ in plans:
        statements[(table, columns)] = (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        )
    # Per template row: the constant values once, and the (position, maker) pairs
    # that differ per clone.
    shapes = []
    for table, columns, makers in plans:
        base = [m.value if isinstance(m, _Const) else None for m in makers]
        dynamic = [(i, m) for i, m in enumerate(makers) if not isinstance(m, _Const)]
        shapes.append(((table, columns), base, dynamic))
    for start in range(0, count, CHUNK):
        batches: dict[tuple, list] = {key: [] for key in statements}
        for index in range(start, min(count, start + CHUNK)):
            clone = _Clone(template, index, sequence_base, per_clone_events, payload)
            for key, base, dynamic in shapes:
                row = base.copy()
                for position, make in dynamic:
                    row[position] = make(clone)
                batches[key].append(row)
        db.execute("BEGIN")
        for key, rows in batches.items():
            db.executemany(statements[key], rows)
            inserted[key[0]] += len(rows)
        db.execute("COMMIT")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    return {"database": which, "rows": inserted, "events_per_clone": per_clone_events}


class _Const:
    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value


class _Clone:
    __slots__ = ("_identity", "_payload", "_template_identity", "byte_pairs", "index", "sequence_base", "text_pairs")

    def __init__(
        self, template: Template, index: int, sequence_base: int, per_clone_events: int, payload: bytes | None
    ) -> None:
        self.index = index
        self.text_pairs = template.clone_ids(index)
        self.byte_pairs = [(a.encode(), b.encode()) for a, b in self.text_pairs]
        self.sequence_base = sequence_base + index * per_clone_events
        self._payload = payload
        self._template_identity = template.identity
        self._identity: str | None = None

    def sequence(self, offset: int) -> int:
        return self.sequence_base + offset

    def identity(self) -> str:
        """The clone's completion identity: SHA-256 of its canonical payload (the
        template's with the clone's ids), as the completion service computes it."""
        if self._identity is None:
            if self._payload is not None:
                digest = hashlib.sha256(_replace_bytes(self._payload, self.byte_pairs)).hexdigest()
            else:
                digest = hashlib.sha256(self._template_identity.encode() + self.byte_pairs[0][1]).hexdigest()
            self._identity = "sha256:" + digest
        return self._identity


def _template_payload(db: sqlite3.Connection, template: Template, warnings: list) -> bytes | None:
    try:
        row = db.execute(
            "SELECT payload FROM task_completions WHERE completion_id = ?", (template.completion_id,)
        ).fetchone()
    except sqlite3.OperationalError:
        return None
    if row is None:
        return None
    payload = compact.decode_payload(row[0])
    if "sha256:" + hashlib.sha256(payload).hexdigest() != template.identity:
        warnings.append("the completion identity is not sha256(payload): clones get a derived identity")
        return None
    return payload


def _row_plan(table, columns, row, rowid_pk, autoincrement, template, which, seq_offset, warnings):
    """Per column, a function clone -> value."""
    # Each maker is called with the clone alone; `...` because mypy cannot match the lambdas, which bind
    # their constants as default arguments, to Callable[[_Clone], object].
    makers: list[_Const | Callable[..., object]] = []
    kept_columns = []
    values = dict(zip(columns, row, strict=True))
    fingerprint_plan = None
    if table == "request_ids":
        fingerprint_plan = _match_fingerprint(values["fingerprint"], template, which)
        if fingerprint_plan is None:
            warnings.append(
                f"{which} request_ids row {values['request_id']!r}: no template request reproduces its fingerprint; "
                "clones get a derived fingerprint (a replay of them would be REQUEST_ID_REUSED)"
            )
    needles = (template.task_id, template.run_id, template.completion_id, template.identity)

    for column in columns:
        value = values[column]
        if column in rowid_pk and autoincrement:
            if table == "lifecycle_events" and column == "sequence":
                offset = seq_offset[value]
                makers.append(lambda c, o=offset: c.sequence(o))
                kept_columns.append(column)
            # else: leave it out, SQLite assigns the next one
            continue
        kept_columns.append(column)
        if column == "lifecycle_event_sequence" and value in seq_offset:
            makers.append(lambda c, o=seq_offset[value]: c.sequence(o))
        elif column == "identity" and value == template.identity:
            makers.append(_Clone.identity)
        elif table == "request_ids" and column == "fingerprint":
            if fingerprint_plan is not None:
                makers.append(lambda c, p=fingerprint_plan: p.fingerprint(c.byte_pairs))
            else:
                makers.append(lambda c, v=value: hashlib.sha256(v + c.byte_pairs[0][1]).digest())
        elif table == "request_ids" and column == "response":
            makers.append(_response_maker(response_of(value), fingerprint_plan, seq_offset, template))
        elif (which, column) in COMPACT and isinstance(value, bytes) and value:
            # Stored deflated (completion_service/storage/compact.py): ids are replaced in
            # the plain value, which is stored deflated again.
            to_plain, from_plain = COMPACT[(which, column)]
            plain = _plain_maker(to_plain(value), needles, template)
            makers.append(_Const(value) if isinstance(plain, _Const) else lambda c, m=plain, f=from_plain: f(m(c)))
        else:
            makers.append(_plain_maker(value, needles, template))
    return table, tuple(kept_columns), makers


def _plain_maker(value, needles: tuple[str, ...], template: Template):
    """A value that names the template (a task, run or completion id, or the identity)
    with the clone's ids instead; any other value as it is (a constant)."""
    if isinstance(value, str) and any(n in value for n in needles):
        return _text_maker(value, template)
    if isinstance(value, bytes) and any(n.encode() in value for n in needles):
        identity = template.identity.encode()
        return lambda c, v=value, i=identity: _replace_bytes(v, c.byte_pairs).replace(i, c.identity().encode())
    return _Const(value)


def _text_maker(value: str, template: Template):
    """Replaces only the template ids the value contains."""
    present = [k for k, (old, _) in enumerate(template.clone_ids(0)) if old in value]
    identity = template.identity if template.identity in value else None

    def make(clone: _Clone) -> str:
        text = value
        for k in present:
            old, new = clone.text_pairs[k]
            text = text.replace(old, new)
        if identity is not None:
            text = text.replace(identity, clone.identity())
        return text

    return make


def _response_maker(value: bytes, plan: FingerprintPlan | None, seq_offset: dict, template: Template):
    """A stored response: ids replaced byte for byte (same lengths), then the quoted
    lifecycle sequences (a lifecycle event's `sequence`, a completion's
    `lifecycle_event_sequence`) moved to the clone's."""
    identity = template.identity.encode()
    response_type = plan.response_type if plan is not None else None

    def make(clone: _Clone) -> bytes:
        data = _replace_bytes(value, clone.byte_pairs).replace(identity, clone.identity().encode())
        if response_type is None:
            return stored_response(data)
        message = response_type.FromString(data)
        changed = False
        for field in ("event",):
            if field in response_type.DESCRIPTOR.fields_by_name and message.HasField(field):
                event = getattr(message, field)
                if event.sequence in seq_offset:
                    event.sequence = clone.sequence(seq_offset[event.sequence])
                    changed = True
        if "completion" in response_type.DESCRIPTOR.fields_by_name and message.HasField("completion"):
            completion = message.completion
            if completion.lifecycle_event_sequence in seq_offset:
                completion.lifecycle_event_sequence = clone.sequence(seq_offset[completion.lifecycle_event_sequence])
                changed = True
        return stored_response(message.SerializeToString() if changed else data)

    return make


def _clone_one(args):
    path, which, template, count, base, sequences = args
    warnings: list[str] = []
    result = clone_database(path, which, template, count, base, sequences, warnings)
    result["warnings"] = sorted(set(warnings))
    return result


def preload(data_dir: str, story: dict, count: int) -> dict:
    """Clones the calibration story `story` (as reported by bench/client.py calibrate)
    `count` times into data_dir's lifecycle.sqlite3 and completion.sqlite3."""
    template = Template(
        task_id=story["task_id"],
        run_id=story["run_id"],
        completion_id=story["completion_id"],
        identity=story["identity"],
        requests=story["requests"],
    )
    clone_task_id(template.task_id, max(count - 1, 0))  # fails early if the ids cannot hold count
    lifecycle_path = os.path.join(data_dir, "lifecycle.sqlite3")
    completion_path = os.path.join(data_dir, "completion.sqlite3")
    versions = {"lifecycle": migrate(lifecycle_path, "lifecycle"), "completion": migrate(completion_path, "completion")}
    db = sqlite3.connect(lifecycle_path)
    base = (db.execute("SELECT COALESCE(MAX(sequence), 0) FROM lifecycle_events").fetchone()[0] or 0) + 1
    sequences = [
        r[0]
        for r in db.execute(
            "SELECT sequence FROM lifecycle_events WHERE workspace_id = ? AND task_id = ? ORDER BY sequence",
            (WORKSPACE, template.task_id),
        )
    ]
    db.close()
    t0 = time.monotonic()
    jobs = [
        (lifecycle_path, "lifecycle", template, count, base, sequences),
        (completion_path, "completion", template, count, base, sequences),
    ]
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
        results = list(pool.map(_clone_one, jobs))
    elapsed = time.monotonic() - t0
    sizes = {
        name: sum(
            os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir) if f.startswith(f"{name}.sqlite3")
        )
        / 2**20
        for name in ("lifecycle", "completion")
    }
    last = count - 1
    return {
        "tasks": count,
        "schema_versions": versions,
        "seconds": elapsed,
        "databases": results,
        "size_mb": sizes,
        "sample_clone": {
            "task_id": clone_task_id(template.task_id, last),
            "run_id": same_length_id(template.run_id, last),
            "completion_id": same_length_id(template.completion_id, last),
        },
    }
