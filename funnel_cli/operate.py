"""The operator's commands: read and steer tasks, runs and completions through the
services' gRPC API with the operator's credentials (see funnel/client/connection.py),
and check or back up a SQLite database file.

Exit codes scripts can rely on:
  0  done
  1  the service refused (the state forbids it, a conflict, bad input) or the
     database check found damage
  2  the command line is wrong
  3  not found
  4  the credentials do not allow it (UNAUTHENTICATED, PERMISSION_DENIED)
  5  a service or the database cannot be reached now (UNAVAILABLE,
     DEADLINE_EXCEEDED): retrying later may help
  141  the reader of standard output went away (`funnel task list | head`): the
     output was cut short, quietly, as a Unix tool ended by SIGPIPE reports it
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.client import connection as conn
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.paging import every_page
from funnel_cli.output import (
    Column,
    Progress,
    as_json,
    enum_word,
    print_fields,
    print_json,
    print_json_line,
    print_table,
    when,
)

OK, REFUSED, USAGE, NOT_FOUND, DENIED, UNREACHABLE = 0, 1, 2, 3, 4, 5
CALL_TIMEOUT = 15.0
PAGE_SIZE = 500

_EXIT_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED: DENIED,
    grpc.StatusCode.PERMISSION_DENIED: DENIED,
    grpc.StatusCode.UNAVAILABLE: UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: UNREACHABLE,
}


class Clients:
    """The stubs of both services over the operator's connection."""

    def __init__(self, args: argparse.Namespace, connection: conn.Connection) -> None:
        self._channels = [connection.channel(args.lifecycle), connection.channel(args.completion)]
        # grpcio-tools leaves the stubs' constructors unannotated; only `mypy --strict`
        # reports calling them here, the project's own run leaves the ignore unused.
        self.lifecycle = lifecycle_grpc.TaskLifecycleServiceStub(  # type: ignore[no-untyped-call, unused-ignore]
            self._channels[0]
        )
        self.completion = completion_grpc.CompletionServiceStub(  # type: ignore[no-untyped-call, unused-ignore]
            self._channels[1]
        )

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


Command = Callable[[argparse.Namespace, Clients], Awaitable[int]]


def service_command(name: str) -> Callable[[Command], Callable[[argparse.Namespace], int]]:
    """Runs an async command with both clients, mapping failures to exit codes."""

    def wrap(command: Command) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(command)
        def run(args: argparse.Namespace) -> int:
            async def main(connection: conn.Connection) -> int:
                clients = Clients(args, connection)
                try:
                    return await command(args, clients)
                finally:
                    await clients.close()

            connection: conn.Connection | None = None
            try:
                connection = conn.from_arguments(args)
                return asyncio.run(main(connection))
            except conn.ConnectionSetupError as exc:
                print(f"funnel {name}: {exc}", file=sys.stderr)
                return USAGE
            except grpc.aio.AioRpcError as error:
                info = error_info(error)
                reason = f"{info.reason} ({error.code().name})" if info is not None else error.code().name
                hint = (
                    ""
                    if connection is None
                    else conn.missing_certificate_hint(connection, error.code(), error.details())
                )
                print(f"funnel {name}: {reason}: {error.details()}{hint}", file=sys.stderr)
                return _EXIT_BY_CODE.get(error.code(), REFUSED)
            except KeyboardInterrupt:
                return OK

        return run

    return wrap


# --- tasks --------------------------------------------------------------------

