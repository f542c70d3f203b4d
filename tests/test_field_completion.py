"""Issue 14: the short path for plain fields (app/graphql/field_completion.py) answers as
graphql-core does, values, nulls, errors and their paths included."""

import asyncio
import gc
import inspect
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import Enum
from typing import Any

import httpx
import pytest
import strawberry
from factories import allow, make_agent, record_turn, token_for, writer
from graphql import GraphQLError
from strawberry.dataloader import DataLoader
from strawberry.permission import BasePermission, PermissionExtension

from app.graphql.field_completion import ExecutionContext, gather_with_cancel


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


@asynccontextmanager
async def left_unawaited() -> AsyncIterator[list[str]]:
    """What the process logs, while the block runs (the served app's thread included) and the
    tasks it cancelled take their last step, of coroutines collected unawaited: the
    RuntimeWarnings, and the warnings that themselves failed (`Exception ignored in:
    <coroutine ...>`); filled in once the block ends."""
    found: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: found.append(f"{u.err_msg}: {u.object!r}: {u.exc_value!r}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
            await asyncio.sleep(0.2)  # a task cancelled unstarted is done at its first step
            gc.collect()
        found.extend(str(w.message) for w in caught if "never awaited" in str(w.message))
    finally:
        sys.unraisablehook = hook


@strawberry.type
class Tree:
    n: int
    kids: list["Tree"]
    child: "Tree"

    @strawberry.field
    async def value(self) -> int:
        return self.n

    @strawberry.field
    async def fail(self) -> int:
        raise ValueError("failed on purpose")


def tree(depth: int) -> Tree:
    if depth == 0:
        leaf = Tree(n=0, kids=[], child=None)  # type: ignore[arg-type]
        leaf.child = leaf
        return leaf
    return Tree(n=depth, kids=[tree(depth - 1), tree(depth - 1)], child=tree(depth - 1))


@strawberry.type
class TreeQuery:
    @strawberry.field
    async def tree(self) -> Tree:
        return tree(4)


class Unlogged(strawberry.Schema):
    def process_errors(self, errors: list[GraphQLError], *_: Any) -> None:
        """Not logged: a record (as pytest keeps it) holds the error's traceback, and through
        its frames what they held, past the test's collection."""


async def test_fields_cancelled_before_they_start_leave_no_coroutine_unawaited():
    """`child { fail }` fails `tree` (every field non-null) while its sibling `kids` is still
    starting the tasks of its items' fields: gather_with_cancel cancels them, some before their
    first step, and the coroutines they held (made before they were awaited) were collected
    unawaited, 140 "never awaited" warnings on graphql-core's own path and 64 on the short one.
    The answer stands as it was."""
    query = (
        "{ tree { child { fail } kids { value kids { value kids { value kids { value } } } } } }"
    )
    for context in (None, ExecutionContext):
        schema = Unlogged(TreeQuery, execution_context_class=context)
        async with left_unawaited() as unawaited:
            result = await schema.execute(query)
            answer = result.data, [(e.message, e.path) for e in result.errors or []]
            del result  # its errors' tracebacks hold the request's frames, and what they held
        assert answer == (None, [("failed on purpose", ["tree", "child", "fail"])])
        assert unawaited == [], (context, len(unawaited), sorted(set(unawaited)))


async def test_a_coroutine_a_resolver_leaves_unawaited_is_still_reported():
    """Only coroutines that can never run are closed: one a resolver forgets to await (here
    in a request that fails as above) still logs its RuntimeWarning."""

    async def forgotten() -> None: ...

    @strawberry.type
    class Sloppy:
        @strawberry.field
        async def tree(self) -> Tree:
            forgotten()
            return tree(4)

    query = "{ tree { child { fail } kids { value kids { value kids { value } } } } }"
    schema = Unlogged(Sloppy, execution_context_class=ExecutionContext)
    async with left_unawaited() as unawaited:
        result = await schema.execute(query)
        assert result.data is None
        del result
    assert [u.rsplit(".", 1)[-1] for u in unawaited] == ["forgotten' was never awaited"]


async def test_gather_with_cancel_closes_only_what_a_task_cancelled_unstarted_holds():
    """A task cancelled after its first step may still await what its coroutine was given (here
    in its `finally`): that runs. A task cancelled before its first step never runs its
    coroutine, and what that was given is closed, unrun. A future (no coroutine) is cancelled
    as graphql-core's gather_with_cancel cancels it."""
    ran: list[str] = []

    async def cleanup(name: str) -> None:
        ran.append(name)

    async def holding(held: Any) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await held

    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("failed on purpose")

    future = asyncio.get_running_loop().create_future()
    with pytest.raises(ValueError, match="on purpose"):
        await gather_with_cancel(fail(), holding(cleanup("started")), future)
    assert ran == ["started"] and future.cancelled()

    unstarted = cleanup("unstarted")
    waiting = asyncio.ensure_future(gather_with_cancel(holding(unstarted)))
    await asyncio.sleep(0)  # its task is made, and has not taken its first step
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert ran == ["started"] and inspect.getcoroutinestate(unstarted) == inspect.CORO_CLOSED


# A session's executions, each one's session and that session's executions.
EXECUTIONS = (
    "executions(first: 5) { nodes { executionId session { sessionId "
    "executions(first: 5) { nodes { executionId } } } } }"
)


async def test_a_served_request_whose_field_fails_leaves_no_coroutine_unawaited(
    base_url, state, admin
):
    """fuzz_graphql seed 65 (bench/README.md) logged, after a request failed, dozens of
    `RuntimeWarning: coroutine '...' was never awaited` (and `Exception ignored in: <coroutine
    ...>` ... `KeyError: '__import__'` where the collector ran inside a namedtuple's `__new__`).
    Here an execution's session's executions each read their session again, whose `history`
    fails (`first: 0`; the field is not null) while its siblings, reading only what the request
    has already read (the same page of executions, the same session), are still starting their
    fields' tasks when they are cancelled: 48 such warnings, the same each time."""
    agent = await make_agent(state, admin)
    turns = [writer(agent, session=s) for s in ("s1", "s1", "s2")]
    for turn in turns:
        await record_turn(state, turn)
    token = await token_for(state, admin, "reader", allow(["SELECT"], "financial.*"))
    siblings = " ".join(f"x{i}: {EXECUTIONS}" for i in range(3))
    query = (
        "query($e: UUID!) { execution(executionId: $e) { session { executions(first: 5) { nodes "
        f"{{ session {{ bad: history(first: 0) {{ nodes {{ id }} }} {siblings} }} }} }} }} }} }}"
    )
    body = {"query": query, "variables": {"e": str(turns[0].execution_id)}}
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=60) as http,
        left_unawaited() as unawaited,
    ):
        answer = (
            await http.post("/graphql", json=body, headers={"Authorization": f"Bearer {token}"})
        ).json()
    bad = ["execution", "session", "executions", "nodes"]
    assert answer == {
        "data": None,
        "errors": [
            {
                "message": "`first` must be from 1 to 1000, got 0",
                "locations": [{"line": 1, "column": query.index("bad:") + 1}],
                "path": [*bad, i, "session", "bad"],
                "extensions": {"code": "BAD_REQUEST"},
            }
            for i in (0, 1)
        ],
    }
    assert unawaited == [], (len(unawaited), sorted(set(unawaited)))
