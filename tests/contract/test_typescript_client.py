"""The TypeScript client (clients/typescript): generated from protos/ at build
time (buf + protoc-gen-es, then tsc), then `node --test`:

* offline: the completion identity vectors recomputed with an RFC 8785 library
  from npm, errorDetails() on wire-shaped errors, and the request-id vectors of
  funnel_mcp/idempotency.py (which the Python side checks here too);
* as another project depends on it: `npm pack`, installed into a scratch copy of
  clients/typescript/consumer/ (no EBADENGINE on this Node), compiled there with
  its own TypeScript against the package's types, and the golden story of
  funnel_cli/demo.py run there against both services as real processes (TLS; the
  lifecycle service requires the client certificate).

Needs Node.js 20+ and npm (tests/node_tools.py installs the locked packages; the
scratch project's come from npm's cache, else the registry)."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests import credentials
from tests.contract import request_id_vectors
from tests.node_tools import INSTALL_TIMEOUT, ROOT, ensure_packages, require_node
from tests.reliability.harness import Pair

PACKAGE = ROOT / "clients" / "typescript"
CONSUMER = PACKAGE / "consumer"
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
        *sorted(CONSUMER.glob("*.ts")),
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


@pytest.fixture(scope="module")
def tarball(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`npm pack` of the built package. Its prepack script (the build) is skipped:
    `built` did that, under the lock that keeps parallel workers from rebuilding."""
    _, npm = require_node()
    destination = tmp_path_factory.mktemp("pack")
    with open(PACKAGE / ".build.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_SH)
        result = subprocess.run(
            [npm, "pack", "--ignore-scripts", "--json", "--pack-destination", str(destination)],
            cwd=PACKAGE,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
    assert result.returncode == 0, f"npm pack failed:\n{result.stdout}\n{result.stderr}"
    return destination / json.loads(result.stdout)[0]["filename"]


@pytest.fixture(scope="module")
def consumer(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch copy of clients/typescript/consumer/ with the tarball installed as
    another project installs it, then compiled with its own TypeScript."""
    _, npm = require_node()
    project = tmp_path_factory.mktemp("consumer")
    for source in (*CONSUMER.glob("*.ts"), CONSUMER / "package.json", CONSUMER / "tsconfig.json"):
        shutil.copy(source, project)
    # --prefer-offline: what clients/typescript's own install put in npm's cache serves.
    install = subprocess.run(
        [npm, "install", str(tarball), "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=warn"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
    )
    output = install.stdout + install.stderr
    assert install.returncode == 0, f"npm install of the tarball failed:\n{output}"
    assert "EBADENGINE" not in output, f"a dependency does not support this Node:\n{output}"
    dependency = json.loads((project / "package.json").read_text())["dependencies"]["@funnel/client"]
    assert dependency.startswith("file:") and dependency.endswith(tarball.name), dependency
    compile_ = subprocess.run(
        [str(project / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert compile_.returncode == 0, f"the consumer does not compile against the package:\n{compile_.stdout}"
    return project


async def node_test(files: list[Path], env: dict[str, str], cwd: Path = PACKAGE) -> str:
    """Runs `node --test` on the compiled files; fails the test with node's output
    unless every node test ran and passed."""
    node, _ = require_node()
    process = await asyncio.create_subprocess_exec(
        node,
        "--test",
        "--test-reporter=tap",
        *map(str, files),
        cwd=cwd,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
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


async def test_identity_and_request_id_vectors_and_error_decoding(built: Path) -> None:
    await node_test(
        [built / "identity.test.js", built / "errors.test.js", built / "idempotency.test.js"],
        {"FUNNEL_IDENTITY_VECTORS": str(VECTORS), "FUNNEL_REQUEST_ID_VECTORS": str(request_id_vectors.PATH)},
    )


def test_request_id_vectors_are_what_the_mcp_server_derives() -> None:
    assert request_id_vectors.PATH.read_text(encoding="utf-8") == request_id_vectors.text(), (
        "tests/contract/request_id_vectors.json is stale: .venv/bin/python -m tests.contract.request_id_vectors, "
        "then make clients/typescript/src/idempotency.ts agree"
    )


def test_the_tarball_ships_the_built_code_with_its_types(tarball: Path) -> None:
    with tarfile.open(tarball) as archive:
        names = {name.removeprefix("package/") for name in archive.getnames()}
    manifest = json.loads((PACKAGE / "package.json").read_text())
    for entry in manifest["exports"]["."].values():
        assert entry.removeprefix("./") in names
    for module in (
        "index",
        "session",
        "idempotency",
        "lifecycle",
        "completion",
        "gen/funnel/completion/v1/completion_service_pb",
        "gen/funnel/completion/v1/completion_messages_pb",
        "gen/funnel/completion/v1/types_pb",
        "gen/funnel/completion/v1/enums_pb",
        "gen/funnel/lifecycle/v1/service_pb",
        "gen/funnel/lifecycle/v1/messages_pb",
        "gen/google/rpc/error_details_pb",
        "gen/google/api/field_behavior_pb",
    ):
        assert {f"dist/src/{module}.js", f"dist/src/{module}.d.ts"} <= names, module
    assert not [name for name in names if name.startswith(("dist/test/", "test/", "consumer/", "scripts/"))]
    assert "private" not in manifest


def _floor(engines: dict[str, str], name: str) -> tuple[int, ...]:
    """The Node version an `engines.node` of the form `>=X[.Y[.Z]]` starts at."""
    match = re.fullmatch(r">=\s*(\d+(?:\.\d+){0,2})", engines["node"].strip())
    assert match, f"{name}: engines.node {engines['node']!r} is not a plain lower bound; decide by hand"
    return tuple(int(part) for part in match.group(1).split("."))


def test_engines_are_what_the_dependencies_require() -> None:
    """The package's engines.node is the highest floor among the packages it pulls
    in at run time, and the build's own (dev) packages run on that floor too:
    no EBADENGINE on any Node the package admits."""
    lock = json.loads((PACKAGE / "package-lock.json").read_text())["packages"]
    ours = _floor(lock[""]["engines"], "@funnel/client")
    floors = {path: _floor(p["engines"], path) for path, p in lock.items() if path and "node" in p.get("engines", {})}
    runtime = [floor for path, floor in floors.items() if not lock[path].get("dev")]
    assert runtime and ours == max(runtime)
    for path, floor in floors.items():
        assert floor <= ours, f"{path} needs Node {lock[path]['engines']['node']}"
    assert json.loads((CONSUMER / "package.json").read_text())["engines"] == lock[""]["engines"]


def test_the_package_version_is_the_contracts() -> None:
    """The version of the contract the package speaks: CHANGELOG.md's newest one,
    as a prerelease (`-dev`) until contract/releases/ lists it as released."""
    newest = re.search(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    released = re.findall(r"^\| (\d+\.\d+\.\d+) \|", (ROOT / "contract" / "releases" / "README.md").read_text(), re.M)
    expected = newest if newest in released else f"{newest}-dev"
    assert json.loads((PACKAGE / "package.json").read_text())["version"] == expected


async def test_golden_story_from_the_packed_package(consumer: Path, tmp_path: Path) -> None:
    pair = await Pair(tmp_path / "pair").start()
    try:
        pki = credentials.PKI
        await node_test(
            [consumer / "dist" / "story.test.js"],
            {
                "FUNNEL_LIFECYCLE_ADDRESS": pair.lifecycle.address,
                "FUNNEL_COMPLETION_ADDRESS": pair.completion.address,
                "FUNNEL_CA": str(pki.ca),
                "FUNNEL_CLIENT_CERT": str(pki.cert("client")),
                "FUNNEL_CLIENT_KEY": str(pki.key("client")),
                "FUNNEL_WORKSPACE": WORKSPACE,
                "FUNNEL_HOST_TOKEN": credentials.token("ts-host", [f"{WORKSPACE}:host"]),
                "FUNNEL_AGENT_TOKEN": credentials.token(AGENT, [f"{WORKSPACE}:agent"]),
            },
            cwd=consumer,
        )
    finally:
        await pair.stop()