TASK_COLUMNS: list[Column] = [
    ("task", lambda t: t.task_id),
    ("gen", lambda t: t.generation),
    ("rev", lambda t: t.revision),
    ("state", lambda t: enum_word(lifecycle_enums.GenerationState.Name(t.state), "GENERATION_STATE_")),
    ("outcome", lambda t: enum_word(lifecycle_enums.TerminalOutcome.Name(t.outcome), "TERMINAL_OUTCOME_")),
    ("cancel", lambda t: "requested" if t.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED else ""),
    ("status", lambda t: enum_word(lifecycle_enums.WorkStatus.Name(t.work_status), "WORK_STATUS_")),
    ("parent", lambda t: f"{t.parent.task_id}#{t.parent.generation}" if t.HasField("parent") else ""),
    ("updated", lambda t: when(t.update_time)),
]
EVENT_COLUMNS: list[Column] = [
    ("seq", lambda e: e.sequence),
    ("task", lambda e: e.task_id),
    ("gen", lambda e: e.generation),
    ("rev", lambda e: e.revision),
    ("intent", lambda e: enum_word(lifecycle_enums.Intent.Name(e.intent), "INTENT_")),
    ("to", lambda e: enum_word(lifecycle_enums.GenerationState.Name(e.to_state), "GENERATION_STATE_")),
    ("outcome", lambda e: enum_word(lifecycle_enums.TerminalOutcome.Name(e.outcome), "TERMINAL_OUTCOME_")),
    ("caller", lambda e: e.caller.subject),
    ("committed", lambda e: when(e.commit_time)),
]


@service_command("task get")
async def task_get(args: argparse.Namespace, clients: Clients) -> int:
    response = await clients.lifecycle.GetTask(
        lifecycle_messages.GetTaskRequest(workspace_id=args.workspace, task_id=args.task), timeout=CALL_TIMEOUT
    )
    if args.output == "json":
        print_json(as_json(response))
        return OK
    task = response.task
    print_fields(
        [(name, get(task)) for name, get in TASK_COLUMNS]
        + [
            ("completion", task.completion_id),
            ("created", when(task.create_time)),
            ("open children", ", ".join(response.open_attached_child_task_ids)),
        ]
    )
    return OK


@service_command("task register")
async def task_register(args: argparse.Namespace, clients: Clients) -> int:
    """A new task (generation 1), top-level or the child of --parent (attached to its
    current generation unless --parent-generation or --detached say otherwise)."""
    request = lifecycle_messages.RegisterTaskRequest(
        workspace_id=args.workspace,
        task_id=args.task,
        request_id=args.request_id or "",
        cause=lifecycle_types.Cause(source="funnel-cli", reason=args.reason),
    )
    if args.parent:
        generation = args.parent_generation
        if not generation:
            generation = (
                await clients.lifecycle.GetTask(
                    lifecycle_messages.GetTaskRequest(workspace_id=args.workspace, task_id=args.parent),
                    timeout=CALL_TIMEOUT,
                )
            ).task.generation
        request.parent.CopyFrom(
            lifecycle_types.ParentLink(
                task_id=args.parent,
                generation=generation,
                mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED
                if args.detached
                else lifecycle_enums.PARENT_LINK_MODE_ATTACHED,
            )
        )
    response = await clients.lifecycle.RegisterTask(request, timeout=CALL_TIMEOUT)
    if args.output == "json":
        print_json(as_json(response))
    else:
        print_fields(
            [(name, get(response.task)) for name, get in TASK_COLUMNS]
            + [("created", when(response.task.create_time)), ("event", response.event.sequence)]
        )
    return OK


@service_command("task list")
async def task_list(args: argparse.Namespace, clients: Clients) -> int:
    tasks = await every_page(
        lambda token: clients.lifecycle.ListTasks(
            lifecycle_messages.ListTasksRequest(
                workspace_id=args.workspace, parent_task_id=args.parent or "", page_size=PAGE_SIZE, page_token=token
            ),
            timeout=CALL_TIMEOUT,
        ),
        "tasks",
        args.limit,
    )
    if args.output == "json":
        print_json({"tasks": [as_json(t) for t in tasks]})
    else:
        print_table(tasks, TASK_COLUMNS)
    return OK


@service_command("task events")
async def task_events(args: argparse.Namespace, clients: Clients) -> int:
    events = await every_page(
        lambda token: clients.lifecycle.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(
                workspace_id=args.workspace, task_id=args.task, page_size=PAGE_SIZE, page_token=token
            ),
            timeout=CALL_TIMEOUT,
        ),
        "events",
        None,
    )
    if args.output == "json":
        print_json({"events": [as_json(e) for e in events]})
    else:
        print_table(events, EVENT_COLUMNS)
    return OK


