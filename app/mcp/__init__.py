"""MCP: an agent's memory tools for agents that run elsewhere (app/mcp/endpoint.py)."""
