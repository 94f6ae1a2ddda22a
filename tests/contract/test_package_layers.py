"""The packages import one way: the CLI starts the MCP server and the dashboard,
so no product package imports `funnel_cli` (the connection code they share lives
in funnel.client), and the services import none of the commands. Inside each
service the rooms import one way too (docs/architecture.md): the pure core
nothing of the service and no I/O, units of work nothing above the storage port,
the storage adapters nothing above the port, and nothing imports the gRPC face
but the server (and the outbound clients its proto mapping)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("funnel_cli", "funnel_mcp", "funnel_ui", "funnel_sim")


def imported(package: str, *, whole: bool = False) -> set[tuple[str, str]]:
    """(file, imported top-level package, or the whole module name) for every
    import under `package` (a folder or one module, dotted)."""
    found = set()
    where = ROOT / package.replace(".", "/")
    for path in where.rglob("*.py") if where.is_dir() else [where.with_suffix(".py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found |= {(str(path.relative_to(ROOT)), name if whole else name.split(".")[0]) for name in names}
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("funnel", COMMANDS),
        ("funnel_mcp", ("funnel_cli",)),
        ("funnel_ui", ("funnel_cli",)),
        ("lifecycle_service", COMMANDS),
        ("completion_service", COMMANDS),
    ],
)
def test_no_package_imports_back_up_into_the_commands(package, forbidden):
    back = sorted((file, name) for file, name in imported(package) if name in forbidden)
    assert back == []


# What no pure or transactional room may touch: the wire, the event loop, the contract's messages.
IO = ("grpc", "asyncio", "google.protobuf", "funnel.completion.v1", "funnel.lifecycle.v1", "aiosqlite", "psycopg")
# A unit of work reaches storage through its port (and the memory fake only in tests), never an engine's adapter.
ADAPTERS = ("storage.sqlite", "storage.postgres", "storage.memory")


@pytest.mark.parametrize(
    ("room", "forbidden"),
    [
        # The core may name its service's reasons (errors.py and funnel.runtime.errors are gRPC-free).
        ("completion_service.core", ("completion_service.", "funnel.runtime", *IO)),
        (
            "completion_service.units",
            (*(f"completion_service.{r}" for r in ("api", "clients", "authority", "server", *ADAPTERS)), *IO),
        ),
        (
            "completion_service.storage",
            tuple(f"completion_service.{r}" for r in ("api", "clients", "authority", "units", "server")),
        ),
        ("completion_service.clients", ("completion_service.units", "completion_service.authority")),
        ("completion_service.authority", ("completion_service.api", "completion_service.server")),
        ("lifecycle_service.core", ("lifecycle_service.", "funnel.runtime", *IO)),
        (
            "lifecycle_service.units",
            (*(f"lifecycle_service.{r}" for r in ("api", "authority", "server", *ADAPTERS)), *IO),
        ),
        (
            "lifecycle_service.storage",
            tuple(f"lifecycle_service.{r}" for r in ("api", "authority", "units", "server")),
        ),
        ("lifecycle_service.authority", ("lifecycle_service.api", "lifecycle_service.server")),
    ],
)
def test_each_room_of_a_service_imports_only_rooms_below_it(room, forbidden):
    service = room.split(".")[0]
    allowed = (room, f"{service}.errors", "funnel.runtime.errors")
    bad = sorted(
        (file, name)
        for file, name in imported(room, whole=True)
        if any(name == f or name.startswith(f if f.endswith(".") else f + ".") for f in forbidden)
        and not any(name == a or name.startswith(a + ".") for a in allowed)
    )
    assert bad == []


def test_only_the_server_and_the_clients_reach_the_grpc_face():
    for service, allowed in (
        ("completion_service", {"completion_service/server.py", "completion_service/clients/external_gates.py"}),
        ("lifecycle_service", {"lifecycle_service/server.py"}),
    ):
        reach = {
            file
            for file, name in imported(service, whole=True)
            if name.startswith(f"{service}.api") and not file.startswith(f"{service}/api/")
        }
        assert reach <= allowed, reach - allowed
