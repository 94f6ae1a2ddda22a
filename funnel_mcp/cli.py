"""`funnel mcp`: its flags, the refusals of unsafe or incomplete setups, and
starting the server. The MCP SDK is imported only when the command runs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from funnel.auth import tokens
from funnel.auth.pki import LocalPki
from funnel.client import connection as conn
from funnel.runtime import logs
from funnel.runtime.validation import id_problem

if TYPE_CHECKING:
    from funnel_mcp.authorization import ResourceServer

HTTP_PATH = "/mcp"


def add_arguments(parser: argparse.ArgumentParser, duration: Callable[[str], int]) -> None:
    env = os.environ.get
    parser.add_argument(
        "--workspace",
        default=env("FUNNEL_WORKSPACE"),
        help="the workspace the tools act in (FUNNEL_WORKSPACE); required over stdio. --http: "
        "the one workspace served; without it each caller acts in the workspace its token grants",
    )
    parser.add_argument(
        "--agent-id",
        default=env("FUNNEL_AGENT_ID"),
        help="the agent_id of claims (FUNNEL_AGENT_ID; default: the token's subject)",
    )
    parser.add_argument(
        "--lifecycle",
        default=env("FUNNEL_LIFECYCLE", "127.0.0.1:50051"),
        help="lifecycle_service address (FUNNEL_LIFECYCLE)",
    )
    parser.add_argument(
        "--completion",
        default=env("FUNNEL_COMPLETION", "127.0.0.1:50052"),
        help="completion_service address (FUNNEL_COMPLETION)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=duration,
        default=duration("2m"),
        help="lease lifetime of claims, renewed by the server at a third of it: 90s, 5m",
    )
    parser.add_argument(
        "--session-idle-timeout",
        type=duration,
        default=duration("2m"),
        help="--http: a session with no request in flight (an open GET stream is one), or a sessionless caller's "
        "run that no call names, is abandoned after this and its runs are closed stalled, freeing their tasks "
        "(default 2m). Over stdio a run ends when the host closes the pipe",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help=f"serve Streamable HTTP at http://HOST:PORT{HTTP_PATH} instead of stdio, as an OAuth "
        "resource server: every caller sends its own bearer token",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="--http: a Host header to answer, as clients send it (NAME:* for any port), besides the bound "
        "address and, on loopback or 0.0.0.0, localhost, 127.0.0.1 and [::1] with the port; repeatable. "
        "Others get 421 (DNS rebinding)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="URL",
        help="--http: an Origin header to answer besides http(s)://ALLOWED-HOST, e.g. https://app.example; "
        "repeatable. Others get 403",
    )
    oauth = parser.add_argument_group("--http: OAuth resource server (docs/mcp.md, Authorization)")
    oauth.add_argument(
        "--authorization-server",
        action="append",
        default=[],
        metavar="URL",
        help="the issuer URL of an OAuth authorization server that issues the services' tokens, "
        "named in the protected-resource metadata; repeatable (default: --token-issuer, when it "
        "is a URL)",
    )
    oauth.add_argument(
        "--resource-url",
        metavar="URL",
        help=f"the URL clients reach the MCP endpoint at (default http://HOST:PORT{HTTP_PATH}); set it behind a proxy",
    )
    oauth.add_argument(
        "--jwks-file",
        default=env("FUNNEL_JWKS_FILE"),
        help="the services' JWKS, which verifies callers' tokens; reloaded on change "
        "(FUNNEL_JWKS_FILE; default: --data-dir's)",
    )
    oauth.add_argument(
        "--token-issuer",
        default=env("FUNNEL_TOKEN_ISSUER", tokens.DEFAULT_ISSUER),
        help="required `iss` of tokens, as the services require it (FUNNEL_TOKEN_ISSUER)",
    )
    oauth.add_argument(
        "--token-audience",
        default=env("FUNNEL_TOKEN_AUDIENCE", tokens.DEFAULT_AUDIENCE),
        help="required `aud` of tokens, as the services require it (FUNNEL_TOKEN_AUDIENCE)",
    )
    parser.add_argument("--log-level", default=env("FUNNEL_LOG_LEVEL", "INFO"), help="(FUNNEL_LOG_LEVEL)")
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=env("FUNNEL_LOG_FORMAT") or logs.default_format(),
        help="on stderr: a start line and one line per tool call (tool, caller, workspace, task, "
        "run, outcome, duration); JSON unless stderr is a terminal (FUNNEL_LOG_FORMAT)",
    )
    conn.add_arguments(parser)


class Refusal(Exception):
    """`funnel mcp` would be unsafe or cannot work as configured; the message says why."""


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except Refusal as refusal:
        # Never on stdout: over stdio that is the protocol channel.
        print(f"funnel mcp: {refusal}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    # Imported here: the MCP SDK is needed by this command only.
    from funnel_mcp.door import Settings
    from funnel_mcp.server import serve_http, serve_stdio

    if args.workspace and id_problem(args.workspace):
        raise Refusal(f"workspace {args.workspace!r} {id_problem(args.workspace)}")
    try:
        connection = conn.from_arguments(args, local_operator=False)
    except conn.ConnectionSetupError as exc:
        raise Refusal(str(exc)) from None
    if args.token_file:
        connection = connection.with_token(None)  # read again on every call: rotation needs no restart
    has_token = bool(connection.token or args.token_file)
    address = None
    if args.http:
        if has_token:
            # Whoever reaches the port would act with it.
            raise Refusal(
                "over --http every client sends its own token (`Authorization: Bearer`); start "
                "without --token, --token-file and FUNNEL_TOKEN"
            )
        address = http_address(args.http)
    else:
        if not args.workspace:
            raise Refusal("--workspace (or FUNNEL_WORKSPACE) is required")
        if not has_token:
            raise Refusal("the agent's token is required: --token, FUNNEL_TOKEN or --token-file")
    logs.configure(args.log_level, args.log_format)
    settings = Settings(
        workspace=args.workspace or None,
        lifecycle_address=args.lifecycle,
        completion_address=args.completion,
        connection=connection,
        token_file=args.token_file,
        agent_id=args.agent_id,
        lease_ttl=float(args.lease_ttl),
        session_idle_timeout=float(args.session_idle_timeout),
        resource=resource_server(args, *address) if address else None,
        allowed_hosts=tuple(args.allowed_host),
        allowed_origins=tuple(args.allowed_origin),
    )
    if address is None:
        serve_stdio(settings)
        return 0
    try:
        serve_http(settings, *address)
    except tokens.KeySetError as exc:
        raise Refusal(str(exc)) from None
    return 0


def http_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise Refusal(f"--http wants HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def resource_server(args: argparse.Namespace, host: str, port: int) -> ResourceServer:
    from funnel_mcp.authorization import ResourceServer

    jwks = args.jwks_file or str(LocalPki(Path(args.data_dir) / "tls").jwks)
    if not Path(jwks).exists():
        raise Refusal(
            f"no JWKS to verify callers' tokens at {jwks}: pass --jwks-file (the services' JWKS) or "
            "the --data-dir of `funnel up`"
        )
    servers = args.authorization_server or ([args.token_issuer] if is_url(args.token_issuer) else [])
    unusable = [url for url in (*servers, args.resource_url or "http://here") if not is_url(url)]
    if unusable:
        raise Refusal(f"--authorization-server and --resource-url want an http(s) URL, not {unusable[0]!r}")
    named = f"[{host}]" if ":" in host else host
    return ResourceServer(
        args.resource_url or f"http://{named}:{port}{HTTP_PATH}",
        tuple(servers),
        jwks,
        args.token_issuer,
        args.token_audience,
    )


def is_url(text: str) -> bool:
    parsed = urlparse(text)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)
