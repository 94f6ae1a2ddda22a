"""The `funnel` command.

funnel up [--demo]       both services on localhost with SQLite files in ./funnel-data,
                         TLS between them and tokens for callers (local PKI in ./funnel-data/tls),
                         Prometheus metrics on http://127.0.0.1:9451/metrics and :9452/metrics
funnel demo              the story, against services already running
funnel transcript export TASK / import FILE --task TASK
funnel token issue --workspace W --role R [--ttl D]   signed by the key `funnel up` made
funnel pki init          the local PKI and token signing key only, without starting services
funnel ui [--listen 127.0.0.1:8470] [--action-token T]   the live dashboard
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import time
from importlib import resources
from pathlib import Path
from types import FrameType

import grpc
import jwt

from funnel.auth.pki import LocalPki, ensure_local_pki
from funnel.auth.principal import ALL_WORKSPACES, GRANTABLE, subject_problem
from funnel.auth.tokens import DEFAULT_AUDIENCE, DEFAULT_ISSUER, SigningKeyError
from funnel.client import FunnelError
from funnel.client import connection as conn
from funnel.runtime.postgres import redacted
from funnel.runtime.validation import id_problem
from funnel_cli import operate
from funnel_cli.demo import WORKSPACE, DemoCallers, DemoFailed, run_demo
from funnel_cli.supervisor import StartupFailed, start_pair, wait_serving
from funnel_cli.transcripts import export_transcript, import_transcript, report_import
from funnel_mcp import cli as mcp_cli
from funnel_ui import cli as ui_cli


def _default_policy() -> str:
    return str(resources.files("funnel_cli") / "demo_policy.toml")


def demo_callers(args: argparse.Namespace, connection: conn.Connection) -> DemoCallers:
    """A given token plays both roles of the story; otherwise a host and an agent
    of workspace `demo` get tokens signed by the local key of `funnel up`."""
    if (args.token or args.token_file) and connection.token is not None:
        subject = jwt.decode(connection.token, options={"verify_signature": False}).get("sub", "demo-agent")
        return DemoCallers(connection, connection, subject)
    data_dir = Path(args.data_dir)
    host = connection.with_token(conn.local_token(data_dir, "demo-host", [f"{WORKSPACE}:host"]))
    agent = connection.with_token(conn.local_token(data_dir, "demo-agent", [f"{WORKSPACE}:agent"]))
    return DemoCallers(host, agent, "demo-agent")


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    try:
        lifecycle, completion = start_pair(
            data_dir,
            f"127.0.0.1:{args.lifecycle_port}",
            f"127.0.0.1:{args.completion_port}",
            args.policy_file or _default_policy(),
            database_url=args.database,
            lifecycle_metrics=_metrics_listen(args.lifecycle_metrics_port),
            completion_metrics=_metrics_listen(args.completion_metrics_port),
            reflection=args.reflection,
        )
    except StartupFailed as exc:
        print(f"funnel up: {exc}", file=sys.stderr)
        return 1
    stop_requested = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        connection = conn.from_arguments(args)
        asyncio.run(_wait_both(connection, lifecycle.address, completion.address))
        where = {
            name: f"PostgreSQL {redacted(args.database)}, schema funnel_{name}"
            if args.database
            else f"SQLite {data_dir / (name + '.sqlite3')}"
            for name in ("lifecycle", "completion")
        }
        print(f"lifecycle_service   {lifecycle.address}   ({where['lifecycle']}; TLS, client certificates)")
        print(f"completion_service  {completion.address}   ({where['completion']}; TLS)")
        if args.reflection:
            print("gRPC reflection on both (grpcurl, buf curl); --no-reflection turns it off")
        for service in (lifecycle, completion):
            if service.metrics_url:
                print(f"{service.name + ' metrics':<27} {service.metrics_url}")
        print(f"CA, certificates and the token signing key in {data_dir / 'tls'}; `funnel token issue` makes tokens.")
        print(f"logs in {data_dir}/*.log; both SERVING. Ctrl-C stops both.", flush=True)
        if args.demo:
            print("\nDemo: one task through the whole story", flush=True)
            asyncio.run(
                run_demo(
                    demo_callers(args, connection),
                    lifecycle.address,
                    completion.address,
                    lambda line: print(line, flush=True),
                )
            )
            print("\nDemo finished. The services keep running; Ctrl-C stops them.", flush=True)
        while not stop_requested:
            for service in (lifecycle, completion):
                if service.process.poll() is not None:
                    print(
                        f"{service.name} exited with code {service.process.returncode}; see {service.log_path}",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.5)
        return 0
    except (StartupFailed, DemoFailed, FunnelError, conn.ConnectionSetupError) as exc:
        print(f"funnel up: {exc}", file=sys.stderr)
        return 1
    finally:
        codes = [completion.stop(), lifecycle.stop()]
        print(f"stopped (exit codes {codes[1]}, {codes[0]})", flush=True)


def _metrics_listen(port: int) -> str | None:
    """Where `funnel up` has a service serve metrics: loopback (0: any free port; negative: none)."""
    return None if port < 0 else f"127.0.0.1:{port}"


async def _wait_both(connection: conn.Connection, lifecycle_address: str, completion_address: str) -> None:
    await asyncio.gather(wait_serving(connection, lifecycle_address), wait_serving(connection, completion_address))


def _hint(connection: conn.Connection | None, code: grpc.StatusCode, details: str | None) -> str:
    return conn.missing_certificate_hint(connection, code, details) if connection is not None else ""


def _failed(command: str, connection: conn.Connection | None, error: grpc.aio.AioRpcError) -> int:
    print(
        f"funnel {command}: {error.code().name}: {error.details()}{_hint(connection, error.code(), error.details())}",
        file=sys.stderr,
    )
    return 1


def cmd_demo(args: argparse.Namespace) -> int:
    connection = None
    try:
        connection = conn.from_arguments(args)
        asyncio.run(run_demo(demo_callers(args, connection), args.lifecycle, args.completion))
    except (DemoFailed, conn.ConnectionSetupError) as exc:
        print(f"funnel demo: {exc}", file=sys.stderr)
        return 1
    except FunnelError as error:
        print(f"funnel demo: {error}{_hint(connection, error.code, error.message)}", file=sys.stderr)
        return 1
    return 0


def cmd_transcript_export(args: argparse.Namespace) -> int:
    connection = None
    try:
        connection = conn.from_arguments(args)
        if args.output:
            with open(args.output, "wb") as out:
                lines = asyncio.run(export_transcript(connection, args.completion, args.workspace, args.task, out))
            print(f"exported {lines} events to {args.output}", file=sys.stderr)
        else:
            asyncio.run(export_transcript(connection, args.completion, args.workspace, args.task, sys.stdout.buffer))
    except grpc.aio.AioRpcError as error:
        return _failed("transcript export", connection, error)
    except conn.ConnectionSetupError as error:
        print(f"funnel transcript export: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_transcript_import(args: argparse.Namespace) -> int:
    connection = None
    try:
        connection = conn.from_arguments(args)
        report_import(
            asyncio.run(import_transcript(connection, args.completion, args.workspace, args.task, Path(args.file)))
        )
    except grpc.aio.AioRpcError as error:
        return _failed("transcript import", connection, error)
    except (OSError, conn.ConnectionSetupError) as error:
        print(f"funnel transcript import: {error}", file=sys.stderr)
        return 1
    return 0


_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> int:
    """`90s`, `15m`, `12h`, `7d` -> seconds."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 12h or 7d")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def cmd_token_issue(args: argparse.Namespace) -> int:
    if args.workspace != ALL_WORKSPACES and id_problem(args.workspace):
        print(f"funnel token issue: workspace {args.workspace!r} {id_problem(args.workspace)}", file=sys.stderr)
        return 2
    subject = args.subject or f"{args.role}@{args.workspace}"
    # The services refuse a token whose subject is outside the safe set: do not mint one.
    if subject_problem(subject):
        print(
            f"funnel token issue: subject {subject!a} {subject_problem(subject)}; pass another --subject",
            file=sys.stderr,
        )
        return 2
    # Never made here: a fresh key would sign tokens that every running service
    # rejects (`CREDENTIALS_INVALID … not in the key set`). `funnel up` (or
    # `funnel pki init`) makes the key; this command only reads it.
    pki = LocalPki(Path(args.data_dir).absolute() / "tls")
    if not (pki.signing_key.exists() and pki.jwks.exists()):
        print(
            f"funnel token issue: no token signing key in {pki.directory} (looked there for --data-dir "
            f"{args.data_dir!r}, which FUNNEL_DATA_DIR also sets); pass the --data-dir of the `funnel up` "
            "whose services should accept the token, or run `funnel up` (or `funnel pki init`) there first",
            file=sys.stderr,
        )
        return 1
    try:
        key = pki.load_signing_key()
    except (SigningKeyError, OSError, ValueError, LookupError) as exc:
        print(f"funnel token issue: cannot read the signing key in {pki.directory}: {exc}", file=sys.stderr)
        return 1
    permissions = [f"{args.workspace}:{role}" for role in args.role.split(",")]
    print(key.issue(subject, permissions, args.ttl, issuer=args.issuer, audience=args.audience))
    return 0


