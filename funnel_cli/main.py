"""The `funnel` command.

    funnel up [--demo]       both services on localhost with SQLite files in ./funnel-data
    funnel demo              the story, against services already running
    funnel transcript export TASK / import FILE --task TASK
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from importlib import resources
from pathlib import Path

import grpc

from funnel_cli.demo import DemoFailed, run_demo
from funnel_cli.transcripts import export_transcript, import_transcript, report_import
from funnel_cli.supervisor import StartupFailed, start_pair, wait_serving


def _default_policy() -> str:
    return str(resources.files("funnel_cli") / "demo_policy.toml")


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    try:
        lifecycle, completion = start_pair(
            data_dir,
            f"127.0.0.1:{args.lifecycle_port}",
            f"127.0.0.1:{args.completion_port}",
            args.policy_file or _default_policy(),
        )
    except StartupFailed as exc:
        print(f"funnel up: {exc}", file=sys.stderr)
        return 1
    stop_requested = False

    def request_stop(signum, frame) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        asyncio.run(_wait_both(lifecycle.address, completion.address))
        print(f"lifecycle_service   {lifecycle.address}   (SQLite {data_dir / 'lifecycle.sqlite3'})")
        print(f"completion_service  {completion.address}   (SQLite {data_dir / 'completion.sqlite3'})")
        print(f"logs in {data_dir}/*.log; both SERVING. Ctrl-C stops both.", flush=True)
        if args.demo:
            print("\nDemo: one task through the whole story", flush=True)
            asyncio.run(run_demo(lifecycle.address, completion.address, lambda line: print(line, flush=True)))
            print("\nDemo finished. The services keep running; Ctrl-C stops them.", flush=True)
        while not stop_requested:
            for service in (lifecycle, completion):
                if service.process.poll() is not None:
                    print(f"{service.name} exited with code {service.process.returncode}; see {service.log_path}",
                          file=sys.stderr)
                    return 1
            time.sleep(0.5)
        return 0
    except (StartupFailed, DemoFailed) as exc:
        print(f"funnel up: {exc}", file=sys.stderr)
        return 1
    finally:
        codes = [completion.stop(), lifecycle.stop()]
        print(f"stopped (exit codes {codes[1]}, {codes[0]})", flush=True)


async def _wait_both(lifecycle_address: str, completion_address: str) -> None:
    await asyncio.gather(wait_serving(lifecycle_address), wait_serving(completion_address))


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        asyncio.run(run_demo(args.lifecycle, args.completion))
    except DemoFailed as exc:
        print(f"funnel demo: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_transcript_export(args: argparse.Namespace) -> int:
    try:
        if args.output:
            with open(args.output, "wb") as out:
                lines = asyncio.run(export_transcript(args.completion, args.workspace, args.task, out))
            print(f"exported {lines} events to {args.output}", file=sys.stderr)
        else:
            asyncio.run(export_transcript(args.completion, args.workspace, args.task, sys.stdout.buffer))
    except grpc.aio.AioRpcError as error:
        print(f"funnel transcript export: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    return 0


def cmd_transcript_import(args: argparse.Namespace) -> int:
    try:
        report_import(asyncio.run(import_transcript(args.completion, args.workspace, args.task, Path(args.file))))
    except grpc.aio.AioRpcError as error:
        print(f"funnel transcript import: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"funnel transcript import: {error}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="funnel", description="Run and exercise the funnel services locally.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start both services and wait for Ctrl-C")
    up.add_argument("--data-dir", default="funnel-data", help="where the SQLite files and logs go")
    up.add_argument("--lifecycle-port", type=int, default=50051)
    up.add_argument("--completion-port", type=int, default=50052)
    up.add_argument("--policy-file", help="gate policy TOML (default: the demo policy)")
    up.add_argument("--demo", action="store_true", help="walk one task through the story once both serve")
    up.set_defaults(run=cmd_up)
    demo = commands.add_parser("demo", help="walk one task through the story against running services")
    demo.add_argument("--lifecycle", default="127.0.0.1:50051")
    demo.add_argument("--completion", default="127.0.0.1:50052")
    demo.set_defaults(run=cmd_demo)
    transcript = commands.add_parser("transcript", help="move a task's transcript in or out as JSONL")
    transcript_commands = transcript.add_subparsers(dest="transcript_command", required=True)
    export = transcript_commands.add_parser("export", help="write a task's transcript as JSONL")
    export.add_argument("task")
    export.add_argument("--workspace", default="demo")
    export.add_argument("--completion", default="127.0.0.1:50052")
    export.add_argument("--output", "-o", help="file to write (default: standard output)")
    export.set_defaults(run=cmd_transcript_export)
    load = transcript_commands.add_parser("import", help="import a JSONL transcript into a task with none")
    load.add_argument("file")
    load.add_argument("--task", required=True)
    load.add_argument("--workspace", default="demo")
    load.add_argument("--completion", default="127.0.0.1:50052")
    load.set_defaults(run=cmd_transcript_import)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.run(args))


if __name__ == "__main__":
    main()
