"""GraphQL types and operations for accounts, clients, policies and tokens."""

from datetime import datetime
from enum import Enum
from uuid import UUID

import strawberry

from app.auth import service
from app.auth.operations import permissions
from app.auth.service import Client as ClientRecord
from app.auth.service import TokenInfo
from app.errors import BadInput
from app.graphql.context import Info
from app.graphql.node import node_type
from app.graphql.relay import (
    Connection,
    Node,
    check_first,
    connection,
    decode_cursor,
    encode_cursor,
    global_id,
    parse_uuid,
)
from app.graphql.scalars import Timestamp


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


def _timestamp(value: datetime | None) -> Timestamp | None:
    return Timestamp(value) if value is not None else None


@strawberry.type(description="One of a client's API tokens: never its secret.")
class ClientTokenInfo:
    token_id: UUID
    prefix: str | None = strawberry.field(
        description="The secret's first characters, to tell tokens apart; null for tokens "
        "issued before prefixes were kept."
    )
    created: Timestamp
    expires: Timestamp | None = strawberry.field(description="Null: valid until revoked.")
    last_used: Timestamp | None = strawberry.field(
        description="When a request last sent it, to the minute; null if never."
    )
    bootstrap: bool = strawberry.field(
        description="Made from ENGRAM_BOOTSTRAP_TOKEN: replaced at start when it changes."
    )

    @classmethod
    def of(cls, info: TokenInfo) -> "ClientTokenInfo":
        return cls(
            token_id=info.token_id,
            prefix=info.prefix,
            created=Timestamp(info.created),
            expires=_timestamp(info.expires),
            last_used=_timestamp(info.last_used),
            bootstrap=info.bootstrap,
        )


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

    @strawberry.field(
        description="The client's tokens, newest first. Needs SELECT on financial.Client.token."
    )
    async def tokens(self, info: Info) -> list[ClientTokenInfo]:
        found = await service.list_client_tokens(
            info.context.pool, info.context.caller, self.account_id, self.principal
        )
        return [ClientTokenInfo.of(t) for t in found]


@strawberry.type
class ClientToken:
    account_id: UUID
    principal: str
    token: str = strawberry.field(description="Shown once: only its hash is stored.")
    token_id: UUID
    prefix: str
    created: Timestamp
    expires: Timestamp | None


@strawberry.type(description="Whether the caller's grants permit one named operation.")
class AllowedOperation:
    operation: str
    allowed: bool
    reason: str | None = strawberry.field(
        description="Why not, as a sentence (the grant it lacks); null when allowed."
    )


@strawberry.type
class Viewer:
    account_id: UUID
    principal: str

    @strawberry.field(
        description="Which of the named operations (root fields such as `deleteAgentMemory`, "
        "or `Type.field` such as `Action.memories`) this client's grants permit, in the order "
        "asked; an unknown name is BAD_REQUEST listing the known ones."
    )
    def allowed(self, info: Info, operations: list[str]) -> list[AllowedOperation]:
        return [
            AllowedOperation(operation=p.operation, allowed=p.allowed, reason=p.reason)
            for p in permissions(info.context.caller, operations)
        ]


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

    @strawberry.field(
        description="The account's clients by principal (the caller's account unless "
        "`accountId`). Needs SELECT on financial.Client.document."
    )
    async def clients(
        self, info: Info, first: int, after: str | None = None, account_id: UUID | None = None
    ) -> Connection[Client]:
        check_first(first)
        cursor = decode_cursor(after, 1)
        if cursor is not None and not isinstance(cursor[0], str):
            raise BadInput("`after` is not a cursor this connection issued")
        found = await service.list_clients(
            info.context.pool,
            info.context.caller,
            account_id,
            after=cursor[0] if cursor else None,
            limit=first + 1,
        )
        return connection(
            found,
            first,
            lambda c: encode_cursor(c.principal),
            Client.of,
            has_previous=after is not None,
        )

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

    @strawberry.mutation(
        description="A new API token for the client, shown once; valid until `expires` "
        "(none: until revoked). Needs INSERT on financial.Client.token."
    )
    async def create_client_token(
        self,
        info: Info,
        principal: str,
        account_id: UUID | None = None,
        expires: Timestamp | None = None,
    ) -> ClientToken:
        issued = await service.issue_client_token(
            info.context.pool, info.context.caller, account_id, principal, expires
        )
        return ClientToken(
            account_id=issued.info.account_id,
            principal=principal,
            token=issued.token,
            token_id=issued.info.token_id,
            prefix=issued.info.prefix or "",
            created=Timestamp(issued.info.created),
            expires=_timestamp(issued.info.expires),
        )

    @strawberry.mutation(
        description="Revokes one of the client's tokens: requests sending it are refused from "
        "now on. Needs DELETE on financial.Client.token."
    )
    async def revoke_client_token(
        self, info: Info, principal: str, token_id: UUID, account_id: UUID | None = None
    ) -> ClientTokenInfo:
        revoked = await service.revoke_client_token(
            info.context.pool, info.context.caller, account_id, principal, token_id
        )
        return ClientTokenInfo.of(revoked)
