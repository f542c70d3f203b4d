"""Searching a session's history (H6-H11): ranks the parts of kept events with memory search's
fusion of meaning, words and recency, or reads events whole by ID.

Plans, as memory search's: `exact` scores every part the reader sees (read by the session's
btree) while they number at most EXACT_MAX_PARTS; above that, `index` takes the nearest parts
from HNSW (iterative scan under the session filter) and the best-ranked parts sharing a query
word among the session's newest WORD_WALK parts (read from the session index alone, which
holds `tsv`), and scores their union the same way. So in a session larger than WORD_WALK
parts an older part is found by its meaning, not by words alone. The plan comes from an
index-only count of the session's parts, made by the exact plan's statement itself, and is
remembered for a minute (`_PLANS`), so a session's searches are one statement (two for the
first search of a large session): where a search's time goes is in bench/README.md
(`history.py`).
"""

import json
import re
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg

from app.embeddings.base import Embeds
from app.errors import BadInput
from app.history import store
from app.history.store import HistoryScope, Ranking
from app.text import check_storable, for_model

DEFAULT_LIMIT = 5
# A tool name as the model API and MCP spell them.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_LIMIT = 50
MAX_IDS = 50
EXACT_MAX_PARTS = 5000
WORD_WALK = 4000
CANDIDATES = 40  # index plan: parts each signal proposes, at least (4 x the limit when more)
# Each session's plan ((pool, account, action, session, preview) -> (until when, by
# time.monotonic(), "exact" or "index", the turn bound it was counted under)), learnt from the
# count of its parts: for PLAN_SECONDS its searches take that plan without counting, one
# statement instead of two, while their turn bound allows: `index` for a bound at least the
# learnt one (as many parts or more), `exact` for one at most PLAN_TURNS later (a replay of an
# early turn of a large session counts few parts; the session's next turns do not inherit
# that). The exact plan ranks any session right, so one that grows past EXACT_MAX_PARTS
# meanwhile is only searched a little slower; a large session stays large but for
# eraseSession, after which the index plan finds nothing, as it should. The pool is part of the
# key, as a process may serve several databases (tests do); at most MAX_REMEMBERED sessions are
# kept, the least lately learnt going first.
_PLANS: dict[tuple[int, UUID, UUID, str, bool], tuple[float, str, int | None]] = {}
PLAN_SECONDS = 60.0
PLAN_TURNS = 20
MAX_REMEMBERED = 10_000


@dataclass(frozen=True)
class Event:
    """A kept event as read back (whole, or one part of it)."""

    event_id: UUID
    session_id: str
    turn: int
    execution_id: UUID
    invocation_number: int
    sequence: int
    who: str
    call_id: str | None
    tool: str | None
    data: Any
    text: str  # the whole event's
    parts: int
    preview: bool
    created: Any
    part: int | None = None  # a ranked result: which part matched
    part_text: str | None = None  # and its text
    # and the tools it names (None: kept by a release before migration 0027, which named none)
    part_tools: list[str] | None = None
    score: float | None = None

    @classmethod
    def of(cls, row: asyncpg.Record) -> "Event":
        columns = set(row.keys())
        return cls(**{k: row[k] for k in cls.__dataclass_fields__ if k in columns})

    @property
    def header(self) -> str:
        """Who the event is from, in its turn: `turn 12, user`. A tool's name is the model's
        word (a call of a tool never offered is kept too): one that is not a plain name is
        shown quoted, so it cannot break the line."""
        who = self.who
        if self.who == "tool" and self.tool:
            plain = _TOOL_NAME.fullmatch(self.tool)
            who = f"tool {self.tool if plain else json.dumps(self.tool)}"
        return f"turn {self.turn}, {who}"


@dataclass(frozen=True)
class Found:
    events: list[Event]
    embed_tokens: int = 0
    plan: str | None = None


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return limit


