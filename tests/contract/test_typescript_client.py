"""The TypeScript client (clients/typescript): generated from protos/ at build
time (buf + protoc-gen-es, then tsc), then `node --test`:

* offline: the completion identity vectors recomputed with an RFC 8785 library
  from npm, and errorDetails() on wire-shaped errors;
* against both services as real processes (TLS; the lifecycle service requires
  the client certificate): the golden story of funnel_cli/demo.py and errors
  decoded with errorDetails().

Needs Node.js 20+ and npm (tests/node_tools.py installs the locked packages)."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import credentials
from tests.node_tools import ROOT, ensure_packages, require_node
from tests.reliability.harness import Pair

PACKAGE = ROOT / "clients" / "typescript"
VECTORS = ROOT / "protos" / "funnel" / "completion" / "v1" / "identity_vectors.json"
WORKSPACE = "ts"
AGENT = "ts-agent"
BUILD_TIMEOUT = 300
NODE_TIMEOUT = 180


def _inputs_digest() -> str:
    """A digest of what the build reads: a change to any of it rebuilds."""
    inputs = [
        *(PACKAGE / name for name in ("package-lock.json", "buf.gen.yaml", "tsconfig.json", "scripts/generate.mjs")),
        *(p for p in sorted((PACKAGE / "src").rglob("*.ts")) if not p.is_relative_to(PACKAGE / "src" / "gen")),
        *sorted((PACKAGE / "test").rglob("*.ts")),
        *sorted((ROOT / "protos").rglob("*.proto")),
        *sorted((ROOT / "third_party" / "googleapis").rglob("*.proto")),
    ]
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@pytest.fixture(scope="module")
def built() -> Path:
    """Installs the locked npm packages, generates src/gen/ from protos/ and
    compiles to dist/, unless dist/ was built from the same inputs already (so
    that parallel workers never rewrite files a running test reads)."""
    _, npm = require_node()
    stamp = PACKAGE / "dist" / ".inputs-sha256"
    with open(PACKAGE / ".build.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        ensure_packages(PACKAGE)
        wanted = _inputs_digest()
        if not (stamp.exists() and stamp.read_text() == wanted):
            result = subprocess.run(
                [npm, "run", "build", "--silent"], cwd=PACKAGE, capture_output=True, text=True, timeout=BUILD_TIMEOUT
            )
            assert result.returncode == 0, f"npm run build failed:\n{result.stdout}\n{result.stderr}"
            stamp.write_text(wanted)
    return PACKAGE / "dist" / "test"


async def node_test(files: list[Path], env: dict[str, str]) -> str:
    """Runs `node --test` on the compiled files; fails the test with node's output
    unless every node test ran and passed."""
    node, _ = require_node()
    process = await asyncio.create_subprocess_exec(
        node, "--test", "--test-reporter=tap", *map(str, files),
        cwd=PACKAGE, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(), NODE_TIMEOUT)
    except TimeoutError:
        process.kill()
        stdout, _ = await process.communicate()
        pytest.fail(f"node --test did not finish within {NODE_TIMEOUT}s:\n{stdout.decode(errors='replace')}")
    output = stdout.decode(errors="replace")
    print(output)  # shown with -s, or by pytest when a later check fails
    assert process.returncode == 0, f"node --test exited with {process.returncode}:\n{output}"
    assert "# SKIP" not in output and re.search(r"^# pass [1-9]", output, re.M), (
        f"node ran nothing or skipped:\n{output}"
    )
    return output


async def test_identity_vectors_and_error_decoding(built: Path) -> None:
    await node_test([built / "identity.test.js", built / "errors.test.js"], {"FUNNEL_IDENTITY_VECTORS": str(VECTORS)})


async def test_golden_story_against_real_services(built: Path, tmp_path: Path) -> None:
    pair = await Pair(tmp_path / "pair").start()
    try:
        pki = credentials.PKI
        await node_test(
            [built / "story.test.js"],
            {
                "FUNNEL_LIFECYCLE_ADDRESS": pair.lifecycle.address,
                "FUNNEL_COMPLETION_ADDRESS": pair.completion.address,
                "FUNNEL_CA": str(pki.ca),
                "FUNNEL_CLIENT_CERT": str(pki.cert("client")),
                "FUNNEL_CLIENT_KEY": str(pki.key("client")),
                "FUNNEL_WORKSPACE": WORKSPACE,
                "FUNNEL_HOST_TOKEN": credentials.token("ts-host", [f"{WORKSPACE}:host"]),
                "FUNNEL_AGENT_TOKEN": credentials.token(AGENT, [f"{WORKSPACE}:agent"]),
                "FUNNEL_IDENTITY_VECTORS": str(VECTORS),
            },
        )
    finally:
        await pair.stop()
