"""`funnel ui`: its flags, and starting the server.

Two credentials: the connection's token (`--token`, FUNNEL_TOKEN, `--token-file`)
is the viewer credential every read and watch uses; against `funnel up` with
none given, a `*:viewer` token is signed with the local key. The optional action
credential (`--action-token`, FUNNEL_ACTION_TOKEN, `--action-token-file`) is a
host's or operator's; only with it do the action buttons and endpoints exist."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from funnel.auth.hosts import own_names
from funnel.auth.tls import is_loopback
from funnel.client import TokenSource, local_tokens, token_file
from funnel.client import connection as conn
from funnel.runtime.validation import id_problem

DEFAULT_LISTEN = "127.0.0.1:8470"
VIEWER_TTL = 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default=os.environ.get("FUNNEL_UI_LISTEN", DEFAULT_LISTEN),
        help=f"HOST:PORT to serve the dashboard on (FUNNEL_UI_LISTEN; default {DEFAULT_LISTEN}; port 0: any free port)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="serve on a non-loopback address (read-only: refused with an action credential)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer besides the listening address (and, on loopback or 0.0.0.0, "
        "localhost, 127.0.0.1, [::1]); *.example.com for its subdomains; repeatable. "
        "Others are refused (DNS rebinding)",
    )
    parser.add_argument(
        "--workspace",
        action="append",
        default=[w for w in os.environ.get("FUNNEL_WORKSPACE", "").split(",") if w],
        help="a workspace listed on the start page (repeatable; FUNNEL_WORKSPACE, comma separated)",
    )
    parser.add_argument(
        "--lifecycle",
        default=os.environ.get("FUNNEL_LIFECYCLE", "127.0.0.1:50051"),
        help="lifecycle_service address (FUNNEL_LIFECYCLE)",
    )
    parser.add_argument(
        "--completion",
        default=os.environ.get("FUNNEL_COMPLETION", "127.0.0.1:50052"),
        help="completion_service address (FUNNEL_COMPLETION)",
    )
    parser.add_argument(
        "--action-token",
        default=os.environ.get("FUNNEL_ACTION_TOKEN"),
        help="a host or operator token for Resume task, New chat and Request cancellation "
        "(FUNNEL_ACTION_TOKEN); without it the dashboard only reads",
    )
    parser.add_argument("--action-token-file", help="file holding the action token (read again on every call)")
    parser.add_argument(
        "--long-run-minutes",
        type=float,
        default=60.0,
        metavar="M",
        help="the attention page lists runs open longer than this with a live lease (default 60)",
    )
    conn.add_arguments(parser)


def _from_file(path: str) -> TokenSource:
    # Read on every call, so that a rotated token needs no restart.
    read = token_file(path)
    read()  # fail now, not on the first click
    return read


def _local_viewer(data_dir: Path) -> TokenSource:
    """`*:viewer` tokens from the local signing key, each signed again before it expires."""
    try:
        return local_tokens(data_dir, "funnel-ui", ["*:viewer"], VIEWER_TTL)
    except OSError:
        raise conn.ConnectionSetupError(
            f"no token given and no local signing key in {data_dir / 'tls'} (start `funnel up` there, or pass --token)"
        ) from None


def run(args: argparse.Namespace) -> int:
    def refuse(message: str) -> int:
        print(f"funnel ui: {message}", file=sys.stderr)
        return 2

    host, _, port = args.listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return refuse(f"--listen wants HOST:PORT, not {args.listen!r}")
    for workspace in args.workspace:
        if id_problem(workspace):
            return refuse(f"workspace {workspace!r} {id_problem(workspace)}")
    try:
        connection = conn.from_arguments(args, local_operator=False)
        viewer = (
            _from_file(args.token_file)
            if args.token_file
            else (lambda token=connection.token: token)
            if connection.token
            else _local_viewer(Path(args.data_dir))
        )
        action = (
            _from_file(args.action_token_file)
            if args.action_token_file
            else (lambda token=args.action_token: token)
            if args.action_token
            else None
        )
    except (conn.ConnectionSetupError, OSError) as exc:
        return refuse(str(exc))
    if not is_loopback(args.listen):
        if action is not None:
            # Whoever reaches the port would act with the configured credential.
            return refuse("an action credential is served on loopback only")
        if not args.allow_remote:
            return refuse(f"{host} is not a loopback address; pass --allow-remote to serve the read-only dashboard")

    # Imported here: the web stack is needed by this command only.
    import uvicorn

    from funnel.runtime.http import uvicorn_config
    from funnel_ui import grants
    from funnel_ui.app import Context, create_app
    from funnel_ui.backend import Settings

    settings = Settings(args.lifecycle, args.completion, connection.tls, viewer, action)
    allowed_hosts = tuple(dict.fromkeys([*own_names(host), *args.allowed_host]))
    if not args.long_run_minutes > 0:
        return refuse("--long-run-minutes must be positive")
    app = create_app(
        Context(
            settings, tuple(dict.fromkeys(args.workspace)), allowed_hosts, long_run_seconds=args.long_run_minutes * 60
        )
    )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        return refuse(f"cannot listen on {args.listen}: {exc.strerror or exc}")
    sock.listen(128)
    bound_host, bound_port = sock.getsockname()[:2]
    where = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    mode = grants.start_mode(action() if action is not None else None)
    print(f"funnel ui serving on http://{where}:{bound_port} ({mode})", flush=True)
    config = uvicorn_config(app, log_level="warning", loop="asyncio", lifespan="on", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
