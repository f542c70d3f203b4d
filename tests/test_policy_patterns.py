"""Policy patterns match in bounded time, resolve against the known resources once, and a
client cannot write one that names nothing (issue 11, item 1: ReDoS by a tenant's DENY)."""

import json
import logging
import subprocess
import sys
import textwrap

import pytest
from factories import allow, deny, make_account

from app.auth import policies as policy_module
from app.auth import service
from app.auth.policies import glob_match, is_allowed, parse_policies, resolve
from app.auth.resources import KNOWN, MEMORY_DOCUMENT

# Backtracking regexes take time exponential in the `*?` pairs: 21 characters stalled the
# process for 4.5 s, tripling with each pair. 41 characters would take years.
HOSTILE = "*?" * 20 + "Z"
CREATE_CLIENT = """
mutation($input: ClientInput!) { createClient(input: $input) { principal } }"""
UPDATE_CLIENT = """
mutation($p: [PolicyInput!]) { updateClient(principal: "p", input: {policies: $p}) { principal } }
"""


def test_hostile_pattern_is_parsed_and_checked_in_bounded_time():
    # In a child process with a timeout: a backtracking matcher never finishes, and the test
    # fails instead of hanging the suite.
    script = textwrap.dedent(
        f"""
        from app.auth.policies import is_allowed, parse_policies
        from app.auth.resources import KNOWN
        p = parse_policies([
            {{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["*"]}},
            {{"effect": "DENY", "actions": ["SELECT"], "resources": [{HOSTILE!r}]}},
        ])
        for name in sorted(KNOWN) + ["financial.Unknown." + "x" * 2000]:
            assert is_allowed(p, "SELECT", name), name
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_pattern_resolves_to_the_set_of_known_resources_it_matches():
    (policy,) = parse_policies([allow(["SELECT"], "financial.AgentMemory.indexes.*")])
    assert policy.matched == {
        "financial.AgentMemory.indexes.created",
        "financial.AgentMemory.indexes.search",
    }
    assert resolve(HOSTILE) == frozenset()
    assert resolve("*") == KNOWN
    # No regular expression is compiled for a pattern: the module no longer has that cache.
    assert not hasattr(policy_module, "_pattern")


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("*", "", True),
        ("", "", True),
        ("?", "", False),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "aXbYcd", False),
        ("*a", "bbba", True),
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("**", "anything", True),
        (HOSTILE, "x" * 500 + "Z", True),
        (HOSTILE, "x" * 5000, False),
    ],
)
def test_glob_match(pattern, name, expected):
    assert glob_match(pattern, name) is expected


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (["financial.agentmemory.*"], "'financial.agentmemory.*' matches no known resource"),
        ([HOSTILE], "matches no known resource"),
        (["financial.Action.document", "a" * 201], "a pattern is at most 200 characters"),
    ],
)
async def test_create_and_update_refuse_patterns_that_name_nothing(gql, admin, resources, message):
    policy = {"effect": "DENY", "actions": ["SELECT"], "resources": resources}
    created = await gql(
        admin, CREATE_CLIENT, input={"principal": "p", "name": "P", "policies": [policy]}
    )
    assert created.codes == ["BAD_REQUEST"]
    assert message in created.errors[0]["message"]
    if "matches no known resource" in message:
        # The message lists what can be named, so the caller can fix the typo.
        assert MEMORY_DOCUMENT in created.errors[0]["message"]
    ok = {"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.Action.*"]}
    (await gql(admin, CREATE_CLIENT, input={"principal": "p", "name": "P", "policies": [ok]})).ok()
    updated = await gql(admin, UPDATE_CLIENT, p=[policy])
    assert updated.codes == ["BAD_REQUEST"]
    assert message in updated.errors[0]["message"]


async def test_stored_policies_naming_nothing_load_with_one_warning(gql, state, admin, caplog):
    account = await make_account(state)
    ok = allow(["SELECT"], "financial.Action.*")
    await service.create_client(
        state.pool, admin, account_id=account, principal="old", name="Old", policies=[ok]
    )
    # Written before the check existed: a typo and the hostile DENY.
    stored = [ok, deny(["SELECT"], "financial.action.*"), deny(["SELECT"], HOSTILE)]
    async with state.pool.acquire() as conn:
        await conn.execute(
            "UPDATE clients SET policies = $2 WHERE account_id = $1 AND principal = 'old'",
            account,
            stored,
        )
    token = await service.create_client_token(
        state.pool, admin, account_id=account, principal="old"
    )
    policy_module.forget_warnings()
    caplog.clear()  # (issuing the token read the stored policies, and warned, too)
    with caplog.at_level(logging.WARNING, logger="app.auth.policies"):
        for _ in range(3):
            me = await service.authenticate(state.pool, f"Bearer {token}")
            assert is_allowed(me.policies, "SELECT", "financial.Action.document")
    warnings = [r.getMessage() for r in caplog.records if r.name == "app.auth.policies"]
    assert len(warnings) == 2  # one per pattern, not one per request
    assert "'financial.action.*'" in warnings[0]


def test_forgetting_the_warnings_warns_once_more_as_a_restart_does(caplog):
    stored = json.dumps([deny(["SELECT"], "financial.nothing.*")])
    parse_policies(json.loads(stored))  # the process has read these policies before
    policy_module.forget_warnings()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.auth.policies"):
        parse_policies(json.loads(stored))
    warnings = [r.getMessage() for r in caplog.records if r.name == "app.auth.policies"]
    assert len(warnings) == 1 and "'financial.nothing.*'" in warnings[0]
