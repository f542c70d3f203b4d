"""Text safety, in one place: what may be stored, what reaches a model, how long a search
query may be (`check_query`), and what a time in text is (`rfc3339`).

Three doors, three rules:
- text a client sends (GraphQL arguments, policies, session IDs) is refused when PostgreSQL
  cannot store it (`check_storable`: a NUL or a lone surrogate is BAD_REQUEST, naming the field);
- text a model or a tool produces is never refused, it is made storable (`storable`: NUL
  becomes U+FFFD, a lone surrogate U+FFFD), so a reply cannot crash the turn that received it;
- text handed to a model as data (pins, recalled records, tool results) loses the characters
  that can disguise it (`for_model`: C0/C1 controls other than tab and newline, and the
  bidirectional overrides and isolates), so a record cannot pose as the instructions around it.
"""

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from app.errors import BadInput

REPLACEMENT = "\ufffd"
# Text counted in tokens where no tokenizer says: about four characters a token (the spec's
# count for pins; the context budget's, and an embedding server's that reports no usage).
CHARS_PER_TOKEN = 4
# Counts (of tokens a model reports used) are below this: the largest integer a float holds
# exactly, as a Prometheus counter and JSON readers keep numbers; a larger one is no count.
MAX_COUNT = 2**53

# NUL: PostgreSQL text cannot hold it. Lone surrogates: not encodable as UTF-8.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# C0 and C1 controls except tab, newline and carriage return; DEL; bidi embeddings, overrides,
# isolates and marks; the zero-width characters that hide text from a human reader; and the tag
# characters (U+E0000-U+E007F), which show as nothing but spell ASCII that a model may read as
# text: instructions hidden from whoever reads the record ("ASCII smuggling").
_DISGUISING = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
    "\U000e0000-\U000e007f]"
)


def _sql_class(pattern: re.Pattern[str]) -> str:
    """A character class as a PostgreSQL regular expression, each character written as its
    \\uXXXX (or, past U+FFFF, \\UXXXXXXXX) escape."""
    return "".join(
        c if c in "[-]" else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
        for c in pattern.pattern
    )


# The same characters in SQL that measures text as `for_model` leaves it (the pinned lists,
# app/memory/store.py).
DISGUISING_SQL = _sql_class(_DISGUISING)


def is_storable(text: str) -> bool:
    return _UNSTORABLE.search(text) is None


def storable(text: str) -> str:
    """Text produced by a model or a tool, made safe to store: never raises."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def _map_strings(value: Any, clean: Callable[[str], str]) -> Any:
    """`clean` applied to every string (keys included) of a JSON-shaped value."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(str(k)): _map_strings(v, clean) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, clean) for v in value]
    return value


def storable_json(value: Any) -> Any:
    """`storable` applied to every string (keys included) of a JSON-shaped value."""
    return _map_strings(value, storable)


def check_storable(text: str, field: str) -> str:
    """Text a client sent: refused with BAD_REQUEST naming the field when it cannot be stored."""
    match = _UNSTORABLE.search(text)
    if match is not None:
        what = "a NUL character" if match.group() == "\x00" else "a lone UTF-16 surrogate"
        raise BadInput(
            f"{field} contains {what} at position {match.start()}; remove it (text must be "
            "valid Unicode without NUL)"
        )
    return text


