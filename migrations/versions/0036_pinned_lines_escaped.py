"""Pinned lists counted again: a pinned line now escapes its summary's angle brackets, the
characters drawn like them and the line separators as \\uXXXX (app.text.model_json), so that no
tag or chat template role marker (`<|im_start|>`) reaches the agent's instructions from a
record; each such character is six characters of its session's list, not one.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-07

Every session's kept lengths (`pinned_lists`, migration 0030) are counted again as
`store.count_pinned_lists` now counts them: the table emptied and filled from the pinned
session-scope records, read by migration 0030's partial index; pins written meanwhile wait
for it, at most 5 s (lock_timeout, for this transaction), past which it fails and is rolled
back, and runs again at the next start or `engram migrate`. A process of a release before
this one, still running on the migrated database, counts a summary's brackets as one character
each when it pins in a session (a list a few characters shorter than its turns list): upgrade
every such process at once.
"""

from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        r"""
        DELETE FROM pinned_lists;
        -- The lengths as store.count_pinned_lists counts them (app.text.DISGUISING_SQL, then
        -- app.text.UNQUOTED_SQL's characters six each).
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
                SELECT length(to_json(regexp_replace(regexp_replace(m.summary,
                    '[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u200b-\u200f'
                    '\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]', '', 'g'),
                    '[\u2028\u2029\u003c\u003e\u02c2\u02c3\u1433\u1438\u2039\u203a\u2329\u232a'
                    '\u276c-\u2771\u27e8\u27e9\u29fc\u29fd\u3008\u3009\ufe64\ufe65\uff1c\uff1e]',
                    'uXXXX.', 'g'))::text) + 49
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
