"""The deployment's vector columns: the tables whose rows are embedded, the text each row is
embedded from, and the indexes a new dimension makes stale. app/embeddings fixes and fills
the columns it is given (ensure_model, reembed) and knows none of them."""

from app.embeddings.store import VectorColumns, VectorTable
from app.memory import maintenance


def memory_text(summary: str, content: str) -> str:
    """A memory record's embedded text: its summary, then its content when it has any. The one
    definition, used by writes, imports and `engram reembed`."""
    return f"{summary}\n{content}" if content else summary


VECTOR_COLUMNS = VectorColumns(
    tables=(
        VectorTable(
            name="agent_memories",
            key=("account_id", "action_id", "memory_id"),
            key_types=("uuid", "uuid", "uuid"),
            columns=("summary", "content"),
            text=memory_text,
            indexed=False,  # only large agents' own indexes (app/memory/maintenance.py)
        ),
        # Session history (app/history): each part of a kept event, embedded from its own text.
        VectorTable(
            name="history_parts",
            key=("account_id", "action_id", "session_id", "event_id", "part"),
            key_types=("uuid", "uuid", "text", "uuid", "int"),
            columns=("text",),
            text=str,
        ),
    ),
    # Large agents' and sessions' own indexes (app/memory/maintenance.py rebuilds them).
    drop_indexes=maintenance.drop_agent_indexes,
    hold_indexes=maintenance.dropping_agent_indexes,
)
