"""Memory search without the HNSW index shared by every agent: writes touch no global graph.

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
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS agent_memories_embedding")


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
