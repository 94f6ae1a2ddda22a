"""The systemd units in deploy/ configure the services through environment
variables that exist: each names a flag of the service it starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from completion_service import server as completion_server
from lifecycle_service import server as lifecycle_server

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


@pytest.mark.parametrize(
    "unit, module, prefix",
    [
        ("funnel-lifecycle.service", lifecycle_server, "FUNNEL_LIFECYCLE_"),
        ("funnel-completion.service", completion_server, "FUNNEL_COMPLETION_"),
    ],
)
def test_every_environment_variable_of_a_unit_is_a_flag(unit, module, prefix, capsys):
    names = re.findall(r"^Environment=(\w+)=", (DEPLOY / unit).read_text(), re.M)
    assert names and all(name.startswith(prefix) for name in names)
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    help_text = capsys.readouterr().out
    for name in names:
        flag = "--" + name.removeprefix(prefix).lower().replace("_", "-")
        assert flag in help_text, f"{unit}: {name} is not a flag of the service ({flag})"
