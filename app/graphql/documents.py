"""Each distinct query text is parsed and validated once: clients send the same few texts with
different variables, and parsing and validating them was a fifth of a search's CPU
(bench/README.md, http_load)."""

import re
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from graphql import DocumentNode, Source, SourceLocation, parse
from strawberry.extensions import SchemaExtension

# A parsed document takes about 140 bytes a character of its text (graphql-core keeps every
# token), so 256 texts near ENGRAM_MAX_QUERY_TOKENS (27,000 characters) held 600 MB that a
# client could fill with distinct texts (bench/README.md, "Growth"). Held texts are bounded in
# characters too: about 140 MB of documents at most, far more than a client's usual texts.
MAX_CHARS = 1_000_000


_NEWLINE = re.compile(r"\r\n|[\n\r]")  # graphql-core's line ends


class IndexedSource(Source):
    """A query text whose line ends are found once, at its first located error.

    graphql-core's Source scans the text from its start for each error it places (every field
    error's `locations`, made twice as the error goes up), to the end of a text without a line
    break: a request of 1,000 field errors after 900 KB of text (a comment, a long string) held
    the event loop 21 s, every tenant's `/healthz` waiting with it (bench/README.md,
    fuzz_graphql.py). The same line and column, found by bisection.
    """

    def get_location(self, position: int) -> SourceLocation:
        breaks = self.__dict__.get("_breaks")  # where each line break starts
        if breaks is None:
            found = (match.start() for match in _NEWLINE.finditer(self.body))
            breaks = self.__dict__["_breaks"] = array("q", found)
        before = bisect_left(breaks, position)  # the line breaks before the position
        line_start = 0
        if before:
            last = breaks[before - 1]
            line_start = last + (2 if self.body.startswith("\r\n", last) else 1)
        return SourceLocation(before + 1, position + 1 - line_start)


class Documents:
    """The documents of query texts that parsed and validated without error, most recently
    used last; at most `maxsize` of them, of at most `max_chars` characters of text in all. One
    per schema (its validation rules are fixed)."""

    def __init__(self, maxsize: int = 256, max_chars: int = MAX_CHARS) -> None:
        self.maxsize, self.max_chars = maxsize, max_chars
        self.chars = 0
        self._valid: OrderedDict[tuple[str, Any], DocumentNode] = OrderedDict()

    def get(self, key: tuple[str, Any]) -> DocumentNode | None:
        document = self._valid.get(key)
        if document is not None:
            self._valid.move_to_end(key)
        return document

    def add(self, key: tuple[str, Any], document: DocumentNode) -> None:
        if len(key[0]) > self.max_chars or key in self._valid:
            return
        self._valid[key] = document
        self.chars += len(key[0])
        while len(self._valid) > self.maxsize or self.chars > self.max_chars:
            (text, _), _ = self._valid.popitem(last=False)
            self.chars -= len(text)


class DocumentCache(SchemaExtension):
    """Hands strawberry the document of a text that parsed and validated before, and marks it
    valid, so that neither step runs again. Only successes are kept: a text that fails is
    parsed (or validated) again by strawberry itself, inside the operation hooks, so its
    errors come out as they always did (which strawberry's ParserCache does not ensure: a
    syntax error raised from its hook escapes the operation hooks, and ErrorCodes with it).
    """

    def __init__(self, documents: Documents) -> None:
        self.documents = documents
        self.key: tuple[str, Any] | None = None
        self.known: DocumentNode | None = None

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        if context.query is not None and context.graphql_document is None:
            self.key = (context.query, tuple(sorted(context.parse_options.items())))
            self.known = self.documents.get(self.key)
            if self.known is not None:
                context.graphql_document = self.known  # strawberry skips its parse
            else:
                try:  # an IndexedSource: its errors are placed in the text at little cost
                    document = parse(IndexedSource(context.query), **context.parse_options)
                except Exception:
                    pass  # strawberry parses it again in its hooks, its error out as ever
                else:
                    context.graphql_document = document  # strawberry skips its parse
        yield

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        if self.known is not None and context.graphql_document is self.known:
            context.pre_execution_errors = []  # strawberry skips its validation
        yield
        document = context.graphql_document
        if (
            self.key is not None
            and self.known is None
            and document is not None
            and context.pre_execution_errors == []
        ):
            self.documents.add(self.key, document)