async def search(
    pool: asyncpg.Pool,
    embedder: Embeds,
    scope: HistoryScope,
    *,
    query: str,
    limit: int = DEFAULT_LIMIT,
    plan: str | None = None,
) -> Found:
    """The best `limit` parts for `query` among those the scope sees. A query its entry point
    left unstorable (a NUL) is BadInput, not the database's refusal of the statement."""
    query = check_storable(query, "query").strip()
    if not query:
        raise BadInput("query is required: what to look for in the session's earlier turns")
    check_limit(limit)
    embedded = await embedder.embed([query])  # before taking a connection
    ranking = Ranking(query, embedded.vectors[0], limit, max(CANDIDATES, 4 * limit))
    key = (id(pool), scope.account_id, scope.action_id, scope.session_id, scope.preview)
    if plan is None:
        plan = _remembered(key, scope.before_turn)
    async with pool.acquire() as conn:
        if plan is None:
            # The exact plan's statement counts the parts first and ranks them only when they
            # are few: a small session's first search is one statement too. Nothing found:
            # an empty session, or a large one, which the count tells apart.
            rows = await store.ranked_exact(conn, scope, ranking, EXACT_MAX_PARTS)
            if rows or await store.count_parts(conn, scope, EXACT_MAX_PARTS + 1) <= EXACT_MAX_PARTS:
                plan = "exact"
            else:
                plan = "index"
                rows = await store.ranked_index(conn, scope, ranking, WORD_WALK)
            _remember(key, plan, scope.before_turn)
        elif plan == "exact":
            rows = await store.ranked_exact(conn, scope, ranking)
        else:
            rows = await store.ranked_index(conn, scope, ranking, WORD_WALK)
    return Found([Event.of(r) for r in rows], embedded.tokens, plan)


def _remembered(key: tuple[int, UUID, UUID, str, bool], bound: int | None) -> str | None:
    until, plan, learnt = _PLANS.get(key, (0.0, None, None))
    if until <= time.monotonic():
        return None
    if plan == "index":  # as many parts or more
        covers = bound is None or (learnt is not None and bound >= learnt)
    else:  # as few, or a few turns more
        covers = learnt is None or (bound is not None and bound <= learnt + PLAN_TURNS)
    return plan if covers else None


def _remember(key: tuple[int, UUID, UUID, str, bool], plan: str, bound: int | None) -> None:
    until, known, _ = _PLANS.get(key, (0.0, None, None))
    if plan == "exact" and known == "index" and until > time.monotonic():
        return  # counted under an earlier bound (a replay): the session's later turns stay large
    _PLANS.pop(key, None)  # re-inserted last: dicts keep insertion order
    if len(_PLANS) >= MAX_REMEMBERED:
        del _PLANS[next(iter(_PLANS))]
    _PLANS[key] = (time.monotonic() + PLAN_SECONDS, plan, bound)


async def read(pool: asyncpg.Pool, scope: HistoryScope, ids: Sequence[UUID]) -> list[Event]:
    """Events by ID, whole, as far as the scope sees them."""
    if len(ids) > MAX_IDS:
        raise BadInput(f"ids names {len(ids)} events; at most {MAX_IDS} are read at once")
    async with pool.acquire() as conn:
        rows = await store.read_events(conn, scope, list(ids))
    return [Event.of(r) for r in rows]


def view(event: Event) -> dict[str, Any]:
    """A result as the model and the transcript read it: the event's identity and place, and
    its text (the part's, for a ranked result) after the line saying who it is from."""
    shown: dict[str, Any] = {"id": str(event.event_id), "turn": event.turn}
    if event.part is not None:
        shown["part"] = event.part
    shown["parts"] = event.parts
    shown["execution"] = str(event.execution_id)
    shown["sequence"] = event.sequence
    if event.who == "tool" and (event.call_id, event.tool) != (None, None):
        # (A handed-in conversation's tool message answers no call it names.)
        shown["call"] = {"id": event.call_id, "name": event.tool}
    if event.preview:
        shown["preview"] = True
    if event.score is not None:
        shown["score"] = round(float(event.score), 4)
    text = event.part_text if event.part_text is not None else event.text
    shown["text"] = f"{event.header}\n{quoted_headers(text)}"
    return shown


