"""A query text is parsed and validated once (app/graphql/documents.py); a text that fails
is checked again each time, with the same coded errors as without the cache."""

import graphql
import pytest
import strawberry.schema.schema as strawberry_schema

from app.graphql import documents

VIEWER = (
    "query Who($ops: [String!]!) { viewer { principal allowed(operations: $ops) { allowed } } }"
)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts graphql-core parses (the real parser, counted): the cache's own parse (of an
    IndexedSource) and strawberry's (of a text the cache's parse refused)."""
    seen: list[str] = []

    def counted(source: str | graphql.Source, **options: object) -> graphql.DocumentNode:
        seen.append(source.body if isinstance(source, graphql.Source) else source)
        return graphql.parse(source, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(strawberry_schema, "parse", counted)
    monkeypatch.setattr(documents, "parse", counted)
    return seen


async def test_a_valid_text_is_parsed_once_whatever_its_variables(gql, admin, parses):
    for ops in (["client"], ["deleteAgentMemory"], ["client"]):
        answer = (await gql(admin, VIEWER, ops=ops)).ok()
        assert answer["viewer"]["principal"] == "admin"
    assert parses.count(VIEWER) <= 1  # none when an earlier test already sent it


async def test_a_failing_text_is_checked_again_and_coded_each_time(gql, admin, parses):
    broken = "{ viewer { principal "
    unknown = "{ viewer { principal nickname } }"
    for _ in range(2):
        syntax = await gql(admin, broken)
        assert syntax.codes == ["BAD_REQUEST"] and "Syntax Error" in syntax.errors[0]["message"]
        invalid = await gql(admin, unknown)
        assert invalid.codes == ["BAD_REQUEST"] and "nickname" in invalid.errors[0]["message"]
    # A syntax error twice a request: the cache's parse, then strawberry's, which reports it
    # within the operation's hooks (coded as ever).
    assert parses.count(broken) == 4 and parses.count(unknown) == 2
