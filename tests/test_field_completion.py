"""Issue 14: the short path for plain fields (app/graphql/field_completion.py) answers as
graphql-core does, values, nulls, errors and their paths included."""

from enum import Enum
from typing import Any

import pytest
import strawberry
from strawberry.dataloader import DataLoader
from strawberry.permission import BasePermission, PermissionExtension

from app.graphql.field_completion import ExecutionContext


@strawberry.enum
class Color(Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.type
class Item:
    name: str
    color: Color
    size: int | None
    parts: list["Item"]

    @strawberry.field
    async def twin(self, info: strawberry.Info) -> str:
        return await info.context["loader"].load(self.name)

    @strawberry.field
    def broken(self) -> str | None:
        raise ValueError("broken on purpose")


@strawberry.type
class Box:
    item: Item
    maybe: Item | None
    items: list[Item]
    optional_items: list[Item | None] | None
    gone: Item | None = None


def item(name: str, **values: Any) -> Item:
    fields = {"color": Color.RED, "size": None, "parts": []} | values
    return Item(name=name, **fields)


GOOD = Box(
    item=item("a", parts=[item("a1"), item("a2", color=Color.BLUE)]),
    maybe=None,
    items=[item("b", size=3), item("c")],
    optional_items=[None, item("d")],
)
GONE = item("g")
del GONE.size  # reading it fails
# Values strawberry's types would refuse, as a buggy resolver could hand them over.
BAD = Box(
    gone=GONE,
    item=item("a", color="not a color", parts=[item(None)]),  # type: ignore[arg-type]
    maybe=item("m", size="three"),  # type: ignore[arg-type]
    items=[item("b"), None],  # type: ignore[list-item]
    optional_items=[item(None)],  # type: ignore[arg-type]
)


@strawberry.type
class Query:
    good: Box = strawberry.field(default_factory=lambda: GOOD)
    bad: Box = strawberry.field(default_factory=lambda: BAD)


QUERIES = [
    "{ good { item { name color size parts { name color } } maybe { name } items { name size }"
    " optionalItems { name } } }",
    "{ good { items { name twin broken parts { twin } } item { twin } } }",
    "{ good { item { n: name name __typename parts { ... on Item { name } } } } }",
    "{ bad { item { name color } } }",
    "{ bad { item { parts { name } } } }",
    "{ bad { maybe { name size } } }",
    "{ bad { items { name } } }",
    "{ bad { optionalItems { name } } }",
    "{ bad { gone { name size } } }",
    "{ good { item { name @skip(if: true) color } items { name @include(if: false) size } } }",
    # Empty lists, and one selection read for many objects (planned once for the request).
    "{ good { items { parts { name broken } p: parts { color } } item { parts { parts { name } } }"
    " optionalItems { parts { name } } } }",
]


async def run(schema: strawberry.Schema, query: str) -> tuple[Any, list[Any], int]:
    batches: list[list[str]] = []

    async def load(keys: list[str]) -> list[str]:
        batches.append(keys)
        return [k * 2 for k in keys]

    result = await schema.execute(
        query, root_value=Query(), context_value={"loader": DataLoader(load_fn=load)}
    )
    errors = [(e.message, e.path) for e in result.errors or []]
    return result.data, errors, len(batches)


@pytest.mark.parametrize("query", QUERIES)
async def test_issue14_the_short_path_answers_as_graphql_core(query):
    plain = strawberry.Schema(Query)
    short = strawberry.Schema(Query, execution_context_class=ExecutionContext)
    expected = await run(plain, query)
    assert await run(short, query) == expected
    assert expected[2] <= 1  # the DataLoader batches the whole page either way


class Needs(BasePermission):
    """A permission of one setting: the grant it needs, which `allows` reads as has_permission
    does."""

    message = "not allowed"

    def __init__(self, grant: str) -> None:
        self.grant = grant

    def has_permission(self, source: Any, info: strawberry.Info, **kwargs: Any) -> bool:
        return self.grant in info.context["grants"]

    def allows(self, source: Any, context: Any) -> bool:
        return self.grant in context["grants"]


def needs(grant: str) -> Any:
    return strawberry.field(extensions=[PermissionExtension(permissions=[Needs(grant)])])


@strawberry.type
class Guarded:
    a: str = needs("a")
    b: str = needs("b")


@strawberry.type
class GuardedQuery:
    @strawberry.field
    def guarded(self) -> Guarded:
        return Guarded(a="read with a", b="read with b")


async def test_issue14_guarded_fields_each_keep_their_own_permission():
    """A guarded leaf is read on the short path once its permission `allows` it: each field by
    its own permission's settings, not by another field's of the same class (Needs("a") let a
    caller holding only "a" read the field that Needs("b"))."""
    query = "{ guarded { a b } }"
    context = {"grants": {"a"}}
    plain = await strawberry.Schema(GuardedQuery).execute(query, context_value=context)
    short = await strawberry.Schema(GuardedQuery, execution_context_class=ExecutionContext).execute(
        query, context_value=context
    )
    assert plain.data is None and [e.message for e in plain.errors] == ["not allowed"]
    assert short.data == plain.data
    assert [(e.message, e.path) for e in short.errors] == [("not allowed", ["guarded", "b"])]
