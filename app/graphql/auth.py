"""GraphQL types and operations for accounts, clients, policies and tokens."""

from datetime import datetime
from enum import Enum
from typing import Annotated
from uuid import UUID

import strawberry

from app.auth import service
from app.auth.operations import permissions
from app.auth.service import Client as ClientRecord
from app.auth.service import TokenInfo, TokenPage
from app.db import cursors
from app.db.cursors import Keyset
from app.errors import BadInput
from app.graphql.context import Info, batch_loader, batch_pages
from app.graphql.enums import graphql_enum
from app.graphql.node import node_type
from app.graphql.relay import (
    AFTER,
    CREATED_ID,
    FIRST,
    Connection,
    Node,
    global_id,
    keyset_connection,
    parse_uuid,
)
from app.graphql.scalars import Timestamp, Value


@graphql_enum(
    "Whether a policy allows or denies: a request is allowed when at least one ALLOW policy "
    "matches its verb and resource and no DENY policy does."
)
class PolicyEffect(Enum):
    ALLOW = "Allows the verbs on the resources."
    DENY = "Denies the verbs on the resources, whatever ALLOW policies say."


@graphql_enum("A verb a policy allows or denies (docs/access.md: what each does).")
class PolicyAction(Enum):
    SELECT = "Read and list."
    INSERT = "Create, and run turns."
    UPDATE = "Change, and delete memory records."
    DELETE = "Delete clients, revoke tokens, erase sessions."


EFFECT = "ALLOW or DENY; DENY wins."
VERBS = "A non-empty list of SELECT, INSERT, UPDATE, DELETE."
RESOURCES = (
    "A non-empty list (at most 100) of resource patterns, such as financial.AgentMemory.*: "
    "`*` matches any run of characters, dots included, `?` one character (docs/access.md)."
)

# The token whose issued tokens tokensIssuedBy and revokeTokensIssuedBy follow.
ISSUING_TOKEN = Annotated[
    UUID,
    strawberry.argument(
        description="The `tokenId` of the token (a leaked one), revoked or not: what it issued "
        "names it as `issuedByTokenId`."
    ),
]


@strawberry.input(description="A policy of a client: an effect, verbs and resource patterns.")
class PolicyInput:
    effect: PolicyEffect = strawberry.field(description=EFFECT)
    actions: list[PolicyAction] = strawberry.field(description=VERBS)
    resources: list[str] = strawberry.field(description=RESOURCES)


@strawberry.input(description="A new account (tenant).")
class AccountInput:
    name: str = strawberry.field(description="The account's name, 1 to 200 characters.")


@strawberry.input(description="An account's new name.")
class AccountUpdateInput:
    name: str = strawberry.field(description="The account's new name, 1 to 200 characters.")
    expected_name: str | None = strawberry.field(
        default=None,
        description="The account's `name` that this change was based on: if it is now another "
        "(someone renamed the account since), the update is CONFLICT and nothing changes. A form "
        "passes the name it was filled from; by default no check.",
    )


PRINCIPAL_TEXT = (
    "The client's principal: 1 to 200 characters, letters, digits and `_ . : @ / + -`, starting "
    "with a letter or digit."
)
CLIENT_NAME = "The client's name, 1 to 200 characters."
POLICIES = "The client's policies (at most 100)."


@strawberry.input(description="A new client: a principal of one account, with its policies.")
class ClientInput:
    account_id: UUID | None = strawberry.field(
        default=None,
        description="The account of the client; by default the caller's. Only clients of the "
        "default account manage clients of other accounts.",
    )
    principal: str = strawberry.field(description=PRINCIPAL_TEXT)
    name: str = strawberry.field(description=CLIENT_NAME)
    policies: list[PolicyInput] = strawberry.field(description=POLICIES)