def cmd_pki_init(args: argparse.Namespace) -> int:
    directory = Path(args.data_dir).absolute() / "tls"
    existed = LocalPki(directory).signing_key.exists()
    pki = ensure_local_pki(directory)
    print(f"{'kept' if existed else 'made'} the local PKI and token signing key in {pki.directory}")
    return 0


def _roles(text: str) -> str:
    roles = text.split(",")
    unknown = [role for role in roles if role not in GRANTABLE]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown role(s) {unknown}; roles are {', '.join(GRANTABLE)}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="funnel", description="Run and exercise the funnel services locally.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start both services and wait for Ctrl-C")
    up.add_argument("--lifecycle-port", type=int, default=50051)
    up.add_argument("--completion-port", type=int, default=50052)
    up.add_argument(
        "--lifecycle-metrics-port",
        type=int,
        default=9451,
        help="the lifecycle service's Prometheus metrics on 127.0.0.1 (0: any free port; -1: none)",
    )
    up.add_argument(
        "--completion-metrics-port",
        type=int,
        default=9452,
        help="the completion service's Prometheus metrics on 127.0.0.1 (0: any free port; -1: none)",
    )
    up.add_argument("--policy-file", help="gate policy TOML (default: the demo policy)")
    up.add_argument(
        "--reflection",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="both services serve gRPC reflection, so grpcurl and `buf curl` list and describe them "
        "(default: on; reflection answers without a token, the lifecycle one with a client certificate)",
    )
    up.add_argument("--demo", action="store_true", help="walk one task through the story once both serve")
    up.add_argument(
        "--database",
        default=os.environ.get("FUNNEL_DATABASE"),
        metavar="postgresql://…",
        help="run both services on this PostgreSQL database, each in its own schema, instead of "
        "SQLite files in --data-dir (FUNNEL_DATABASE)",
    )
    conn.add_arguments(up)
    up.set_defaults(run=cmd_up)
    demo = commands.add_parser("demo", help="walk one task through the story against running services")
    conn.add_addresses(demo)
    conn.add_arguments(demo)
    demo.set_defaults(run=cmd_demo)
    transcript = commands.add_parser("transcript", help="move a task's transcript in or out as JSONL")
    transcript_commands = transcript.add_subparsers(dest="transcript_command", required=True)
    export = transcript_commands.add_parser("export", help="write a task's transcript as JSONL")
    export.add_argument("task")
    conn.add_workspace(export)
    conn.add_addresses(export, lifecycle=False)
    export.add_argument("--output", "-o", help="file to write (default: standard output)")
    conn.add_arguments(export)
    export.set_defaults(run=cmd_transcript_export)
    load = transcript_commands.add_parser("import", help="import a JSONL transcript into a task with none")
    load.add_argument("file")
    load.add_argument("--task", required=True)
    conn.add_workspace(load)
    conn.add_addresses(load, lifecycle=False)
    conn.add_arguments(load)
    load.set_defaults(run=cmd_transcript_import)
    mcp = commands.add_parser(
        "mcp",
        help="serve the agent's MCP tools (stdio, or Streamable HTTP with --http)",
        description="An MCP server whose tools (claim_task, complete_task, record_evidence, attempt_completion, "
        "get_task) call the services with the agent's token. Over stdio it serves the host that spawned it; "
        "over Streamable HTTP (--http) it is an OAuth resource server and every caller sends its own token.",
    )
    mcp_cli.add_arguments(mcp, duration_seconds)
    mcp.set_defaults(run=mcp_cli.run)
    ui = commands.add_parser(
        "ui",
        help="serve the live dashboard (tasks, lifecycle timelines, completions) on loopback",
        description="A web dashboard, a client of both services: task lists, lifecycle timelines, completion "
        "attempts and settlements, runs and transcripts, updated live.",
    )
    ui_cli.add_arguments(ui)
    ui.set_defaults(run=ui_cli.run)
    operate.add_commands(commands)
    token = commands.add_parser("token", help="bearer tokens for local use")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    issue = token_commands.add_parser(
        "issue", help="print a token signed with the local key of `funnel up` (--data-dir)"
    )
    issue.add_argument("--workspace", required=True, help="the workspace it grants, or * for every workspace")
    issue.add_argument(
        "--role", required=True, type=_roles, help=f"one or more of {', '.join(GRANTABLE)}, comma separated"
    )
    issue.add_argument(
        "--ttl", type=duration_seconds, default=duration_seconds("12h"), help="lifetime: 90s, 15m, 12h, 7d"
    )
    issue.add_argument("--subject", help="the token's `sub` (default: <role>@<workspace>); an agent's agent_id")
    issue.add_argument(
        "--issuer",
        default=conn.env("FUNNEL_TOKEN_ISSUER", DEFAULT_ISSUER),
        help=f"`iss` (the services' --token-issuer; FUNNEL_TOKEN_ISSUER; default: {DEFAULT_ISSUER})",
    )
    issue.add_argument(
        "--audience",
        default=conn.env("FUNNEL_TOKEN_AUDIENCE", DEFAULT_AUDIENCE),
        help=f"`aud` (the services' --token-audience; FUNNEL_TOKEN_AUDIENCE; default: {DEFAULT_AUDIENCE})",
    )
    conn.add_data_dir(issue, "where `funnel up` keeps its files; its signing key is read, never made here")
    issue.set_defaults(run=cmd_token_issue)
    pki = commands.add_parser("pki", help="the local trust material of `funnel up`")
    pki_commands = pki.add_subparsers(dest="pki_command", required=True)
    init = pki_commands.add_parser(
        "init",
        help="make (or complete, or renew) the CA, certificates and token signing key in --data-dir/tls "
        "without starting the services, e.g. for deploy/compose.yaml",
    )
    conn.add_data_dir(init, "where `funnel up` keeps its files")
    init.set_defaults(run=cmd_pki_init)
    return parser


# What a Unix tool ended by SIGPIPE reports (128 + 13): the output was cut short by
# its reader (`funnel task list | head`), so neither "done" nor a failure to report.
BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> None:
    try:
        args = build_parser().parse_args(argv)
        code = args.run(args)
        # Flushed here, where a reader that went away can still be told apart.
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped reading: end quietly. Standard output now points at
        # /dev/null so that the interpreter's own flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(BROKEN_PIPE)
    sys.exit(code)


if __name__ == "__main__":
    main()
