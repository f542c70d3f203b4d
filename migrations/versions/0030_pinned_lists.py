"""Each session's pinned list has its length kept, so an agent-scope pin's check reads the
longest ones from an index.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05

An agent-scope pin joins every session's pinned list (M52): its check ranked every session of
the agent by the listed length of its pinned session-scope records, reading all of them (3 ms
at 1,000 sessions, 268 ms at 50,000: bench/README.md, `pins.py`). Now:

- `pinned_lists`: one row per session of an agent with committed pinned session-scope records
  that a turn of the session lists: `live_length` as a live turn lists them, `preview_length`
  as a preview turn does (preview records too, less those a committed preview record
  replaces or deletes), each the sum over the records of their summary's JSON string as
  `for_model` leaves it plus the rest of the line and its line break (`PIN_LINE_EXTRA`, 49).
  A session whose two lengths are 0 has no row. The writes that change them count the
  sessions they touch again, under the row's lock, in the writing transaction
  (app/memory/store.py, `count_pinned_lists`); the check reads the longest by
  `pinned_lists_live` or `pinned_lists_preview`.
- `agent_memories_session_pins`: a partial btree on `(account_id, action_id, session_id)` of
  the active pinned session-scope rows, so that counting a session, and reading the rows of the
  longest lists, reads its pins and no other record of the session.

Filled here from the records as they are. A process of an older release does not keep the
lengths: restart every process with the new release (a session it pins in meanwhile is
counted again at its next pin, unpin or deletion).
"""

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
        CREATE TABLE pinned_lists (
            account_id uuid NOT NULL,
            action_id uuid NOT NULL,
            session_id text NOT NULL,
            live_length integer NOT NULL,
            preview_length integer NOT NULL,
            PRIMARY KEY (account_id, action_id, session_id),
            FOREIGN KEY (account_id, action_id) REFERENCES actions ON DELETE CASCADE
        );
        CREATE INDEX pinned_lists_live ON pinned_lists
            (account_id, action_id, live_length, session_id) WHERE live_length > 0;
        CREATE INDEX pinned_lists_preview ON pinned_lists
            (account_id, action_id, preview_length, session_id) WHERE preview_length > 0;
        CREATE INDEX agent_memories_session_pins ON agent_memories
            (account_id, action_id, session_id)
            WHERE scope = 'SESSION' AND pinned AND status = 'ACTIVE';

        -- The lengths as store.count_pinned_lists counts them (app.text.DISGUISING_SQL).
        INSERT INTO pinned_lists
        SELECT account_id, action_id, session_id, coalesce(live, 0), coalesce(preview, 0) FROM (
            SELECT m.account_id, m.action_id, m.session_id,
                sum(l.listed) FILTER (WHERE NOT m.preview) AS live,
                sum(l.listed) FILTER (WHERE NOT EXISTS (
                    SELECT 1 FROM agent_memories r
                    WHERE r.account_id = m.account_id AND r.action_id = m.action_id
                      AND r.replaces = m.memory_id AND r.pending_execution IS NULL
                      AND r.preview)) AS preview
            FROM agent_memories m CROSS JOIN LATERAL (
                SELECT length(to_json(regexp_replace(m.summary,
                    '[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u200b-\u200f'
                    '\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]', '', 'g'))::text) + 49
                    AS listed
            ) l
            WHERE m.scope = 'SESSION' AND m.pinned AND m.status = 'ACTIVE'
              AND m.pending_execution IS NULL AND m.session_id IS NOT NULL
            GROUP BY m.account_id, m.action_id, m.session_id
        ) counted
        WHERE live > 0 OR preview > 0;
        """
    )


def downgrade() -> None:
    raise NotImplementedError("Engram migrations are forward-only")