@strawberry.input(description="Changes to a client; what is omitted stays as it is.")
class ClientUpdateInput:
    name: str | None = strawberry.field(default=None, description=CLIENT_NAME)
    policies: list[PolicyInput] | None = strawberry.field(
        default=None, description="The client's new policies: they replace all its policies."
    )
    expected_modified: Timestamp | None = strawberry.field(
        default=None,
        description="The client's `modified` that these changes were based on: if it changed "
        "since (someone else changed the client), the update is CONFLICT and nothing changes. "
        "A form passes the `modified` it was filled from; by default no check.",
    )


@strawberry.type(description="A policy of a client: an effect, verbs and resource patterns.")
class Policy:
    effect: PolicyEffect = strawberry.field(description=EFFECT)
    actions: list[PolicyAction] = strawberry.field(description=VERBS)
    resources: list[str] = strawberry.field(description=RESOURCES)


@strawberry.type(
    description="An account: a tenant. Nothing of one is visible to another's clients."
)
class Account(Node):
    account_id: UUID = strawberry.field(description="Unique identifier of the account.")
    name: str = strawberry.field(description="The account's name.")
    created: Timestamp = strawberry.field(description="When it was created.")
    is_default: bool = strawberry.field(
        description="Whether it is the default (operator) account, which the first start made: "
        "its clients may create accounts and manage every account's clients."
    )

    @classmethod
    def of(cls, account: service.Account) -> "Account":
        return cls(
            id=global_id("Account", account.account_id),
            account_id=account.account_id,
            name=account.name,
            created=Timestamp(account.created),
            is_default=account.is_default,
        )


THE_ACCOUNT = Annotated[UUID, strawberry.argument(description="The account's `accountId`.")]
ACCOUNT_ID = Annotated[
    UUID | None,
    strawberry.argument(
        description="The client's account; by default the caller's. Only clients of the default "
        "account name another."
    ),
]
PRINCIPAL = Annotated[str, strawberry.argument(description="The client's principal.")]
PRINCIPALS = Keyset(cursors.TEXT)  # clients by principal
ACCOUNTS = Keyset(cursors.TEXT, cursors.ID)  # accounts by name, then ID


def _timestamp(value: datetime | None) -> Timestamp | None:
    return Timestamp(value) if value is not None else None


def _token_id(account_id: UUID, principal: str, token_id: UUID) -> strawberry.ID:
    return global_id("ClientToken", account_id, principal, token_id)


ISSUED_BY = (
    "Who issued it: the principal of the client whose createClientToken made it (with its "
    "account, `issuedByAccountId`, and the token its request sent, `issuedByTokenId`), as "
    f"`modifiedBy` names a client; `{service.ISSUER_COMMAND_LINE}` for `engram client token`; "
    f"`{service.ISSUER_BOOTSTRAP}` for the token made from ENGRAM_BOOTSTRAP_TOKEN; "
    f"`{service.ISSUER_FIRST_START}` for the admin token the first start printed. A client "
    f"outside the default account reads `{service.ISSUER_DEFAULT_ACCOUNT}` for a token that a "
    "client of the default account issued in its account, with neither account nor token (they "
    "are the operator's). No client's principal is one of these four: each holds a space. Null "
    "for a token issued before issuers were recorded (migration 0037), but a bootstrap token, "
    f"`{service.ISSUER_BOOTSTRAP}`."
)
ISSUED_BY_ACCOUNT = (
    "The account of the client that issued it (`issuedBy`): the token's own, or the default "
    "account's for a token one of its clients issued in another account, which only clients "
    "of the default account read (others read null). Null when no client did (`issuedBy` is "
    "null or names the command line, the bootstrap setting or the first start)."
)
ISSUED_BY_TOKEN = (
    "The `tokenId` of the token that the issuing client's request sent (it may since have been "
    "revoked): the tokens a leaked token issued name it here. Null when `issuedByAccountId` is."
)


