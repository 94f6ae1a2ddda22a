"""The README's client example (examples/register_task.py), run as the README says:
against `funnel up`, with a token from `funnel token issue`, twice (the retry with
the same request id answers the same)."""

import os
import subprocess
import sys
from pathlib import Path

from tests.funnel_up import funnel_up

BIN = Path(sys.executable).parent
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "register_task.py"


def test_the_readme_client_example_registers_and_reads_a_task(tmp_path):
    data = tmp_path / "funnel-data"
    with funnel_up(tmp_path, "--data-dir", str(data)) as up:
        token = subprocess.run(
            [str(BIN / "funnel"), "token", "issue", "--workspace", "acme", "--role", "host", "--data-dir", str(data)],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        env = {**os.environ, "FUNNEL_TOKEN": token, "FUNNEL_LIFECYCLE": up.lifecycle, "FUNNEL_DATA_DIR": str(data)}
        runs = [
            subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=60)
            for _ in range(2)
        ]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "registered fix-login (revision 1): generation 1, GENERATION_STATE_REGISTERED"
