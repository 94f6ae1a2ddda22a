"""Fixtures of the Python client's tests: both services as real processes, the
MCP tests' module-scoped `pair` (each test works on tasks of its own)."""

from tests.mcp.conftest import pair

__all__ = ["pair"]
