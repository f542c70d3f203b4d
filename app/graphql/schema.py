"""The schema: each domain's Query and Mutation classes, combined."""

from functools import cache
from typing import Annotated

import strawberry
from graphql import ASTValidationRule, FieldNode, GraphQLError, ValidationRule, get_named_type
from graphql.language.visitor import SKIP, VisitorAction
from graphql.type import is_introspection_type
from strawberry.extensions import AddValidationRules, MaxTokensLimiter
from strawberry.schema.config import StrawberryConfig

from app.graphql.actions import ActionMutation, ActionQuery
from app.graphql.auth import AuthMutation, AuthQuery
from app.graphql.context import Info
from app.graphql.documents import DocumentCache, Documents
from app.graphql.errors import ErrorCodes, Schema
from app.graphql.executions import ActionSession, ExecutionMutation, ExecutionQuery
from app.graphql.field_completion import answer_budget
from app.graphql.ingest import IngestMutation
from app.graphql.inputs import InputChecks
from app.graphql.limits import RepeatedFields, RequestLimits, depth_rule
from app.graphql.memory import MemoryMutation, MemoryQuery
from app.graphql.node import resolve_node, resolve_nodes
from app.graphql.observe import Outcome
from app.graphql.relay import Node
from app.graphql.scalars import SCALARS
from app.graphql.selection import SelectionGrants


@strawberry.type
class NodeQuery:
    @strawberry.field(
        description="Any object by its global ID, with the grants of the field that returned "
        "it. An ID of another account, or of nothing, is NOT_FOUND; a malformed one BAD_REQUEST."
    )
    async def node(
        self,
        info: Info,
        id: Annotated[
            strawberry.ID,
            strawberry.argument(description="The object's `id`, as a field returned it."),
        ],
    ) -> Node | None:
        return await resolve_node(info, id)

    @strawberry.field(
        description="Objects by their global IDs, in the order of `ids` (at most 1,000; an ID "
        "may come more than once): each as `node(id)` reads it. Where `node(id)` would answer "
        "NOT_FOUND (an ID of another account, or of nothing) the list holds null, with no "
        "error, and the rest stands. A malformed ID (BAD_REQUEST), or one of a type the caller "
        "may not read (ACCESS_DENIED), fails the request, naming its place: `data` is null."
    )
    async def nodes(
        self,
        info: Info,
        ids: Annotated[
            list[strawberry.ID],
            strawberry.argument(description="The objects' `id`s, as fields returned them."),
        ],
    ) -> list[Node | None]:
        return await resolve_nodes(info, ids)


@strawberry.type(
    description="What a client reads: who it is, clients, agents, executions, memory records, "
    "and any object by its global ID."
)
class Query(NodeQuery, AuthQuery, ActionQuery, ExecutionQuery, MemoryQuery):
    pass


@strawberry.type(
    description="What a client changes: accounts, clients and tokens, agents, turns, memory "
    "records and sessions."
)
class Mutation(AuthMutation, ActionMutation, ExecutionMutation, MemoryMutation, IngestMutation):
    pass


@cache
def _depth_rule(max_depth: int) -> type[ASTValidationRule]:
    # One rule class per limit, made once (QueryDepthLimiter makes one per request, and
    # measures a fragment again at each of its spreads: exponential in the fragments).
    return depth_rule(max_depth)


INTROSPECTION_OFF = (
    "introspection is turned off on this server (ENGRAM_INTROSPECTION=false); "
    "the schema is in the project's schema.graphql"
)


class NoIntrospection(ValidationRule):
    """Refuses `__schema` and `__type` (`__typename` stays: clients need it for unions)."""

    def enter_field(self, node: FieldNode, *_args: object) -> VisitorAction:
        type_ = get_named_type(self.context.get_type())
        if type_ is not None and is_introspection_type(type_):
            self.report_error(GraphQLError(INTROSPECTION_OFF, node))
            return SKIP  # one error for the field, none for what it selects
        return None


def build_schema(
    max_depth: int = 12,
    max_tokens: int = 5000,
    introspection: bool = True,
    *,
    max_nodes: int = 10_000,
    max_searches: int = 20,
    max_answer_bytes: int = 32 * 2**20,
) -> strawberry.Schema:
    rules = [_depth_rule(max_depth)] + ([] if introspection else [NoIntrospection])
    documents = Documents(maxsize=256)  # this schema's: valid under its rules
    return Schema(
        query=Query,
        mutation=Mutation,
        types=[ActionSession],
        config=StrawberryConfig(scalar_map=SCALARS),
        # A short path for plain fields, counting the answer's size as it completes it.
        execution_context_class=answer_budget(max_answer_bytes),
        extensions=[
            # Factories, not instances: each request gets its own extension objects.
            Outcome,  # first: it reads the codes ErrorCodes gives, after it
            lambda: AddValidationRules(rules),
            lambda: MaxTokensLimiter(max_token_count=max_tokens),
            lambda: DocumentCache(documents),  # after the two above: it keys on their settings
            RepeatedFields,  # after DocumentCache: a document it knows passed
            InputChecks,
            lambda: RequestLimits(max_nodes=max_nodes, max_searches=max_searches),
            SelectionGrants,  # after InputChecks: on a document it found well formed
            ErrorCodes,
        ],
    )


schema = build_schema()
