"""Agent interfaces: executions of kind MCP (one tool call over MCP) and INGEST (a
conversation handed in for review), and records of source MCP.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

The checks are replaced NOT VALID and then validated: validation reads the table without the
ACCESS EXCLUSIVE lock that adding a checked constraint would hold while it scans.
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE executions DROP CONSTRAINT executions_kind_check;
    ALTER TABLE executions ADD CONSTRAINT executions_kind_check
        CHECK (kind IN ('TURN', 'OPERATOR', 'ERASE', 'MCP', 'INGEST')) NOT VALID;
    ALTER TABLE executions VALIDATE CONSTRAINT executions_kind_check;

    ALTER TABLE agent_memories DROP CONSTRAINT agent_memories_source_check;
    ALTER TABLE agent_memories ADD CONSTRAINT agent_memories_source_check
        CHECK (source IN ('EXTRACTION', 'TOOL', 'OPERATOR', 'MCP')) NOT VALID;
    ALTER TABLE agent_memories VALIDATE CONSTRAINT agent_memories_source_check;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
