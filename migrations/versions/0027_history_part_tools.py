"""A session history part names the tools its event is of or calls, so a search can leave
memory tools' events out without reading each event.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04

A reader without the memory read grants searches a session's history without the events that
hold memory record text: a memory tool's result, and an agent message that called one
(`history.store.HistoryScope.hidden_tools`, spec M55). The search tested each candidate part against
its event row (an EXISTS reading `history_events` and its `toolCalls` JSON): in a
100,000-event session's index plan the HNSW walk tested every part it met, and a search took
214 ms at p50 against 9.9 without the condition (bench/README.md, thirty-second session).

`history_parts.tools` holds those names (a tool result's tool, the tools an agent message
called; empty for the rest), written with the part, so the condition is a test of the part's
own row. The session btree, which the exact plan and the words walk read index-only, includes
it, and is rebuilt for that (turn commits of the session wait meanwhile: seconds at a million
parts).

The column is added with the default `'{}'`, which every part kept before takes without a
rewrite of the table (the HNSW and GIN indexes are not touched), and the parts of events that
name tools are then updated. The default is then dropped: a process of the release before,
still running during a rolling upgrade, keeps parts without naming `tools`, so they hold NULL,
and for those the search reads the event as before (`history.store._hidden`).
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE history_parts ADD COLUMN tools text[] DEFAULT '{}';
    ALTER TABLE history_parts ALTER COLUMN tools DROP DEFAULT;

    UPDATE history_parts h SET tools = t.tools
    FROM (
        SELECT e.account_id, e.action_id, e.session_id, e.event_id,
               CASE WHEN e.who = 'tool' THEN ARRAY[e.tool]
                    ELSE ARRAY(SELECT c->>'name' FROM jsonb_array_elements(e.data->'toolCalls') c
                               WHERE c->>'name' IS NOT NULL) END AS tools
        FROM history_events e
        WHERE e.who = 'tool' AND e.tool IS NOT NULL
           OR e.who = 'agent' AND jsonb_typeof(e.data->'toolCalls') = 'array'
    ) t
    WHERE h.account_id = t.account_id AND h.action_id = t.action_id
      AND h.session_id = t.session_id AND h.event_id = t.event_id AND cardinality(t.tools) > 0;

    DROP INDEX history_parts_session;
    CREATE INDEX history_parts_session ON history_parts
        (account_id, action_id, session_id, turn DESC)
        INCLUDE (preview, event_id, part, tsv, tools);
    """)


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
