"""docs/security.md stays true: its authorization table is the enforced one."""

from __future__ import annotations

import pathlib

from funnel.auth.principal import Role
from funnel.auth.table import TABLE

DOC = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
COLUMNS = [Role.VIEWER, Role.AGENT, Role.HOST, Role.OPERATOR, Role.COMPLETION_SERVICE]


def test_the_documented_table_is_the_enforced_table():
    rows = {}
    for line in DOC.splitlines():
        if not line.startswith("| `") or "Service." not in line:
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        service, method = cells[0].strip("`").split(".")
        rows[(service, method)] = {role: cell for role, cell in zip(COLUMNS, cells[1:], strict=False) if cell}
    assert len(rows) == len(TABLE)
    for path, rule in TABLE.items():
        service, method = path.strip("/").split("/")
        documented = rows[(service.rsplit(".", 1)[1], method)]
        assert set(documented) == set(rule.roles), path
        # "own" marks exactly the agent cells limited to runs the agent holds.
        assert (documented.get(Role.AGENT) == "own") == (rule.holder_only and Role.AGENT in rule.roles), path
        assert all(mark in ("✓", "own") for mark in documented.values()), path
