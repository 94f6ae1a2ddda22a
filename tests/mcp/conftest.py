"""Fixtures of the MCP tests: both services as real processes, shared by the
tests of a module (each test works on tasks of its own)."""

from __future__ import annotations

import pytest_asyncio

from tests.reliability.harness import Pair


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(tmp_path_factory):
    started = await Pair(tmp_path_factory.mktemp("services")).start()
    try:
        yield started
    finally:
        await started.stop()
