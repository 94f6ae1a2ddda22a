"""`funnel mcp`: the agent's own door. An MCP server (official `mcp` SDK) whose
tools are plain calls to the two gRPC services; it holds no database and decides
nothing itself. See docs/mcp.md."""
