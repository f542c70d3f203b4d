"""GraphQL types and operations for accounts, clients, policies and tokens."""

from enum import Enum
from uuid import UUID

import strawberry

from app.auth import service
from app.auth.service import Client as ClientRecord
from app.errors import BadInput
from app.graphql.context import Info
from app.graphql.node import node_type
from app.graphql.relay import Node, global_id, parse_uuid


@strawberry.enum
class PolicyEffect(Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"


@strawberry.enum
class PolicyAction(Enum):
    SELECT = "SELECT"
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


@strawberry.input
class PolicyInput:
    effect: PolicyEffect
    actions: list[PolicyAction]
    resources: list[str]


@strawberry.input
class AccountInput:
    name: str


@strawberry.input
class ClientInput:
    account_id: UUID | None = None
    principal: str
    name: str
    policies: list[PolicyInput]


@strawberry.input
class ClientUpdateInput:
    name: str | None = None
    policies: list[PolicyInput] | None = None


@strawberry.type
class Policy:
    effect: PolicyEffect
    actions: list[PolicyAction]
    resources: list[str]


@strawberry.type
class Account:
    account_id: UUID
    name: str


@strawberry.type
class Client(Node):
    account_id: UUID
    principal: str
    name: str
    policies: list[Policy]

    @classmethod
    def of(cls, client: ClientRecord) -> "Client":
        return cls(
            id=global_id("Client", client.account_id, client.principal),
            account_id=client.account_id,
            principal=client.principal,
            name=client.name,
            policies=[
                Policy(
                    effect=PolicyEffect(p["effect"]),
                    actions=[PolicyAction(a) for a in p["actions"]],
                    resources=list(p["resources"]),
                )
                for p in client.policies
            ],
        )


@strawberry.type
class ClientToken:
    account_id: UUID
    principal: str
    token: str = strawberry.field(description="Shown once: only its hash is stored.")


@strawberry.type
class Viewer:
    account_id: UUID
    principal: str


def _policies(policies: list[PolicyInput]) -> list[dict[str, object]]:
    return [
        {
            "effect": p.effect.value,
            "actions": [a.value for a in p.actions],
            "resources": p.resources,
        }
        for p in policies
    ]


@node_type("Client")
async def _client_node(info: Info, parts: list[str]) -> Client | None:
    if len(parts) != 2:
        raise BadInput("a Client ID names an account and a principal")
    account_id, principal = parse_uuid(parts[0]), parts[1]
    found = await service.get_client(info.context.pool, info.context.caller, account_id, principal)
    return Client.of(found) if found else None


@strawberry.type
class AuthQuery:
    @strawberry.field(description="The client this request authenticated as.")
    def viewer(self, info: Info) -> Viewer:
        caller = info.context.caller
        return Viewer(account_id=caller.account_id, principal=caller.principal)

    @strawberry.field
    async def client(
        self, info: Info, principal: str, account_id: UUID | None = None
    ) -> Client | None:
        found = await service.get_client(
            info.context.pool, info.context.caller, account_id, principal
        )
        return Client.of(found) if found else None


@strawberry.type
class AuthMutation:
    @strawberry.mutation
    async def create_account(self, info: Info, input: AccountInput) -> Account:
        account_id = await service.create_account(
            info.context.pool, info.context.caller, input.name
        )
        return Account(account_id=account_id, name=input.name.strip())

    @strawberry.mutation
    async def create_client(self, info: Info, input: ClientInput) -> Client:
        client = await service.create_client(
            info.context.pool,
            info.context.caller,
            input.account_id,
            input.principal,
            input.name,
            _policies(input.policies),
        )
        return Client.of(client)

    @strawberry.mutation
    async def update_client(
        self, info: Info, principal: str, input: ClientUpdateInput, account_id: UUID | None = None
    ) -> Client:
        client = await service.update_client(
            info.context.pool,
            info.context.caller,
            account_id,
            principal,
            input.name,
            _policies(input.policies) if input.policies is not None else None,
        )
        return Client.of(client)

    @strawberry.mutation
    async def delete_client(
        self, info: Info, principal: str, account_id: UUID | None = None
    ) -> Client:
        client = await service.delete_client(
            info.context.pool, info.context.caller, account_id, principal
        )
        return Client.of(client)

    @strawberry.mutation
    async def create_client_token(
        self, info: Info, principal: str, account_id: UUID | None = None
    ) -> ClientToken:
        caller = info.context.caller
        token = await service.create_client_token(info.context.pool, caller, account_id, principal)
        return ClientToken(
            account_id=account_id or caller.account_id, principal=principal, token=token
        )
