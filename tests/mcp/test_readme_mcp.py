"""The README's MCP section, run as written: against `funnel up`, its shell lines
register a task and issue the agent's token, its configuration snippet (with the
placeholders filled: paths, token, the ports of this run) starts `funnel mcp` the
way a host does, and examples/mcp_seed_loop.py walks seed 001's manual loop."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.funnel_up import funnel_up

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Agents: the MCP tools") : text.index("## Calling the services from any language")]


def blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def test_the_readme_mcp_configuration_works_as_written(tmp_path):
    section = readme_section()
    (shell,) = blocks(section, "sh")
    (config,) = blocks(section, "json")
    assert "<!-- mcp-config:" in section
    with funnel_up(tmp_path) as up:
        script = shell.replace(".venv/bin/", f"{BIN}/").replace("examples/", f"{ROOT}/examples/")
        env = {**os.environ, "FUNNEL_LIFECYCLE": up.lifecycle}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        registered, agent_token = done.stdout.strip().splitlines()
        assert registered.startswith("registered fix-login")
        filled = (
            config.replace("/path/to/funnel/.venv/bin/funnel", str(BIN / "funnel"))
            .replace("/path/to/funnel/funnel-data", str(tmp_path / "funnel-data"))
            .replace("<the agent's token>", agent_token)
            .replace("127.0.0.1:50051", up.lifecycle)
            .replace("127.0.0.1:50052", up.completion)
        )
        (tmp_path / "mcp.json").write_text(filled, encoding="utf-8")
        assert json.loads(filled)["mcpServers"]["funnel"]["args"][0] == "mcp"
        loop = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "mcp_seed_loop.py"), "mcp.json", "fix-login"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert loop.returncode == 0, loop.stderr
    claimed, closed, again = loop.stdout.strip().splitlines()
    assert re.match(r"claim_task    -> run run_\w+, generation 1, lease epoch 1 until \S+Z$", claimed)
    assert re.match(r"complete_task -> run run_\w+ finished at \S+Z, final status in_progress, tokens 0$", closed)
    assert "RUN_ALREADY_FINISHED (FAILED_PRECONDITION)" in again
