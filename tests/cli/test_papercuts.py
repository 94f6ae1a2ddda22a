"""Operator papercuts (issue 23, item 7), each as the command a user runs: the
installed `funnel` CLI as a subprocess, against real service processes where a
server is involved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FUNNEL = Path(sys.executable).parent / "funnel"


def funnel(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(FUNNEL), *args], capture_output=True, text=True, timeout=60, **kwargs)


# -- `funnel token issue` never makes a key ------------------------------------


def test_token_issue_without_a_key_refuses_and_names_the_directory_it_looked_in(tmp_path):
    result = funnel("token", "issue", "--workspace", "acme", "--role", "host", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    looked_in = tmp_path / "funnel-data" / "tls"
    assert f"no token signing key in {looked_in}" in result.stderr, result.stderr
    assert "funnel up" in result.stderr
    # Nothing was made: no key pair whose tokens every running service would reject.
    assert not (tmp_path / "funnel-data").exists()

    elsewhere = tmp_path / "elsewhere"
    result = funnel("token", "issue", "--workspace", "acme", "--role", "host", "--data-dir", str(elsewhere))
    assert result.returncode == 1 and str(elsewhere / "tls") in result.stderr
    assert not elsewhere.exists()


def test_pki_init_makes_the_key_that_token_issue_then_signs_with(tmp_path):
    made = funnel("pki", "init", "--data-dir", str(tmp_path / "data"))
    assert made.returncode == 0 and f"made the local PKI and token signing key in {tmp_path / 'data' / 'tls'}" \
        in made.stdout
    key = (tmp_path / "data" / "tls" / "token-signing.key").read_bytes()
    again = funnel("pki", "init", "--data-dir", str(tmp_path / "data"))
    assert again.returncode == 0 and again.stdout.startswith("kept ")
    assert (tmp_path / "data" / "tls" / "token-signing.key").read_bytes() == key
    issued = funnel("token", "issue", "--workspace", "acme", "--role", "host", "--data-dir", str(tmp_path / "data"))
    assert issued.returncode == 0 and issued.stdout.count(".") == 2