@strawberry.type(description="One of a client's API tokens: never its secret.")
class ClientTokenInfo(Node):
    token_id: UUID = strawberry.field(description="The token's ID: revokeClientToken takes it.")
    account_id: UUID = strawberry.field(description="The account of the client it names.")
    principal: str = strawberry.field(description="The principal of the client it names.")
    prefix: str | None = strawberry.field(
        description="The secret's first characters, to tell tokens apart; null for tokens "
        "issued before prefixes were kept."
    )
    created: Timestamp = strawberry.field(description="When it was issued.")
    expires: Timestamp | None = strawberry.field(description="Null: valid until revoked.")
    last_used: Timestamp | None = strawberry.field(
        description="When a request last sent it, to the minute; null if never."
    )
    bootstrap: bool = strawberry.field(
        description="Made from ENGRAM_BOOTSTRAP_TOKEN: replaced at start when it changes."
    )
    issued_by: str | None = strawberry.field(description=ISSUED_BY)
    issued_by_account_id: UUID | None = strawberry.field(description=ISSUED_BY_ACCOUNT)
    issued_by_token_id: UUID | None = strawberry.field(description=ISSUED_BY_TOKEN)

    @classmethod
    def of(cls, info: TokenInfo) -> "ClientTokenInfo":
        return cls(
            id=_token_id(info.account_id, info.principal, info.token_id),
            token_id=info.token_id,
            account_id=info.account_id,
            principal=info.principal,
            prefix=info.prefix,
            created=Timestamp(info.created),
            expires=_timestamp(info.expires),
            last_used=_timestamp(info.last_used),
            bootstrap=info.bootstrap,
            issued_by=info.issued_by,
            issued_by_account_id=info.issued_by_account,
            issued_by_token_id=info.issued_by_token,
        )


@strawberry.type(
    description="A client: a principal of one account, holding policies and any number of API "
    "tokens."
)
class Client(Node):
    account_id: UUID = strawberry.field(description="The client's account.")
    principal: str = strawberry.field(
        description="The client's principal, unique in its account: what `createdBy`, "
        "`modifiedBy`, an execution's `principal` and a token's `issuedBy` name."
    )
    name: str = strawberry.field(description="The client's name.")
    policies: list[Policy] = strawberry.field(description="What the client may do.")
    modified: Timestamp = strawberry.field(
        description="When it was created or last updated (the expectedModified of updateClient "
        "and deleteClient)."
    )
    record: strawberry.Private[ClientRecord]

    @classmethod
    def of(cls, client: ClientRecord) -> "Client":
        return cls(
            record=client,
            id=global_id("Client", client.account_id, client.principal),
            account_id=client.account_id,
            principal=client.principal,
            name=client.name,
            modified=Timestamp(client.modified),
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
        description="Whether the client this request authenticated as holds every grant this "
        "client holds. Only then may it issue this client a token (createClientToken) or change "
        "it (updateClient), each also needing its own grant (Viewer.allowed); deleteClient and "
        "revokeClientToken take rights away and do not ask it."
    )
    def covered_by_viewer(self, info: Info) -> bool:
        return service.covers_client(info.context.caller, client=self.record)

    @strawberry.field(
        description="The client's tokens, newest first. Needs SELECT on financial.Client.token."
    )
    async def tokens(
        self, info: Info, first: FIRST, after: AFTER = None
    ) -> Connection[ClientTokenInfo]:
        return await keyset_connection(
            first,
            after,
            CREATED_ID.bound("Client.tokens", self.account_id, self.principal),
            lambda keyset, limit: info.context.load(
                "Client.tokens",
                TokenPage(self.account_id, self.principal, keyset, limit),
            ),
            lambda t: (t.created, t.token_id),
            ClientTokenInfo.of,
        )


batch_pages("Client.tokens", service.list_client_token_pages)


