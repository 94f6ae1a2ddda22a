"""The README's Python client section, run as written: its program, saved as
`story.py` next to the `funnel-data` of a running `funnel up`, prints what the
README shows."""

from __future__ import annotations

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
    return text[text.index("## Python client") : text.index("## Error reasons")]


def test_the_readme_python_client_story_runs_as_written(tmp_path):
    section = readme_section()
    assert "<!-- python-client:" in section
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    (program,) = [text for language, text in blocks if language == "python"]
    (expected,) = [text for language, text in blocks if language == ""]
    (tmp_path / "story.py").write_text(program, encoding="utf-8")
    with funnel_up(tmp_path) as up:
        # The README's run uses funnel up's default ports; this one the ports of this run.
        env = {**os.environ, "FUNNEL_LIFECYCLE": up.lifecycle, "FUNNEL_COMPLETION": up.completion}
        done = subprocess.run(
            [sys.executable, "story.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
