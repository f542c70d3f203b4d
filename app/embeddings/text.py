"""The text a record is embedded from: one definition, used by writes and by `engram reembed`."""


def memory_text(summary: str, content: str) -> str:
    """A memory record's embedded text: its summary, then its content when it has any."""
    return f"{summary}\n{content}" if content else summary