@service_command("task watch")
async def task_watch(args: argparse.Namespace, clients: Clients) -> int:
    """Follows the workspace's events (or one task's) until interrupted; resumes
    from its cursor when the stream ends (a restart, a slow terminal)."""
    cursor = args.after
    shown = 0
    if args.output != "json":
        print_table([], EVENT_COLUMNS)
    while args.count is None or shown < args.count:
        stream = clients.lifecycle.WatchLifecycleEvents(
            lifecycle_messages.WatchLifecycleEventsRequest(
                workspace_id=args.workspace, task_id=args.task or "", after_sequence=cursor
            )
        )
        try:
            async for message in stream:
                event = message.event
                if args.output == "json":
                    print_json_line(as_json(event))
                else:
                    print("  ".join(str(get(event)) for _, get in EVENT_COLUMNS), flush=True)
                cursor = event.sequence
                shown += 1
                if args.count is not None and shown >= args.count:
                    stream.cancel()
                    break
        except grpc.aio.AioRpcError as error:
            info = error_info(error)
            # The server says where to resume (a stopping server, a slow terminal); a
            # connection that broke (a restart) is resumed from the cursor too.
            resumable = info is not None and info.reason in ("WATCH_OVERFLOW", "SERVER_SHUTTING_DOWN")
            if not resumable and error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
            await asyncio.sleep(0.5)
    return OK


@service_command("task cancel")
async def task_cancel(args: argparse.Namespace, clients: Clients) -> int:
    task = (
        await clients.lifecycle.GetTask(
            lifecycle_messages.GetTaskRequest(workspace_id=args.workspace, task_id=args.task), timeout=CALL_TIMEOUT
        )
    ).task
    generation = args.generation or task.generation
    cause = lifecycle_types.Cause(source="funnel-cli", reason=args.reason)
    fenced = await clients.lifecycle.RequestCancellation(
        lifecycle_messages.RequestCancellationRequest(
            workspace_id=args.workspace,
            task_id=args.task,
            generation=generation,
            cause=cause,
            request_id=args.request_id or "",
        ),
        timeout=CALL_TIMEOUT,
    )
    events = [fenced.event]
    if args.settle:
        settled = await clients.lifecycle.SettleCancellation(
            lifecycle_messages.SettleCancellationRequest(
                workspace_id=args.workspace,
                task_id=args.task,
                generation=generation,
                cause=cause,
                request_id=f"{args.request_id}-settle" if args.request_id else "",
            ),
            timeout=CALL_TIMEOUT,
        )
        events.append(settled.event)
    _print_events(args, events)
    return OK


@service_command("task resume")
async def task_resume(args: argparse.Namespace, clients: Clients) -> int:
    """Without --generation: the next generation of the task as read now, guarded by
    its revision. With it: exactly that request, so that a retry with the same
    --request-id returns the first answer."""
    request = lifecycle_messages.ResumeWithGenerationRequest(
        workspace_id=args.workspace,
        task_id=args.task,
        generation=args.generation or 0,
        cause=lifecycle_types.Cause(source="funnel-cli", reason=args.reason),
        request_id=args.request_id or "",
    )
    if not args.generation:
        task = (
            await clients.lifecycle.GetTask(
                lifecycle_messages.GetTaskRequest(workspace_id=args.workspace, task_id=args.task), timeout=CALL_TIMEOUT
            )
        ).task
        request.generation = task.generation + 1
        request.expected_revision = task.revision
    resumed = await clients.lifecycle.ResumeWithGeneration(request, timeout=CALL_TIMEOUT)
    _print_events(args, [resumed.event])
    return OK


def _print_events(args: argparse.Namespace, events: list[lifecycle_types.LifecycleEvent]) -> None:
    if args.output == "json":
        print_json({"events": [as_json(e) for e in events]})
    else:
        print_table(events, EVENT_COLUMNS)


# --- runs and completions -----------------------------------------------------

