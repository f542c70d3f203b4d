"""The schema: each domain's Query and Mutation classes, combined."""

import strawberry
from strawberry.extensions import MaxTokensLimiter, QueryDepthLimiter
from strawberry.schema.config import StrawberryConfig

from app.graphql.actions import ActionMutation, ActionQuery
from app.graphql.auth import AuthMutation, AuthQuery
from app.graphql.context import Info
from app.graphql.errors import ErrorCodes
from app.graphql.executions import ActionSession, ExecutionQuery
from app.graphql.node import resolve_node
from app.graphql.relay import Node
from app.graphql.scalars import SCALARS


@strawberry.type
class NodeQuery:
    @strawberry.field(description="Any object by its global ID.")
    async def node(self, info: Info, id: strawberry.ID) -> Node | None:
        return await resolve_node(info, id)


@strawberry.type
class Query(NodeQuery, AuthQuery, ActionQuery, ExecutionQuery):
    pass


@strawberry.type
class Mutation(AuthMutation, ActionMutation):
    pass


def build_schema(max_depth: int = 12, max_tokens: int = 5000) -> strawberry.Schema:
    return strawberry.Schema(
        query=Query,
        mutation=Mutation,
        types=[ActionSession],
        config=StrawberryConfig(scalar_map=SCALARS),
        extensions=[
            QueryDepthLimiter(max_depth=max_depth),
            MaxTokensLimiter(max_token_count=max_tokens),
            ErrorCodes,
        ],
    )


schema = build_schema()