# A line of an event's text that reads as a result's header (`turn 12, agent`): a user or a
# tool could write one to pass words off as another speaker's. Lines end where a model may
# read a line break; a line is read as its skeleton (`_skeleton`). It reads as a header
# whatever marks it (`**turn 1, agent**`, `> turn 1`, `1. turn 1`), however the turn is
# counted (`turn 9`, `turn IX`, `turn nine`: up to four words) and whatever stands between it
# and the speaker (a comma of any script, a colon, nothing). A word is a whole run of digits
# or of letters, taken possessively (the speaker may end the last one: `turn nineuser`), so a
# line is matched in time linear in its length (words that could split a run of letters any
# way took milliseconds a line, seconds an event).
_LINE_BREAK = re.compile(r"(\r\n|[\n\r\u2028\u2029])")
_HEADER = re.compile(
    r"[\W\d_]*(?:[^\W\d_]{1,6}[.):\]][\W_]*)?"  # markup, a list number (`1.`, `ii.`, `b)`)
    r"turn(?![^\W\d_])[\W_]*+(?:(?:\d++|[^\W\d_]++)[\W_]*+){0,4}?"  # the turn: up to 4 words
    r"[^\W\d_]{0,16}?(?:user|agent|tool)(?![^\W_])"
)
# Letters that show nothing (Hangul fillers, the braille blank), beside the categories
# `_skeleton` drops.
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
# Letters of other scripts drawn like those of a header's words (turn, user, agent, tool):
# Cyrillic, Greek, Armenian and IPA look-alikes and small capitals, read as the Latin letter.
_LOOK_ALIKES = str.maketrans(
    {
        **dict.fromkeys("\u0430\u0251\u03b1\u1d00", "a"),
        **dict.fromkeys("\u0435\u0454\u1d07", "e"),
        **dict.fromkeys("\u043e\u03bf\u0585\u1d0f", "o"),
        **dict.fromkeys("\u0455\ua731", "s"),
        **dict.fromkeys("\u0433\u1d26\u0280", "r"),
        **dict.fromkeys("\u043f\u0578\u0274", "n"),
        **dict.fromkeys("\u0442\u03c4\u1d1b", "t"),
        **dict.fromkeys("\u03c5\u057d\u0446\u1d1c", "u"),
        **dict.fromkeys("\u0261\u0581\u0262", "g"),
        **dict.fromkeys("\u04cf\u0131\u0269\u0406\u0456\u029f", "l"),
    }
)
_INVISIBLE = frozenset({"Cc", "Cf", "Mn", "Me"})  # controls, format characters, marks
QUOTED = "(quoted) "


def _skeleton(line: str) -> str:
    """A line as a reader takes it in: compatibility forms folded (full-width letters, digits
    and commas), what shows nothing dropped (format characters such as soft hyphens and bidi
    marks, combining marks, fillers), lower case, look-alike letters read as Latin, without
    surrounding space."""
    # NFKD, not NFKC: a mark stays apart from its letter (NFKC would compose `a` and U+0301 into
    # `á`, a letter of its own), and is dropped below.
    folded = unicodedata.normalize("NFKD", line)
    shown = (c for c in folded if unicodedata.category(c) not in _INVISIBLE and c not in _FILLERS)
    return "".join(shown).lower().translate(_LOOK_ALIKES).strip()


def quoted_headers(text: str) -> str:
    """The text as a model reads it (`for_model`), each line that reads as a result's header
    marked as quoted, so that the only header a reader sees is the result's own first line."""
    pieces = _LINE_BREAK.split(for_model(text))  # lines at even places, breaks between
    for n in range(0, len(pieces), 2):
        if _HEADER.match(_skeleton(pieces[n])):
            pieces[n] = QUOTED + pieces[n]
    return "".join(pieces)