@strawberry.type(
    description="A new API token, with its secret: shown this once (`node(id)` reads the token "
    "back as a ClientTokenInfo, without it)."
)
class ClientToken(Node):
    account_id: UUID = strawberry.field(description="The client's account.")
    principal: str = strawberry.field(description="The client's principal.")
    token: str = strawberry.field(
        description="Shown once: only its hash is stored. Send it as `Authorization: Bearer`."
    )
    token_id: UUID = strawberry.field(description="The token's ID: revokeClientToken takes it.")
    prefix: str = strawberry.field(
        description="The secret's first characters, to tell tokens apart."
    )
    created: Timestamp = strawberry.field(description="When it was issued.")
    expires: Timestamp | None = strawberry.field(description="Null: valid until revoked.")
    issued_by: str | None = strawberry.field(description=ISSUED_BY)
    issued_by_account_id: UUID | None = strawberry.field(description=ISSUED_BY_ACCOUNT)
    issued_by_token_id: UUID | None = strawberry.field(description=ISSUED_BY_TOKEN)


@strawberry.type(description="Whether the caller's grants permit one named operation.")
class AllowedOperation:
    operation: str = strawberry.field(description="The operation, as it was asked for.")
    allowed: bool = strawberry.field(description="Whether this client's grants permit it.")
    reason: str | None = strawberry.field(
        description="Why not, as a sentence (the grant it lacks); null when allowed."
    )


@strawberry.type(description="The client a request authenticated as.")
class Viewer:
    account_id: UUID = strawberry.field(description="Its account.")
    principal: str = strawberry.field(description="Its principal.")
    token_id: UUID | None = strawberry.field(
        description="The ID of the API token this request sent (as `Client.tokens` lists it), "
        "so that a console can tell which token is its own."
    )

    @strawberry.field(
        description="Which of the named operations (root fields such as `deleteAgentMemory`, "
        "or `Type.field` such as `Action.memories`) this client's grants permit, in the order "
        "asked; an unknown name is BAD_REQUEST listing the known ones. "
        "`Action.searchMemories` answers for a search with a query; one without a query lists "
        "records, and one with `ids` reads them, which need what `Action.memories` needs."
    )
    def allowed(
        self,
        info: Info,
        operations: Annotated[
            list[str],
            strawberry.argument(
                description="Operation names: root fields such as `deleteAgentMemory`, or "
                "`Type.field` such as `Action.memories`."
            ),
        ],
    ) -> list[AllowedOperation]:
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


# Clients, accounts and tokens by ID, for node(id) and nodes(ids): one query per type.
batch_loader("Client", service.get_clients, Client.of)
batch_loader("Account", service.get_accounts, Account.of)
batch_loader("ClientToken", service.get_client_tokens, ClientTokenInfo.of)


def _client_key(parts: list[str]) -> tuple[UUID, str]:
    if len(parts) != 2:
        raise BadInput("a Client ID names an account and a principal")
    return parse_uuid(parts[0]), parts[1]


def _account_key(parts: list[str]) -> tuple[UUID]:
    if len(parts) != 1:
        raise BadInput("an Account ID names one account")
    return (parse_uuid(parts[0]),)


def _token_key(parts: list[str]) -> tuple[UUID, str, UUID]:
    if len(parts) != 3:
        raise BadInput("a ClientToken ID names an account, a principal and a token")
    return parse_uuid(parts[0]), parts[1], parse_uuid(parts[2])


@node_type("Client", _client_key)
async def _client_node(info: Info, key: tuple[UUID, str]) -> Client | None:
    return await info.context.load("Client", key)


@node_type("Account", _account_key)
async def _account_node(info: Info, key: tuple[UUID]) -> Account | None:
    return await info.context.load("Account", key)


@node_type("ClientToken", _token_key)
async def _token_node(info: Info, key: tuple[UUID, str, UUID]) -> ClientTokenInfo | None:
    return await info.context.load("ClientToken", key)


@graphql_enum("What an admin event changed.")
class AdminEventTarget(Enum):
    ACCOUNT = "An account: `target` is its accountId."
    CLIENT = "A client: `target` is its principal."
    TOKEN = "An API token: `target` is its tokenId, `principal` its client's."