RUN_COLUMNS: list[Column] = [
    ("run", lambda r: r.run_id),
    ("task", lambda r: r.task_id),
    ("gen", lambda r: r.generation),
    ("agent", lambda r: r.agent_id),
    ("epoch", lambda r: r.epoch),
    ("claimed", lambda r: when(r.claim_time)),
    ("lease until", lambda r: when(r.lease_expire_time)),
    ("finished", lambda r: when(r.finish_time)),
    ("outcome", lambda r: enum_word(completion_enums.RunOutcome.Name(r.outcome), "RUN_OUTCOME_")),
    ("tokens", lambda r: r.tokens_total),
]
COMPLETION_COLUMNS: list[Column] = [
    ("completion", lambda c: c.completion_id),
    ("task", lambda c: c.task_id),
    ("gen", lambda c: c.generation),
    ("outcome", lambda c: enum_word(completion_enums.RequestedOutcome.Name(c.outcome), "REQUESTED_OUTCOME_")),
    ("run", lambda c: c.run_id),
    ("committed", lambda c: when(c.commit_time)),
    ("settlement", lambda c: enum_word(completion_enums.SettlementStatus.Name(c.settlement), "SETTLEMENT_STATUS_")),
    ("settled", lambda c: when(c.settle_time)),
    ("error", lambda c: c.terminalization_error_reason),
]


@service_command("run get")
async def run_get(args: argparse.Namespace, clients: Clients) -> int:
    response = await clients.completion.GetRun(
        completion_messages.GetRunRequest(workspace_id=args.workspace, run_id=args.run_id), timeout=CALL_TIMEOUT
    )
    if args.output == "json":
        print_json(as_json(response))
    else:
        run = response.run
        print_fields(
            [(name, get(run)) for name, get in RUN_COLUMNS]
            + [
                ("final status", enum_word(completion_enums.FinalStatus.Name(run.final_status), "FINAL_STATUS_")),
                ("notes", run.notes),
                ("error", run.error),
            ]
        )
    return OK


@service_command("run list")
async def run_list(args: argparse.Namespace, clients: Clients) -> int:
    runs = await every_page(
        lambda token: clients.completion.ListRuns(
            completion_messages.ListRunsRequest(
                workspace_id=args.workspace, task_id=args.task or "", page_size=PAGE_SIZE, page_token=token
            ),
            timeout=CALL_TIMEOUT,
        ),
        "runs",
        args.limit,
    )
    if args.output == "json":
        print_json({"runs": [as_json(r) for r in runs]})
    else:
        print_table(runs, RUN_COLUMNS)
    return OK


@service_command("completion get")
async def completion_get(args: argparse.Namespace, clients: Clients) -> int:
    generation = args.generation
    if not generation:
        generation = (
            await clients.lifecycle.GetTask(
                lifecycle_messages.GetTaskRequest(workspace_id=args.workspace, task_id=args.task), timeout=CALL_TIMEOUT
            )
        ).task.generation
    response = await clients.completion.GetCompletion(
        completion_messages.GetCompletionRequest(workspace_id=args.workspace, task_id=args.task, generation=generation),
        timeout=CALL_TIMEOUT,
    )
    if args.output == "json":
        print_json(as_json(response))
    else:
        completion = response.completion
        print_fields(
            [(name, get(completion)) for name, get in COMPLETION_COLUMNS]
            + [
                ("identity", completion.identity),
                ("result", completion.result),
                ("decision", completion.decision.instruction),
            ]
        )
    return OK


@service_command("completion list")
async def completion_list(args: argparse.Namespace, clients: Clients) -> int:
    settlement = (
        completion_enums.SETTLEMENT_STATUS_PENDING if args.pending else completion_enums.SETTLEMENT_STATUS_UNSPECIFIED
    )
    completions = await every_page(
        lambda token: clients.completion.ListCompletions(
            completion_messages.ListCompletionsRequest(
                workspace_id=args.workspace,
                task_id=args.task or "",
                settlement=settlement,
                page_size=PAGE_SIZE,
                page_token=token,
            ),
            timeout=CALL_TIMEOUT,
        ),
        "completions",
        args.limit,
    )
    if args.output == "json":
        print_json({"completions": [as_json(c) for c in completions]})
    else:
        print_table(completions, COMPLETION_COLUMNS)
    return OK


