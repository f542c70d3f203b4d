"""Executions and sessions as records: what a turn and an operator write both create.

Below app/memory and app/runtime, which both write here; it imports neither."""