@strawberry.type(
    description="A change to an account, a client or a token (an admin mutation), and who made "
    "it: written in the change's own transaction, so every change that committed has one."
)
class AdminEvent:
    event_id: UUID = strawberry.field(description="Unique identifier of the event.")
    account_id: UUID = strawberry.field(
        description="The account the change is in; for deleteAccount, the account of the client "
        "that deleted it (the deleted account's events went with it)."
    )
    at: Timestamp = strawberry.field(description="When: the time of the change's transaction.")
    actor: str = strawberry.field(
        description="Who: the principal of the client whose request made it (with its account, "
        "`actorAccountId`, and the token its request sent, `actorTokenId`), or, as a token's "
        f"`issuedBy` says, `{service.ISSUER_COMMAND_LINE}` for an `engram` command, "
        f"`{service.ISSUER_BOOTSTRAP}` and `{service.ISSUER_FIRST_START}` for what a start made. "
        f"A client outside the default account reads `{service.ISSUER_DEFAULT_ACCOUNT}` for a "
        "change a client of the default account made in its account, with neither account nor "
        "token (they are the operator's)."
    )
    actor_account_id: UUID | None = strawberry.field(
        description="The account of the client that made it; null when no client did."
    )
    actor_token_id: UUID | None = strawberry.field(
        description="The `tokenId` of the token its request sent (it may since have been "
        "revoked): adminEvents(tokenId) lists what one token changed. Null when "
        "`actorAccountId` is."
    )
    operation: str = strawberry.field(
        description="The mutation, such as `deleteClient`; what a start does to the admin's "
        "client and tokens is named as the mutation that does the same."
    )
    target_kind: AdminEventTarget = strawberry.field(description="What it changed.")
    target: str = strawberry.field(
        description="Which: the account's accountId, the client's principal or the token's "
        "tokenId (`targetKind`)."
    )
    principal: str | None = strawberry.field(
        description="The principal of the client changed, or whose token it is; null for an "
        "account."
    )
    changes: Value = strawberry.field(
        description="What changed, as JSON: names and policies (with `previousName`, "
        "`previousPolicies`), a token's `expires`, the `tokenId` revokeTokensIssuedBy was "
        "given (not to a client outside the default account, where the revocation was not its "
        "account's clients'). Never a token's secret."
    )

    @classmethod
    def of(cls, event: service.AdminEvent) -> "AdminEvent":
        return cls(
            event_id=event.event_id,
            account_id=event.account_id,
            at=Timestamp(event.at),
            actor=event.actor,
            actor_account_id=event.actor_account,
            actor_token_id=event.actor_token,
            operation=event.operation,
            target_kind=AdminEventTarget[event.target_kind.upper()],
            target=event.target,
            principal=event.target_principal,
            changes=Value(event.changes),
        )


