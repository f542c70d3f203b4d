"""Which sessions recall a record: one enum for records and the API (upper case, as stored)
and for the harness, whose JSON names scopes in lower case (`harness.memory.scope`); and what
names a session."""

from enum import StrEnum

from app.errors import BadInput
from app.text import check_one_line

MAX_SESSION_ID = 200


class Scope(StrEnum):
    SESSION = "SESSION"
    AGENT = "AGENT"

    @property
    def word(self) -> str:
        """As `harness.memory.scope` names it."""
        return self.value.lower()

    @classmethod
    def from_word(cls, word: str) -> "Scope":
        """The scope `harness.memory.scope` names with `word` ("session" or "agent")."""
        return cls[word.upper()]

    @classmethod
    def named(cls, name: str) -> "Scope | None":
        """The scope a harness word or an API value names, whatever its case."""
        return cls.__members__.get(name.upper()) if isinstance(name, str) else None


def check_session_id(
    session_id: str | None, field: str = "sessionId", *, stored: bool = False
) -> None:
    """A session ID, from a turn, an MCP request or an operator's write: 1 to 200 characters,
    not all white space, one line (None: no session). `field`: how the caller named it.
    `stored`: the ID of a session that may be stored already, which a listing looks up or an
    import restores (check_one_line's `stored`); a turn or a write in it names it new."""
    if session_id is not None and (not session_id.strip() or len(session_id) > MAX_SESSION_ID):
        raise BadInput(f"{field} must be 1 to {MAX_SESSION_ID} characters, not blank")
    if session_id is not None:
        check_one_line(session_id, field, stored=stored)


def as_harness(scopes: "tuple[Scope, ...]") -> str:
    """Scopes as `harness.memory.scope` writes them, e.g. ["session", "agent"]."""
    return "[" + ", ".join(f'"{s.word}"' for s in scopes) + "]"


def listed(scopes: "tuple[Scope, ...]") -> str:
    """Scopes as a model or a client writes them, e.g. "SESSION, AGENT"."""
    return ", ".join(scopes)
