"""Executions and sessions as records: what a turn, an MCP tool call, an ingest, an operator
write and an erasure each create.

Below app/memory and app/runtime, which both write here; it imports neither."""
