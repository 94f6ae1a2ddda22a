"""The README stays true: its reason tables list every reason of both catalogues."""

import pathlib
import re

import pytest

from completion_service import errors as completion_errors
from lifecycle_service import errors as lifecycle_errors

README = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _table_after(heading: str) -> dict[str, set[str]]:
    section = README.split(heading, 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = set(re.findall(r"`([A-Z_]+)`", cells[1]))
    return rows


@pytest.mark.parametrize(
    "heading, module", [("`lifecycle_service`:", lifecycle_errors), ("`completion_service`:", completion_errors)]
)
def test_readme_lists_every_reason_under_its_code(heading, module):
    table = _table_after(heading)
    listed = {(code, reason) for code, reasons in table.items() for reason in reasons}
    catalogue = {(reason.value.code.name, reason.name) for reason in module.Reason}
    assert listed == catalogue


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", quick_start, re.S)
    assert len(commands) == 2
    ci = (pathlib.Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    steps = [line for line in ci.splitlines()[1:] if line and not line.startswith("#")]
    assert steps == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', commands[1]]