AUDIT_COLUMNS = [
    ("audit", lambda a: a.audit_id),
    ("action", lambda a: a.action),
    ("task", lambda a: a.task_id),
    ("run", lambda a: a.run_id),
    ("outcome", lambda a: a.metadata.get("outcome", "")),
    ("final status", lambda a: a.metadata.get("final_status", "")),
    ("closed by", lambda a: a.metadata.get("closed_by", "")),
    ("caller", lambda a: a.caller.subject),
    ("recorded", lambda a: when(a.record_time)),
]


@service_command("audit list")
async def audit_list(args: argparse.Namespace, clients: Clients) -> int:
    entries = await every_page(
        lambda token: clients.completion.ListAuditLog(
            completion_messages.ListAuditLogRequest(
                workspace_id=args.workspace,
                task_id=args.task or "",
                run_id=args.run_id or "",
                page_size=PAGE_SIZE,
                page_token=token,
            ),
            timeout=CALL_TIMEOUT,
        ),
        "entries",
        args.limit,
    )
    if args.output == "json":
        print_json({"entries": [as_json(e) for e in entries]})
    else:
        print_table(entries, AUDIT_COLUMNS)
    return OK


def ago(timestamp: Timestamp, now: float) -> str:
    """How long before `now` (epoch seconds) a point in time was: `4m05s`."""
    return span(now - timestamp.ToNanoseconds() / 1e9)


def span(seconds: float) -> str:
    """A duration for people, to the second and at most two units: `45s`, `4m05s`, `2h03m`, `3d04h`."""
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def outbox_columns(now: float) -> list[Column]:
    def next_attempt(c: completion_types.Completion) -> str:
        wait = c.next_settle_time.ToNanoseconds() / 1e9 - now
        # Overdue: the outbox is behind, or no completion service is running to try.
        return span(wait) if wait >= 1 else "due"

    return [
        ("task", lambda c: c.task_id),
        ("gen", lambda c: c.generation),
        ("completion", lambda c: c.completion_id),
        ("committed", lambda c: f"{ago(c.commit_time, now)} ago"),
        ("attempts", lambda c: c.settle_attempts),
        ("next attempt", lambda c: next_attempt(c) if c.HasField("next_settle_time") else ""),
        ("last error", lambda c: c.last_settle_error),
    ]


@service_command("outbox")
async def outbox(args: argparse.Namespace, clients: Clients) -> int:
    """The settlement outbox: the completions the lifecycle service has not
    answered yet, oldest commit first, with what the outbox did about each."""
    # One more than asked for tells whether the listing was cut at --limit.
    wanted = None if args.limit is None else args.limit + 1
    found = await every_page(
        lambda token: clients.completion.ListCompletions(
            completion_messages.ListCompletionsRequest(
                workspace_id=args.workspace,
                settlement=completion_enums.SETTLEMENT_STATUS_PENDING,
                page_size=PAGE_SIZE,
                page_token=token,
            ),
            timeout=CALL_TIMEOUT,
        ),
        "completions",
        wanted,
    )
    shown = found[: args.limit] if args.limit is not None else found
    more = len(found) > len(shown)
    now = time.time()
    oldest = found[0].commit_time if found else None
    if args.output == "json":
        print_json(
            {
                "completions": [as_json(c) for c in shown],
                "count": len(shown),
                "more": more,
                "oldest_commit_time": oldest.ToJsonString() if oldest else None,
                "oldest_age_seconds": round(now - oldest.ToNanoseconds() / 1e9, 3) if oldest else None,
            }
        )
        return OK
    if not shown:
        print(f"no pending settlements in workspace {args.workspace!r}")
        return OK
    print_table(shown, outbox_columns(now))
    count = f"{len(shown)}{'+' if more else ''} pending settlement{'s' if len(shown) != 1 or more else ''}"
    print(f"{count}; the oldest committed {ago(oldest, now)} ago" if oldest else count)
    return OK


