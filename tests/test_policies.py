"""Policies: at least one ALLOW is needed, any matching DENY wins, `*` and `?` wildcards.

The unit tests drive app.auth.policies directly; the GraphQL tests show the same rules deciding
real operations, for callers built from policies and for clients created through the API.
"""

import pytest
from factories import allow, caller, deny, make_account

from app.auth import service
from app.auth.policies import ADMIN_POLICIES, is_allowed, parse_policies, require
from app.errors import AccessDenied, BadInput

CREATE_ACTION = 'mutation { createAction(input: {name: "a"}) { actionId version } }'
READ_ACTION = "query($id: UUID!) { action(actionId: $id) { name } }"
CREATE_CLIENT = """
mutation($input: ClientInput!) {
  createClient(input: $input) { principal policies { effect actions resources } }
}
"""


def policies(*raw):
    return parse_policies(raw)


# --- unit: the decision ---------------------------------------------------------------------


def test_no_policies_allow_nothing():
    assert not is_allowed((), "SELECT", "financial.Action.document")


def test_allow_needed_for_the_verb_and_the_resource():
    p = policies(allow(["SELECT"], "financial.Action.document"))
    assert is_allowed(p, "SELECT", "financial.Action.document")
    assert not is_allowed(p, "UPDATE", "financial.Action.document")
    assert not is_allowed(p, "SELECT", "financial.Action.indexes.created")
    assert not is_allowed(p, "SELECT", "financial.AgentMemory.document")


def test_a_deny_alone_allows_nothing():
    p = policies(deny(["SELECT"], "financial.Other.document"))
    assert not is_allowed(p, "SELECT", "financial.Action.document")


def test_matching_deny_wins_over_allow_in_any_order():
    for ordered in (
        policies(allow(["SELECT", "UPDATE"], "*"), deny(["UPDATE"], "financial.Action.*")),
        policies(deny(["UPDATE"], "financial.Action.*"), allow(["SELECT", "UPDATE"], "*")),
    ):
        assert is_allowed(ordered, "SELECT", "financial.Action.document")
        assert not is_allowed(ordered, "UPDATE", "financial.Action.document")
        # The DENY names Action only: UPDATE elsewhere stays allowed.
        assert is_allowed(ordered, "UPDATE", "financial.Client.document")


def test_deny_that_does_not_match_changes_nothing():
    p = policies(allow(["SELECT"], "financial.*"), deny(["DELETE"], "financial.*"))
    assert is_allowed(p, "SELECT", "financial.AgentMemory.document")


def test_star_matches_any_run_of_characters_dots_included():
    p = policies(allow(["SELECT"], "financial.AgentMemory.indexes.*"))
    assert is_allowed(p, "SELECT", "financial.AgentMemory.indexes.created")
    assert is_allowed(p, "SELECT", "financial.AgentMemory.indexes.search")
    assert is_allowed(p, "SELECT", "financial.AgentMemory.indexes.a.b")
    assert not is_allowed(p, "SELECT", "financial.AgentMemory.document")
    # The dot before `*` is literal, and the pattern must match the whole name.
    assert not is_allowed(p, "SELECT", "financial.AgentMemory.indexes")
    assert not is_allowed(p, "SELECT", "xfinancial.AgentMemory.indexes.created")


def test_star_in_the_middle():
    p = policies(allow(["SELECT"], "financial.*.document"))
    assert is_allowed(p, "SELECT", "financial.Action.document")
    assert is_allowed(p, "SELECT", "financial.AgentMemory.document")
    assert not is_allowed(p, "SELECT", "financial.Action.indexes.created")


def test_question_mark_matches_exactly_one_character():
    p = policies(allow(["SELECT"], "financial.Action.docu?ent"))
    assert is_allowed(p, "SELECT", "financial.Action.document")
    assert is_allowed(p, "SELECT", "financial.Action.docuXent")
    assert not is_allowed(p, "SELECT", "financial.Action.docuent")
    assert not is_allowed(p, "SELECT", "financial.Action.docuXXent")