@strawberry.type(description="Who is asking, and the account's clients.")
class AuthQuery:
    @strawberry.field(description="The client this request authenticated as.")
    def viewer(self, info: Info) -> Viewer:
        caller = info.context.caller
        return Viewer(
            account_id=caller.account_id, principal=caller.principal, token_id=caller.token_id
        )

    @strawberry.field(
        description="The accounts (tenants) by name, then accountId, to find a tenant's "
        "accountId by its name. A client of the default account lists every account; another "
        "client its own alone, as `clients` and `node(id)` reach no other account for it (not "
        "ACCESS_DENIED: what it may not reach is not there for it). Needs SELECT on "
        "financial.Account.document."
    )
    async def accounts(self, info: Info, first: FIRST, after: AFTER = None) -> Connection[Account]:
        caller = info.context.caller
        async with info.context.reads():
            return await keyset_connection(
                first,
                after,
                ACCOUNTS.bound("accounts", caller.account_id),
                lambda keyset, limit: service.list_accounts(
                    info.context.pool,
                    caller,
                    after=(keyset[0], keyset[1]) if keyset else None,
                    limit=limit,
                ),
                lambda a: (a.name, a.account_id),
                Account.of,
            )

    @strawberry.field(
        description="The account's clients by principal (the caller's account unless "
        "`accountId`). Needs SELECT on financial.Client.document."
    )
    async def clients(
        self, info: Info, first: FIRST, after: AFTER = None, account_id: ACCOUNT_ID = None
    ) -> Connection[Client]:
        async with info.context.reads():
            return await keyset_connection(
                first,
                after,
                PRINCIPALS.bound("clients", account_id or info.context.caller.account_id),
                lambda principal, limit: service.list_clients(
                    info.context.pool,
                    info.context.caller,
                    account_id=account_id,
                    after=principal[0] if principal else None,
                    limit=limit,
                ),
                lambda c: (c.principal,),
                Client.of,
            )

    @strawberry.field(
        description="A client by its principal; null if none. Needs SELECT on "
        "financial.Client.document."
    )
    async def client(
        self, info: Info, principal: PRINCIPAL, account_id: ACCOUNT_ID = None
    ) -> Client | None:
        found = await service.get_client(
            info.context.pool, info.context.caller, account_id=account_id, principal=principal
        )
        return Client.of(found) if found else None

    @strawberry.field(
        description="What revokeTokensIssuedBy(tokenId) would revoke now, revoking nothing: "
        "the token `tokenId`, if it is still there, and every token whose issuers lead back to "
        "it (each token it issued, each token those issued, and so on), oldest first, with the "
        "client (`accountId`, `principal`) each names, when it was issued and last used. After "
        "a leak, see what went out before revoking it. It reaches what revokeTokensIssuedBy "
        "reaches: every account for a client of the default account; another client its own "
        "account, through the tokens its account's clients issued. None is an empty page, not "
        "NOT_FOUND (an unknown ID cannot be told from one whose tokens are gone). Each page "
        "walks the whole chain. Needs SELECT on financial.Client.token."
    )
    async def tokens_issued_by(
        self,
        info: Info,
        token_id: ISSUING_TOKEN,
        first: FIRST,
        after: AFTER = None,
    ) -> Connection[ClientTokenInfo]:
        caller = info.context.caller
        async with info.context.reads():
            return await keyset_connection(
                first,
                after,
                # The caller's account chooses the tokens too: it reaches them.
                CREATED_ID.bound("tokensIssuedBy", token_id, caller.account_id),
                lambda keyset, limit: service.list_tokens_issued_by(
                    info.context.pool,
                    caller,
                    token_id=token_id,
                    after=keyset,
                    limit=limit,
                ),
                lambda t: (t.created, t.token_id),
                ClientTokenInfo.of,
            )

    @strawberry.field(
        description="Who changed accounts, clients and tokens, and when (each admin mutation, "
        "the `engram` commands that do the same, and what a start makes), newest first: the "
        "account's events (the caller's account unless `accountId`; only clients of the "
        "default account name another); with `tokenId`, what requests sending that token "
        "changed alone, in every account the caller reaches when `accountId` is not given. "
        "After a leak, adminEvents(tokenId: leaked) lists what the leaked token did. A client "
        "outside the default account finds only its account's clients' tokens by `tokenId`. "
        "Needs SELECT on financial.Account.events."
    )
    async def admin_events(
        self,
        info: Info,
        first: FIRST,
        after: AFTER = None,
        account_id: Annotated[
            UUID | None,
            strawberry.argument(
                description="The account; by default the caller's (with `tokenId`, every "
                "account the caller reaches)."
            ),
        ] = None,
        token_id: Annotated[
            UUID | None,
            strawberry.argument(
                description="The `tokenId` of a token, revoked or not: only the changes "
                "requests sending it made (`actorTokenId`)."
            ),
        ] = None,
    ) -> Connection[AdminEvent]:
        caller = info.context.caller
        async with info.context.reads():
            return await keyset_connection(
                first,
                after,
                # The caller's account chooses the events too: it reaches them.
                CREATED_ID.bound(
                    "adminEvents",
                    account_id or (None if token_id else caller.account_id),
                    token_id,
                    caller.account_id,
                ),
                lambda keyset, limit: service.list_admin_events(
                    info.context.pool,
                    caller,
                    account_id=account_id,
                    token_id=token_id,
                    after=keyset,
                    limit=limit,
                ),
                lambda e: (e.at, e.event_id),
                AdminEvent.of,
            )