# --- database files -----------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    """The full integrity check of a SQLite database (read-only; safe while the
    service runs, which keeps writing: the check reads one consistent snapshot)."""
    path = Path(args.database)
    if not path.is_file():
        print(f"funnel check: no database file at {path}", file=sys.stderr)
        return NOT_FOUND
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        print(f"funnel check: cannot open {path}: {exc}", file=sys.stderr)
        return UNREACHABLE
    try:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        progress = Progress(f"checking {path.name}", pages)
        steps = 0

        def tick() -> int:
            nonlocal steps
            steps += 1
            # integrity_check visits each page a few times; the estimate only drives the bar.
            progress.update(min(steps * 1000 // 3, pages))
            return 0

        db.set_progress_handler(tick, 1000)
        try:
            problems = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            problems = [str(exc)]
        progress.finish()
    finally:
        db.close()
    result = {
        "database": str(path),
        "pages": pages,
        "ok": problems == ["ok"],
        "problems": [] if problems == ["ok"] else problems,
    }
    if args.output == "json":
        print_json(result)
    elif result["ok"]:
        print(f"{path}: ok ({pages} pages checked)")
    else:
        print(f"{path}: DAMAGED; restore it from a backup:")
        for problem in result["problems"][:20]:
            print(f"  {problem}")
    return OK if result["ok"] else REFUSED


def cmd_backup(args: argparse.Namespace) -> int:
    """A consistent online copy of a SQLite database (SQLite's backup API: the
    running service keeps writing meanwhile). For PostgreSQL use its own tools
    (`pg_dump`, or base backups with WAL archiving)."""
    source, target = Path(args.database), Path(args.target)
    if not source.is_file():
        print(f"funnel backup: no database file at {source}", file=sys.stderr)
        return NOT_FOUND
    if target.exists():
        print(f"funnel backup: {target} exists; not overwriting it", file=sys.stderr)
        return REFUSED
    partial = target.with_name(target.name + ".partial")
    try:
        with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(partial) as dst:
            progress = Progress(f"backing up {source.name}", src.execute("PRAGMA page_count").fetchone()[0])
            src.backup(dst, pages=256, progress=lambda status, remaining, total: progress.update(total - remaining))
            progress.finish()
            problems = dst.execute("PRAGMA quick_check").fetchone()[0]
        src.close()
        dst.close()
        if problems != "ok":
            raise sqlite3.DatabaseError(f"the copy failed its check: {problems}")
        partial.rename(target)
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        print(f"funnel backup: {exc}", file=sys.stderr)
        return UNREACHABLE
    size = target.stat().st_size
    if args.output == "json":
        print_json({"database": str(source), "backup": str(target), "bytes": size})
    else:
        print(f"{source} -> {target} ({size} bytes, checked)")
    return OK


# --- the parser ---------------------------------------------------------------


def add_commands(commands: Any) -> None:
    def service(parser: argparse.ArgumentParser, *, workspace: bool = True) -> argparse.ArgumentParser:
        if workspace:
            conn.add_workspace(parser)
        conn.add_addresses(parser)
        parser.add_argument("--output", "-o", choices=["table", "json"], default="table")
        conn.add_arguments(parser)
        return parser

    task = commands.add_parser("task", help="read and steer tasks (lifecycle_service)")
    task_commands = task.add_subparsers(dest="task_command", required=True)
    get = service(task_commands.add_parser("get", help="one task's lifecycle record"))
    get.add_argument("task")
    get.set_defaults(run=task_get)
    register = service(task_commands.add_parser("register", help="register a new task (generation 1)"))
    register.add_argument("task")
    register.add_argument("--parent", help="the parent task: the new task is its child")
    register.add_argument("--parent-generation", type=int, help="the parent's generation (default: its current one)")
    register.add_argument(
        "--detached", action="store_true", help="a detached child: the parent's end does not end it (default: attached)"
    )
    register.add_argument("--reason", default="registered by an operator")
    register.add_argument("--request-id", help="makes a retry of this command safe: the first answer again")
    register.set_defaults(run=task_register)
    listing = service(task_commands.add_parser("list", help="the workspace's tasks, by task id"))
    listing.add_argument("--parent", help="only the children of this task")
    listing.add_argument("--limit", type=int, help="at most this many")
    listing.set_defaults(run=task_list)
    events = service(task_commands.add_parser("events", help="one task's lifecycle history"))
    events.add_argument("task")
    events.set_defaults(run=task_events)
    watch = service(task_commands.add_parser("watch", help="follow committed lifecycle events (Ctrl-C stops)"))
    watch.add_argument("--task", help="only this task's events")
    watch.add_argument("--after", type=int, default=0, help="start after this sequence (default: the beginning)")
    watch.add_argument("--count", type=int, help="stop after this many events")
    watch.set_defaults(run=task_watch)
    cancel = service(task_commands.add_parser("cancel", help="request cancellation of a task's generation"))
    cancel.add_argument("task")
    cancel.add_argument("--generation", type=int, help="default: the current one")
    cancel.add_argument("--reason", default="cancelled by an operator")
    cancel.add_argument("--settle", action="store_true", help="also settle it: the task becomes CANCELLED now")
    cancel.add_argument("--request-id", help="with --generation, makes a retry of this command safe")
    cancel.set_defaults(run=task_cancel)
    resume = service(task_commands.add_parser("resume", help="start the next generation of a terminal task"))
    resume.add_argument("task")
    resume.add_argument("--generation", type=int, help="the generation to start (default: the current one + 1)")
    resume.add_argument("--reason", default="resumed by an operator")
    resume.add_argument("--request-id", help="with --generation, makes a retry of this command safe")
    resume.set_defaults(run=task_resume)

    run = commands.add_parser("run", help="agent runs (completion_service)")
    run_commands = run.add_subparsers(dest="run_command", required=True)
    get = service(run_commands.add_parser("get", help="one run"))
    get.add_argument("run_id", metavar="RUN")
    get.set_defaults(run=run_get)
    listing = service(run_commands.add_parser("list", help="runs, newest claim first"))
    listing.add_argument("--task", help="only this task's runs")
    listing.add_argument("--limit", type=int)
    listing.set_defaults(run=run_list)

    completion = commands.add_parser("completion", help="completions and their settlement (completion_service)")
    completion_commands = completion.add_subparsers(dest="completion_command", required=True)
    get = service(completion_commands.add_parser("get", help="the completion of a task generation"))
    get.add_argument("task")
    get.add_argument("--generation", type=int, help="default: the task's current one")
    get.set_defaults(run=completion_get)
    listing = service(completion_commands.add_parser("list", help="completions, oldest commit first"))
    listing.add_argument("--task", help="only this task's completions")
    listing.add_argument("--pending", action="store_true", help="only those whose settlement is pending")
    listing.add_argument("--limit", type=int)
    listing.set_defaults(run=completion_list)

    audit = commands.add_parser("audit", help="the audit log: one row per closed run (completion_service)")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    listing = service(audit_commands.add_parser("list", help="the workspace's audit rows, oldest first"))
    listing.add_argument("--task", help="only this task's rows")
    listing.add_argument("--run", dest="run_id", metavar="RUN", help="only this run's rows")
    listing.add_argument("--limit", type=int, help="at most this many")
    listing.set_defaults(run=audit_list)

    pending = service(
        commands.add_parser(
            "outbox", help="the settlement outbox: pending completions, their age, attempts, next attempt, last error"
        )
    )
    pending.add_argument("--limit", type=int, help="at most this many, oldest first")
    pending.set_defaults(run=outbox)

    check = commands.add_parser("check", help="the full integrity check of a SQLite database file")
    check.add_argument("database", help="e.g. funnel-data/lifecycle.sqlite3")
    check.add_argument("--output", "-o", choices=["table", "json"], default="table")
    check.set_defaults(run=cmd_check)
    backup = commands.add_parser("backup", help="a consistent online copy of a SQLite database file")
    backup.add_argument("database")
    backup.add_argument("target", help="the new file (never overwritten)")
    backup.add_argument("--output", "-o", choices=["table", "json"], default="table")
    backup.set_defaults(run=cmd_backup)