def test_dot_is_not_a_wildcard():
    p = policies(allow(["SELECT"], "financial.Action.document"))
    assert not is_allowed(p, "SELECT", "financialXAction.document")


def test_resources_are_case_sensitive():
    p = policies(allow(["SELECT"], "financial.Action.document"))
    assert not is_allowed(p, "SELECT", "financial.action.document")


def test_admin_policies_allow_every_verb_on_everything():
    for verb in ("SELECT", "INSERT", "UPDATE", "DELETE"):
        assert is_allowed(ADMIN_POLICIES, verb, "financial.Anything.at.all")


def test_require_names_the_first_missing_grant():
    p = policies(allow(["SELECT"], "financial.Action.document"))
    require(p, ("SELECT", "financial.Action.document"))
    with pytest.raises(AccessDenied) as e:
        require(p, ("SELECT", "financial.Action.document"), ("UPDATE", "financial.Action.document"))
    assert "UPDATE financial.Action.document" in e.value.message


# --- unit: bad policy input -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"effect": "MAYBE", "actions": ["SELECT"], "resources": ["x"]},
            "policies[0].effect must be ALLOW or DENY, got 'MAYBE'",
        ),
        (
            {"actions": ["SELECT"], "resources": ["x"]},
            "policies[0].effect must be ALLOW or DENY, got None",
        ),
        (
            {"effect": "ALLOW", "actions": [], "resources": ["x"]},
            "policies[0].actions must be a list naming at least one of "
            "SELECT, INSERT, UPDATE, DELETE",
        ),
        (
            {"effect": "ALLOW", "actions": "SELECT", "resources": ["x"]},
            "policies[0].actions must be a list",
        ),
        (
            {"effect": "ALLOW", "actions": ["READ"], "resources": ["x"]},
            "policies[0].actions: 'READ' is not one of SELECT, INSERT, UPDATE, DELETE",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": []},
            "policies[0].resources must be a list naming at least one resource",
        ),
        (
            # A bare string must not be read as a list of one-letter resources.
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": "financial.*"},
            "policies[0].resources must be a list",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial Action"]},
            "policies[0].resources: 'financial Action' is not a resource name",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": [""]},
            "policies[0].resources: '' is not a resource name",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": [7]},
            "policies[0].resources: 7 is not a resource name",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resource": ["x"]},
            "policies[0]: unknown field 'resource'; allowed: effect, actions, resources",
        ),
        ("ALLOW *", "policies[0] must be an object"),
    ],
)
def test_bad_policies_are_refused_with_the_reason(raw, message):
    with pytest.raises(BadInput) as e:
        parse_policies([raw])
    assert message in e.value.message


def test_the_message_names_the_index_of_the_bad_policy():
    with pytest.raises(BadInput) as e:
        parse_policies(
            [allow(["SELECT"], "x"), {"effect": "DENY", "actions": ["X"], "resources": ["y"]}]
        )
    assert e.value.message.startswith("policies[1].actions")


# --- through GraphQL ------------------------------------------------------------------------


async def test_graphql_no_allow_means_access_denied(gql, state):
    account = await make_account(state)
    result = await gql(caller(account), CREATE_ACTION)
    assert result.codes == ["ACCESS_DENIED"]
    assert result.data is None
    assert "INSERT financial.Action.document" in result.errors[0]["message"]


async def test_graphql_question_mark_grant_allows(gql, state):
    account = await make_account(state)
    client = caller(account, allow(["INSERT", "SELECT"], "financial.Action.docu?ent"))
    created = (await gql(client, CREATE_ACTION)).ok()["createAction"]
    read = await gql(client, READ_ACTION, id=created["actionId"])
    assert read.ok()["action"] == {"name": "a"}


async def test_graphql_deny_wins_over_star_allow(gql, state):
    account = await make_account(state)
    client = caller(
        account,
        allow(["SELECT", "INSERT", "UPDATE", "DELETE"], "*"),
        deny(["SELECT"], "financial.Action.*"),
    )
    created = (await gql(client, CREATE_ACTION)).ok()["createAction"]
    read = await gql(client, READ_ACTION, id=created["actionId"])
    assert read.codes == ["ACCESS_DENIED"]
    assert read.data is None