@strawberry.type(description="Managing accounts, clients and tokens.")
class AuthMutation:
    @strawberry.mutation(
        description="Creates an account (a tenant). Only clients of the default account may, "
        "with INSERT on financial.Account.document."
    )
    async def create_account(
        self,
        info: Info,
        input: Annotated[AccountInput, strawberry.argument(description="The new account.")],
    ) -> Account:
        account = await service.create_account(
            info.context.pool, info.context.caller, name=input.name
        )
        return Account.of(account)

    @strawberry.mutation(
        description="Renames an account. Needs UPDATE on financial.Account.document; a client "
        "of the default account renames any account (the default one too), another client its "
        "own alone (another is NOT_FOUND). Names need not be unique. CONFLICT when "
        "`expectedName` is given and the account is named otherwise now."
    )
    async def update_account(
        self,
        info: Info,
        account_id: THE_ACCOUNT,
        input: Annotated[AccountUpdateInput, strawberry.argument(description="The new name.")],
    ) -> Account:
        account = await service.update_account(
            info.context.pool,
            info.context.caller,
            account_id=account_id,
            name=input.name,
            expected_name=input.expected_name,
        )
        return Account.of(account)

    @strawberry.mutation(
        description="Deletes an account that holds nothing: no client, no agent (and so no "
        "memory record, session or execution). One that holds any is CONFLICT, counting what it "
        "holds by kind and saying what to delete first: its clients (deleteClient); an agent is "
        "never deleted, so an account that held one stays. The default account is never deleted "
        "(BAD_REQUEST). Only clients of the default account may, with DELETE on "
        "financial.Account.document. Answers the account as it was."
    )
    async def delete_account(self, info: Info, account_id: THE_ACCOUNT) -> Account:
        account = await service.delete_account(
            info.context.pool, info.context.caller, account_id=account_id
        )
        return Account.of(account)

    @strawberry.mutation(
        description="Creates a client with its policies; issue it a token with "
        "createClientToken. Needs INSERT on financial.Client.document, and every grant the "
        "policies allow (a client gives no grant it does not hold)."
    )
    async def create_client(
        self,
        info: Info,
        input: Annotated[ClientInput, strawberry.argument(description="The new client.")],
    ) -> Client:
        client = await service.create_client(
            info.context.pool,
            info.context.caller,
            account_id=input.account_id,
            principal=input.principal,
            name=input.name,
            policies=_policies(input.policies),
        )
        return Client.of(client)

    @strawberry.mutation(
        description="Changes a client's name or policies, all or nothing. Needs UPDATE on "
        "financial.Client.document, and every grant the client holds and the new policies "
        "allow; CONFLICT when `expectedModified` is given and the client changed since."
    )
    async def update_client(
        self,
        info: Info,
        principal: PRINCIPAL,
        input: Annotated[ClientUpdateInput, strawberry.argument(description="The changes.")],
        account_id: ACCOUNT_ID = None,
    ) -> Client:
        client = await service.update_client(
            info.context.pool,
            info.context.caller,
            account_id=account_id,
            principal=principal,
            name=input.name,
            policies=_policies(input.policies) if input.policies is not None else None,
            expected_modified=input.expected_modified,
        )
        return Client.of(client)

    @strawberry.mutation(
        description="Deletes a client and its tokens. Needs DELETE on financial.Client.document; "
        "CONFLICT when `expectedModified` is given and the client changed, or was deleted and "
        "created again, since."
    )
    async def delete_client(
        self,
        info: Info,
        principal: PRINCIPAL,
        account_id: ACCOUNT_ID = None,
        expected_modified: Annotated[
            Timestamp | None,
            strawberry.argument(
                description="The client's `modified` that the deletion was asked for: if it "
                "changed since (someone changed the client, or deleted it and created another "
                "with the same principal), the deletion is CONFLICT and nothing is deleted. A "
                "page passes the `modified` it showed; by default no check."
            ),
        ] = None,
    ) -> Client:
        client = await service.delete_client(
            info.context.pool,
            info.context.caller,
            account_id=account_id,
            principal=principal,
            expected_modified=expected_modified,
        )
        return Client.of(client)

    @strawberry.mutation(
        description="A new API token for the client, shown once; valid until `expires` "
        "(none: until revoked). Needs INSERT on financial.Client.token, and every grant the "
        "client holds."
    )
    async def create_client_token(
        self,
        info: Info,
        principal: PRINCIPAL,
        account_id: ACCOUNT_ID = None,
        expires: Annotated[
            Timestamp | None,
            strawberry.argument(description="When it stops working; by default never."),
        ] = None,
    ) -> ClientToken:
        issued = await service.issue_client_token(
            info.context.pool,
            info.context.caller,
            account_id=account_id,
            principal=principal,
            expires=expires,
        )
        return ClientToken(
            id=_token_id(issued.info.account_id, issued.info.principal, issued.info.token_id),
            account_id=issued.info.account_id,
            principal=principal,
            token=issued.token,
            token_id=issued.info.token_id,
            prefix=issued.info.prefix or "",
            created=Timestamp(issued.info.created),
            expires=_timestamp(issued.info.expires),
            issued_by=issued.info.issued_by,
            issued_by_account_id=issued.info.issued_by_account,
            issued_by_token_id=issued.info.issued_by_token,
        )

    @strawberry.mutation(
        description="Revokes one of the client's tokens: requests sending it are refused from "
        "now on. Needs DELETE on financial.Client.token."
    )
    async def revoke_client_token(
        self,
        info: Info,
        principal: PRINCIPAL,
        token_id: Annotated[
            UUID, strawberry.argument(description="The token's `tokenId` (Client.tokens).")
        ],
        account_id: ACCOUNT_ID = None,
    ) -> ClientTokenInfo:
        revoked = await service.revoke_client_token(
            info.context.pool,
            info.context.caller,
            account_id=account_id,
            principal=principal,
            token_id=token_id,
        )
        return ClientTokenInfo.of(revoked)

    @strawberry.mutation(
        description="Revokes the token `tokenId`, if it is still there, and every token whose "
        "issuers lead back to it: each token it issued (whose `issuedByTokenId` it is), each "
        "token those issued, and so on, all or none: requests sending any of them are refused "
        "from now on. After a leak, revoke the leaked token (revokeClientToken), then this with "
        "its ID, or this alone. Answers the tokens revoked, oldest first; none is an empty list, "
        "not NOT_FOUND: a revoked token leaves only its ID in those it issued, so an unknown ID "
        "cannot be told from one whose tokens are gone, and a call made again answers empty. A "
        "client of the default account reaches every account; another client its own account, "
        "through the tokens its account's clients issued. A token naming no issuing token "
        "(`issuedByTokenId` null: issued before issuers were recorded, or by the command line) "
        "is not reached. Needs DELETE on financial.Client.token."
    )
    async def revoke_tokens_issued_by(
        self,
        info: Info,
        token_id: ISSUING_TOKEN,
    ) -> list[ClientTokenInfo]:
        revoked = await service.revoke_tokens_issued_by(
            info.context.pool, info.context.caller, token_id=token_id
        )
        return [ClientTokenInfo.of(t) for t in revoked]
