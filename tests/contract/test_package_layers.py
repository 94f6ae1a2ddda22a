"""The packages import one way: the CLI starts the MCP server and the dashboard,
so no product package imports `funnel_cli` (the connection code they share lives
in funnel.client), and the services import none of the commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("funnel_cli", "funnel_mcp", "funnel_ui", "funnel_sim")


def imported(package: str) -> set[tuple[str, str]]:
    """(file, imported top-level package) for every import under `package`."""
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found |= {(str(path.relative_to(ROOT)), name.split(".")[0]) for name in names}
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