async def test_graphql_star_grant_on_indexes(gql, state, admin):
    account = await make_account(state)
    writer = caller(account, allow(["INSERT"], "financial.Action.document"))
    (await gql(writer, CREATE_ACTION)).ok()
    listing = "{ actions(first: 10) { nodes { name } } }"
    only_document = caller(account, allow(["SELECT"], "financial.Action.document"))
    assert (await gql(only_document, listing)).codes == ["ACCESS_DENIED"]
    with_indexes = caller(
        account, allow(["SELECT"], "financial.Action.indexes.*", "financial.Action.document")
    )
    assert (await gql(with_indexes, listing)).ok()["actions"]["nodes"] == [{"name": "a"}]


async def test_policies_of_a_created_client_decide_its_requests(gql, state, admin):
    """A client's stored policies are what its token authenticates with."""
    created = await gql(
        admin,
        CREATE_CLIENT,
        input={
            "principal": "reader",
            "name": "Reader",
            "policies": [
                {
                    "effect": "ALLOW",
                    "actions": ["SELECT", "INSERT"],
                    "resources": ["financial.Action.*"],
                },
                {
                    "effect": "DENY",
                    "actions": ["INSERT"],
                    "resources": ["financial.Action.docu?ent"],
                },
            ],
        },
    )
    assert created.ok()["createClient"]["policies"] == [
        {"effect": "ALLOW", "actions": ["SELECT", "INSERT"], "resources": ["financial.Action.*"]},
        {"effect": "DENY", "actions": ["INSERT"], "resources": ["financial.Action.docu?ent"]},
    ]
    token = await service.create_client_token(
        state.pool, admin, account_id=None, principal="reader"
    )
    reader = await service.authenticate(state.pool, f"Bearer {token}")
    assert (await gql(reader, CREATE_ACTION)).codes == ["ACCESS_DENIED"]
    action = (await gql(admin, CREATE_ACTION)).ok()["createAction"]
    assert (await gql(reader, READ_ACTION, id=action["actionId"])).ok()["action"] == {"name": "a"}


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"effect": "ALLOW", "actions": [], "resources": ["x"]},
            "policies[0].actions must be a list naming at least one of",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": []},
            "policies[0].resources must be a list naming at least one resource",
        ),
        (
            {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action/*"]},
            "policies[0].resources: 'financial.Action/*' is not a resource name",
        ),
    ],
)
async def test_graphql_bad_policy_is_bad_request(gql, admin, policy, message):
    result = await gql(
        admin, CREATE_CLIENT, input={"principal": "p", "name": "P", "policies": [policy]}
    )
    assert result.codes == ["BAD_REQUEST"]
    assert message in result.errors[0]["message"]


@pytest.mark.parametrize(
    ("policy", "fragment"),
    [
        ({"effect": "PERMIT", "actions": ["SELECT"], "resources": ["x"]}, "PERMIT"),
        ({"effect": "ALLOW", "actions": ["READ"], "resources": ["x"]}, "READ"),
        ({"effect": "ALLOW", "actions": ["SELECT"], "resources": ["x"], "extra": 1}, "extra"),
    ],
)
async def test_graphql_enum_and_shape_errors_are_bad_request(gql, admin, policy, fragment):
    result = await gql(
        admin, CREATE_CLIENT, input={"principal": "p", "name": "P", "policies": [policy]}
    )
    assert result.codes == ["BAD_REQUEST"]
    assert fragment in result.errors[0]["message"]


async def test_graphql_update_client_validates_policies(gql, admin):
    (await gql(admin, CREATE_CLIENT, input={"principal": "p", "name": "P", "policies": []})).ok()
    result = await gql(
        admin,
        """mutation($p: [PolicyInput!]) {
             updateClient(principal: "p", input: {policies: $p}) { principal }
           }""",
        p=[{"effect": "DENY", "actions": ["DELETE"], "resources": ["bad resource"]}],
    )
    assert result.codes == ["BAD_REQUEST"]
    assert (
        "policies[0].resources: 'bad resource' is not a resource name"
        in result.errors[0]["message"]
    )
