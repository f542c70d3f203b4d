"""The exact plan reads an agent's rows from a covering index, in agent order, not the table.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03

The exact plan (app/memory/search_store.py `ranked_exact`) scores every row a reader sees: for
a 1,000-record agent, a bitmap heap scan of 1,000 rows scattered over as many pages of the
table, most of the statement's time. `agent_memories_entries` is a btree on `(account_id,
action_id, scope, session_id)` that also holds every column the scan reads (INCLUDE): those
that decide what a reader sees, the record's kind, its embedding and its words. The scan of
an agent's rows is then an index-only scan of its entries, which lie together in the index
however scattered the rows are in the table (bench/README.md, twenty-first session).

A btree entry may not exceed 2,704 bytes, and a record's embedding and words can exceed it
(a 1,536-dimension vector alone is 6 kB; 2,000 characters of prose with a 256-dimension one
about 3 kB). So the index holds only the records whose entry fits: `memory_entry_fits` bounds
the entry's size from above (a tsvector stores per lexeme a 4-byte entry, the lexeme, at most
a byte of padding, a 2-byte count and 2 bytes a position; a vector 8 bytes and 4 a dimension;
the other columns are fixed or counted, and the 2,200 bytes it allows leave 504 for them and
the tuple's headers). `agent_memories_entries_rest` holds the others' keys, and the scan
reads those rows from the table. A NULL embedding counts as not fitting, so every row is in
exactly one of the two indexes.

The function runs for each written row, once per index (about 16 µs for a record of 46 words).
Both indexes are built in the migration's transaction: writes to the table wait for it, reads
go on (under 90 s for bench/search_scale.py's 1,230,000 records with its generous
`maintenance_work_mem`, more with the default). Not concurrently: a concurrent build waits for
every running transaction, among them another process's call waiting for the migration lock,
which this migration holds (tests/test_two_processes.py hung on it).
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    -- Not inlined (a sub-select), so a partial index's predicate and a query's clause match as
    -- written; the high cost keeps the planner from testing it row by row where an index's
    -- predicate answers it.
    CREATE OR REPLACE FUNCTION memory_entry_fits(
        embedding vector, tsv tsvector, session_id text, kind text
    ) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE COST 1000
    RETURN coalesce(
        vector_dims(embedding) <= 512
        AND 4 * vector_dims(embedding) + octet_length(coalesce(session_id, ''))
            + octet_length(kind) + (
                SELECT coalesce(sum(
                    octet_length(u.lexeme) + 8 + 2 * coalesce(cardinality(u.positions), 0)
                ), 0) FROM unnest(tsv) u
            ) <= 2200,
        false
    );
    """)
    # Not CONCURRENTLY: a concurrent build waits for every running transaction, among them
    # another process's call that waits for the migration lock (app/db/migrate.py), held until
    # this migration ends. Writes to the table wait for the build; reads go on.
    op.execute("""
    CREATE INDEX agent_memories_entries
        ON agent_memories (account_id, action_id, scope, session_id)
        INCLUDE (memory_id, created, status, preview, tombstone, pending_execution,
                 pending_invocation, kind, embedding, tsv)
        WHERE memory_entry_fits(embedding, tsv, session_id, kind);
    CREATE INDEX agent_memories_entries_rest
        ON agent_memories (account_id, action_id, scope, session_id)
        WHERE NOT memory_entry_fits(embedding, tsv, session_id, kind);
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