def check_json(value: Any, where: str, max_depth: int | None = None, root: str = "") -> None:
    """BadInput when decoded JSON nests deeper than `max_depth`, carries a string (a key
    included) that cannot be stored, or a number that is not finite (PostgreSQL's JSON has no
    NaN or Infinity); walked without recursion, whatever its depth. `where` names the value in
    messages, `root` is the path its parts are named under."""
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if max_depth is not None and depth > max_depth:
            raise BadInput(
                f"{where} nests deeper than {max_depth} levels (at {path}); send flatter JSON"
            )
        if isinstance(item, str):
            check_storable(item, path or where)
        elif isinstance(item, float) and not math.isfinite(item):
            raise BadInput(f"{path or where} is {item}: numbers must be finite")
        elif isinstance(item, dict):
            for key, inner in item.items():
                check_storable(str(key), f"a key in {path or where}")
                stack.append((inner, f"{path}.{key}" if path else str(key), depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend(
                (inner, f"{path or where}[{i}]", depth + 1) for i, inner in enumerate(item)
            )


def nests_deeper(value: Any, levels: int) -> bool:
    """Whether decoded JSON nests deeper than `levels` (a scalar: 0, `[1]`: 1); walked without
    recursion, so before anything that recurses over it (json.dumps, repr, `storable_json`)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= levels:
                return True
            inner = item.values() if isinstance(item, dict) else item
            stack.extend((each, depth + 1) for each in inner)
    return False


# What a name or an ID, shown on one line, may not hold: controls (line breaks included), the
# line and paragraph separators, bidi embeddings, overrides and isolates, the zero-width space
# and the BOM.
_NOT_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u200b\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")
# Nor, when it is new, what shows as nothing and has no part in writing a name: Unicode's
# default-ignorable code points (the bidi marks U+200E, U+200F and U+061C, the soft hyphen, the
# word joiner and invisible operators, the combining grapheme joiner, the Hangul fillers, the
# Mongolian vowel separator, deprecated and unassigned format characters, tags), and the
# interlinear annotation characters that hide the text between them. Kept, as scripts and
# emoji need them: the joiners U+200C and U+200D, variation selectors (U+180B-U+180D, U+180F,
# U+FE00-U+FE0F, U+E0100-U+E01EF), tags inside an emoji flag's tag sequence (England's
# 🏴 U+1F3F4, tag letters, U+E007F), outside which tags are ASCII text a reader cannot see, and
# the Mongolian vowel separator between Mongolian letters (before a final a or e, where
# traditional Mongolian writes it), outside which it is a gap nobody sees.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200e\u200f\u2060-\u2065"
    "\u206a-\u206f\u3164\uffa0\ufff0-\ufffb\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e00ff\U000e01f0-\U000e0fff]"
)
_EMOJI_TAGS = re.compile("\U0001f3f4[\U000e0030-\U000e0039\U000e0061-\U000e007a]+\U000e007f")


def _separates_mongolian(text: str, at: int) -> bool:
    """The Mongolian vowel separator at `at` follows a Mongolian letter (U+1820-U+1878, with
    any free variation selectors after it) and comes before the letter a or e."""
    before = text[:at].rstrip("\u180b\u180c\u180d\u180f")
    after = text[at + 1 : at + 2]
    return bool(before) and "\u1820" <= before[-1] <= "\u1878" and after in ("\u1820", "\u1821")


def _flags(text: str) -> list[tuple[int, int]]:
    """Where `text`'s emoji flags' tag sequences are (`_EMOJI_TAGS`)."""
    return [m.span() for m in _EMOJI_TAGS.finditer(text)] if "\U0001f3f4" in text else []


def _kept(text: str, at: int, flags: list[tuple[int, int]]) -> bool:
    """The `_INVISIBLE` character at `at` is one a name keeps: the Mongolian vowel separator
    before a final a or e, or a tag of an emoji flag (`flags`, `_flags`)."""
    if text[at] == "\u180e" and _separates_mongolian(text, at):
        return True
    return any(start < at < end for start, end in flags)


def _invisible_at(text: str) -> int | None:
    """Where `text`'s first `_INVISIBLE` character is (None: it has none)."""
    flags = _flags(text)
    for match in _INVISIBLE.finditer(text):
        if not _kept(text, match.start(), flags):
            return match.start()
    return None


def check_one_line(text: str, field: str, *, stored: bool = False) -> str:
    """A name or an ID a client gives: refused with BAD_REQUEST naming the field, the character
    and where it is when it holds one that breaks or disguises the line it is shown on (a
    console, a log, a model's context), or cannot be stored.

    `stored`: the name or ID of something that may be stored already (an import restores it,
    an update keeps it): earlier releases took invisible characters (`_INVISIBLE`), which
    are refused only in a new one."""
    check_storable(text, field)
    match = _NOT_ONE_LINE.search(text)
    at = match.start() if match is not None else None
    if not stored:
        invisible = _invisible_at(text[:at])
        at = invisible if invisible is not None else at
    if at is not None:
        raise BadInput(
            f"{field} contains U+{ord(text[at]):04X} at position {at}; a name or ID holds no"
            " control, line break, bidi mark, override or isolate, zero-width space or other"
            " character that shows as nothing (but the joiners U+200C and U+200D, variation"
            " selectors and an emoji flag's tags)"
        )
    return text


def for_model(text: str) -> str:
    """Text shown to a model as data: controls, bidi, zero-width and tag characters removed
    (`_DISGUISING`)."""
    return _DISGUISING.sub("", storable(text))


def for_model_json(value: Any) -> Any:
    """`for_model` applied to every string (keys included) of a JSON-shaped value."""
    return _map_strings(value, for_model)


# In a quoted text, escaped as \uXXXX (which a model reads as the character): the line
# separators json.dumps leaves as they are, and angle brackets with the characters drawn like
# them, so that nothing inside reads as a tag (`</conversation>`, in any case or script).
_UNQUOTED = re.compile(
    "[\u2028\u2029<>\u02c2\u02c3\u1433\u1438\u2039\u203a\u2329\u232a\u276c-\u2771"
    "\u27e8\u27e9\u29fc\u29fd\u3008\u3009\ufe64\ufe65\uff1c\uff1e]"
)
# The same in SQL that measures JSON text as `model_json` writes it (the pinned lists).
UNQUOTED_SQL = _sql_class(_UNQUOTED)


def _unquoted(literal: str) -> str:
    """JSON text with the `_UNQUOTED` characters of its strings as \\uXXXX escapes (JSON's own
    punctuation holds none of them)."""
    return _UNQUOTED.sub(lambda m: f"\\u{ord(m.group()):04x}", literal)


def model_json(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """A JSON-shaped value shown to a model as data (a record, a tool's result): `for_model`
    applied to its strings, and JSON text in which nothing reads as a tag, a chat template's
    role marker (`<|im_start|>`) or a line of its own (`_UNQUOTED`); it parses to the same
    value, less what `for_model` removes. `default` as json.dumps takes it."""
    return _unquoted(json.dumps(for_model_json(value), ensure_ascii=False, default=default))


def quoted(text: str, most: int | None = None, cut: str = " …(cut)") -> str:
    """Text shown to a model as one speaker's data among others' (a conversation's messages,
    pinned summaries): `for_model`, as one JSON string literal on one line. Its line breaks
    become \\n and its quotes \\", so it cannot end early, start a line of its own that
    reads as another speaker's, or close the tag around it; a model reads it whole.

    `most`: the literal takes at most that many characters (but for `cut` itself): a longer
    text keeps its start, followed by `cut`, inside the quotes."""
    literal = json.dumps(for_model(text), ensure_ascii=False)
    literal = _unquoted(literal)
    if most is None or len(literal) <= most:
        return literal
    keep = min(len(text), most)
    while True:
        shorter = quoted(text[:keep] + cut)
        if len(shorter) <= most or keep == 0:
            return shorter
        keep = min(keep - 1, keep * most // len(shorter))


# The longest search query a search entry point takes (memory and history search;
# ENGRAM_MAX_SEARCH_QUERY_CHARS is the setting).
MAX_QUERY_CHARS = 4096


def check_query(query: str | None, max_chars: int = MAX_QUERY_CHARS) -> None:
    """BadInput naming the limit when a search query is longer than a search entry point takes."""
    if query is not None and len(query) > max_chars:
        raise BadInput(
            f"the search query is {len(query):,} characters; at most {max_chars:,} are searched "
            "(ENGRAM_MAX_SEARCH_QUERY_CHARS): search for the words that matter"
        )


# RFC 3339's date-time (section 5.6): T and Z in either case, seconds required, an offset
# required. Python's fromisoformat alone takes other ISO 8601 forms (20270630T000000Z) and
# refuses a lowercase z.
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)",
    re.ASCII,
)
RFC3339_EXAMPLE = "2026-01-31T12:00:00Z"


def rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time, in UTC. ValueError, saying what was expected, for anything else
    (another ISO 8601 form, no offset, a leap second, a date out of range)."""
    found = _RFC3339.fullmatch(text)
    if found is None:
        raise ValueError(
            f"expected an RFC 3339 time with an offset, such as {RFC3339_EXAMPLE} or "
            "2026-01-31T14:00:00+02:00"
        )
    day, time, fraction, offset = found.groups()
    fraction = f".{fraction[:6]}" if fraction else ""  # microseconds: the rest is dropped
    offset = "+00:00" if offset.upper() == "Z" else offset
    try:
        parsed = datetime.fromisoformat(f"{day}T{time}{fraction}{offset}")
    except ValueError:
        # (not quoted: each caller names the value it was given)
        raise ValueError(
            "no such day or time: a day of its month, hours 00 to 23, minutes and seconds 00 "
            "to 59 (no leap second)"
        ) from None
    try:
        # In UTC, as stored: an instant outside year 1 to 9999 cannot be represented.
        utc = parsed.astimezone(UTC)
    except OverflowError:
        utc = None
    # The two extremes are what asyncpg stores as -infinity and infinity, which it reads back
    # without a time zone: refused as out of range.
    if utc is None or utc.replace(tzinfo=None) in (datetime.min, datetime.max):
        raise ValueError(
            "a time must fall between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z in "
            "UTC, both excluded"
        )
    return utc


def escaped(text: str) -> str:
    """`text` to print on one line of a terminal: each character that would break the line or
    disguise it written as its escape, \\u001b: controls (an escape sequence's ESC included),
    line separators, bidi overrides and marks, zero-width characters, the BOM, tags, what shows
    as nothing (`_NOT_ONE_LINE`, `_DISGUISING`, `_INVISIBLE`), and each lone surrogate. Kept as
    they are, as a name or an ID keeps them (`check_one_line`): a joiner (U+200C, U+200D)
    between two characters shown (a Persian word, an emoji sequence), the tags of an emoji
    flag's tag sequence, and the Mongolian vowel separator before a final a or e."""
    flags = _flags(text)

    def visible(at: int) -> bool:
        return 0 <= at < len(text) and not text[at].isspace() and not _ESCAPED.match(text, at)

    def one(match: re.Match[str]) -> str:
        c, at = match.group(), match.start()
        if c in "\u200c\u200d" and visible(at - 1) and visible(at + 1):
            return c
        if _kept(text, at, flags):
            return c
        return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"

    return _ESCAPED.sub(one, text)


_ESCAPED = re.compile(
    f"{_NOT_ONE_LINE.pattern}|{_DISGUISING.pattern}|{_INVISIBLE.pattern}|[\ud800-\udfff]"
)


def escaped_start(text: str, most: int) -> str:
    """The first `most` characters of `escaped` text, less the start of an escape the cut would
    split: `\\u00` of `\\u001b` reads as no character, or as another where what follows is
    added (`... (cut)`)."""
    if len(text) <= most:
        return text
    return _ESCAPE_START.sub("", text[:most])


# The start of an escape `escaped` writes, at the end of a text (`\u`, `\u00`, `\U0001f`).
_ESCAPE_START = re.compile(r"\\(?:u[0-9a-f]{0,3}|U[0-9a-f]{0,7})?\Z")


def shown(value: Any, most: int = 100) -> str:
    """`value` as a refusal quotes it: its repr, `shortened` to `most` characters."""
    return shortened(repr(value), most)


def shortened(text: str, most: int) -> str:
    """`text` whole when it is at most `most` characters, else cut to that many: its start, `…`,
    its last ten characters and its length. A value a client, a model or an edited file sent
    may be as long as its request (an ID of a megabyte), and a message that repeats it whole is
    sent back, stored and (to a model) read again, for no more than its start and end tell."""
    if len(text) <= most:
        return text
    end = f"…{text[-10:]} ({len(text):,} characters)"
    return text[: max(most - len(end), 0)] + end
