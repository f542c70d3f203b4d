"""Memory search without the HNSW index shared by every agent, and records stored by agent.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01

`agent_memories_embedding` served only searches that took the index plan without an agent's
own HNSW index: an agent of more than 10,000 records between growing past that and the next
maintenance round, or beyond `agent_index_max_agents`. Smaller agents are ranked exactly (every
record scored), large ones through their own indexes (app/memory/maintenance.py). Yet every
record written paid for the shared graph: inserting 1,000 records took 532 ms with it, 149 ms
without (bench/ingest.py, bench/README.md), and it found only 0.87-0.92 of a filtered agent's
exact top-10. Without it, an agent searched by the index plan without its own index gets its
meaning candidates by scoring all of its records (exact). `app/embeddings/store.py` no longer
builds it when the embedding model's dimensions are set.

The table is not rewritten here: that holds the table's lock for minutes at a million records,
and an upgrade should not. `engram maintain-search --reorder`, run in a quiet hour, stores each
agent's records together (CLUSTER on the agent's newest-first btree): a search of an agent
without its own indexes reads and scores every one of its records, and in a table written by
many agents at once each record sat on a page of its own. In order, a 1,000-record agent's
rows share 252 pages instead of 984 (120,000 records), and its exact hybrid search took 5.7 ms
p50 instead of 9.6 (bench/README.md).

`agent_indexes.unlisted` (0006) goes too: it kept an agent's indexes for two minutes after the
agent lost them, while processes that remembered the agent as having them might still search
through them (else they would have read the shared index with an own index's settings). Search
now reads `agent_indexes` in the statement that chooses its plan, and remembers nothing, so a
round drops an unlisted agent's indexes at once. Rows of agents unlisted and lingering go
with it; their indexes are dropped by the next round.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    DROP INDEX IF EXISTS agent_memories_embedding;
    DELETE FROM agent_indexes WHERE unlisted IS NOT NULL;
    ALTER TABLE agent_indexes DROP COLUMN unlisted;
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
