"""The README's Python client section, run as written: its program, saved as
`story.py` next to the `funnel-data` of a running `funnel up`, prints what the
README shows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.reliability.harness import unused_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Python client"):text.index("## Error reasons")]


def test_the_readme_python_client_story_runs_as_written(tmp_path):
    section = readme_section()
    assert "<!-- python-client:" in section
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    (program,) = [text for language, text in blocks if language == "python"]
    (expected,) = [text for language, text in blocks if language == ""]
    (tmp_path / "story.py").write_text(program, encoding="utf-8")
    lifecycle, completion = unused_port(), unused_port()
    up = subprocess.Popen(
        [str(BIN / "funnel"), "up", "--lifecycle-port", str(lifecycle), "--completion-port", str(completion),
         "--lifecycle-metrics-port", "0", "--completion-metrics-port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, "funnel up exited before serving"
            if "both SERVING" in line:
                break
        # The README's run uses funnel up's default ports; this one the ports of this run.
        env = {**os.environ, "FUNNEL_LIFECYCLE": f"127.0.0.1:{lifecycle}",
               "FUNNEL_COMPLETION": f"127.0.0.1:{completion}"}
        done = subprocess.run([sys.executable, "story.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
