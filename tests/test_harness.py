"""The agent's `harness`: every validation rule with its message, the defaults, and the labels
rule between versions (M8, M14, M21, M22, M23, M34, M35, M36, M39, M49; history H2, H3)."""

import pytest

from app.actions.harness import DEFAULT_KINDS, parse_harness
from app.errors import BadInput
from app.scope import Scope

CREATE = (
    "mutation($input: ActionInput!) { createAction(input: $input) { actionId version harness } }"
)
UPDATE = """
mutation($id: UUID!, $input: ActionInput!) {
  updateAction(actionId: $id, input: $input) { version harness }
}"""
ACTION = """
query($id: UUID!, $version: Int) { action(actionId: $id, version: $version) { version harness } }
"""

LABEL = {"number": 5, "description": "The customer the memory is about."}

# What a kind or label name may be, as a refusal says it.
NAME_RULE = "lower case letters, digits and _, starting with a letter, at most 63 characters"


def memory(**fields):
    return {"memory": fields}


def refused(harness, previous=None) -> str:
    with pytest.raises(BadInput) as e:
        parse_harness(harness, parse_harness(previous) if previous is not None else None)
    return e.value.message


# --- defaults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("harness", [None, {}, {"memory": {}}, {"memory": None}])
def test_defaults(harness):
    # M8 scopes default to ["session"]; M14 every turn; M21 hybrid; M22 5 results; M34 kinds.
    parsed = parse_harness(harness)
    assert parsed.memory.enabled is False
    assert parsed.history is None
    assert parsed.raw == {
        "memory": {
            "enabled": False,
            "scope": {"read": ["session"], "write": ["session"]},
            "extraction": {"every": "turn"},
            "search": {"mode": "hybrid", "max_results": 5},
            "tools": [],
            "kinds": ["guidance", "fact", "event", "reference"],
            "labels": {},
        }
    }
    assert parsed.memory.pinned_max_tokens is None  # M49 without `pinned`, nothing can be pinned
    assert parsed.memory.kinds == DEFAULT_KINDS


def test_m8_each_scope_list_defaults_on_its_own():
    parsed = parse_harness(memory(scope={"read": ["session", "agent"]}))
    assert parsed.memory.read == (Scope.SESSION, Scope.AGENT)
    assert parsed.memory.write == (Scope.SESSION,)
    parsed = parse_harness(memory(scope={"write": ["agent"]}))
    assert (parsed.memory.read, parsed.memory.write) == ((Scope.SESSION,), (Scope.AGENT,))


def test_a_full_harness_is_kept_as_given():
    harness = {
        "memory": {
            "enabled": True,
            "scope": {"read": ["session", "agent"], "write": ["agent"]},
            "extraction": {"prompt": "Keep customer preferences.", "every": {"messages": 4}},
            "search": {"mode": "lexical", "max_results": 12, "min_score": -0.25},
            "tools": ["add_memory", "delete_memory"],
            "pinned": {"max_tokens": 2000},
            "kinds": ["preference", "fact"],
            "labels": {
                "customer_id": LABEL,
                "order_id": {"number": 18, "description": "The order."},
            },
        },
        "history": {"index": "messages_and_tools"},
    }
    parsed = parse_harness(harness)
    assert parsed.raw == harness
    m = parsed.memory
    assert (
        m.enabled
        and m.extraction_every_messages == 4
        and m.extraction_prompt == "Keep customer preferences."
    )
    assert (m.search.mode, m.search.max_results, m.search.min_score) == ("lexical", 12, -0.25)
    assert m.tools == ("add_memory", "delete_memory") and m.pinned_max_tokens == 2000
    assert [(label.name, label.number) for label in m.labels] == [
        ("customer_id", 5),
        ("order_id", 18),
    ]
    assert parsed.history is not None and parsed.history.index == "messages_and_tools"
    # What is stored parses again to the same thing.
    assert parse_harness(parsed.raw) == parsed


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "vector"])
def test_m21_search_modes(mode):
    assert parse_harness(memory(search={"mode": mode})).memory.search.mode == mode


@pytest.mark.parametrize("score", [-1, -1.0, 0, 0.5, 1])
def test_m23_min_score_bounds_are_inclusive(score):
    assert parse_harness(memory(search={"min_score": score})).memory.search.min_score == score


def test_m14_every_turn_explicitly():
    assert (
        parse_harness(memory(extraction={"every": "turn"})).memory.extraction_every_messages is None
    )


@pytest.mark.parametrize("index", ["messages", "messages_and_tools"])
def test_history_index_values(index):
    # H2 / H3: the two things history may keep.
    parsed = parse_harness({"history": {"index": index}})
    assert parsed.history is not None and parsed.history.index == index
    assert parsed.raw["history"] == {"index": index}


def test_history_index_defaults_to_messages():
    parsed = parse_harness({"history": {}})
    assert parsed.history is not None and parsed.history.index == "messages"


@pytest.mark.parametrize("number", [5, 18])
def test_m35_label_numbers_5_and_18_are_allowed(number):
    parsed = parse_harness(memory(labels={"x": {"number": number, "description": "d"}}))
    assert parsed.memory.labels[0].number == number


# --- every rule with its message --------------------------------------------------------------

RULES = [
    # the harness itself
    ("top level not an object", ["memory"], "harness: must be an object"),
    (
        "top level unknown field",
        {"memroy": {}},
        "harness: unknown field 'memroy'; allowed: memory, history",
    ),
    ("memory not an object", {"memory": True}, "harness.memory: must be an object"),
    (
        "memory unknown field",
        memory(enable=True),
        "harness.memory: unknown field 'enable'; allowed: enabled, scope, extraction, search, "
        "tools, "
        "pinned, kinds, labels",
    ),
    (
        "enabled not a boolean",
        memory(enabled="yes"),
        "harness.memory.enabled: must be true or false",
    ),
    # scopes (M5, M8)
    ("scope not an object", memory(scope=["session"]), "harness.memory.scope: must be an object"),
    (
        "scope unknown field",
        memory(scope={"reads": []}),
        "harness.memory.scope: unknown field 'reads'; allowed: read, write",
    ),
    (
        "read not a list",
        memory(scope={"read": "session"}),
        "harness.memory.scope.read: must be a list of session / agent",
    ),
    (
        "read unknown scope",
        memory(scope={"read": ["global"]}),
        "harness.memory.scope.read: 'global' is not one of session, agent",
    ),
    (
        "write unknown scope",
        memory(scope={"write": ["org"]}),
        "harness.memory.scope.write: 'org' is not one of session, agent",
    ),
    (
        "read repeats",
        memory(scope={"read": ["agent", "agent"]}),
        "harness.memory.scope.read: must not repeat a value",
    ),
    (
        "read empty",
        memory(scope={"read": []}),
        "harness.memory.scope.read: must name at least one scope (session or agent)",
    ),
    (
        "write empty",
        memory(scope={"write": []}),
        "harness.memory.scope.write: must name at least one scope (session or agent)",
    ),
    # extraction (M13, M14)
    (
        "extraction not an object",
        memory(extraction="turn"),
        "harness.memory.extraction: must be an object",
    ),
    (
        "extraction unknown field",
        memory(extraction={"each": "turn"}),
        "harness.memory.extraction: unknown field 'each'; allowed: prompt, every",
    ),
    (
        "every unknown word",
        memory(extraction={"every": "session"}),
        'harness.memory.extraction.every: must be "turn" or {"messages": N}',
    ),
    (
        "every a bare number",
        memory(extraction={"every": 3}),
        'harness.memory.extraction.every: must be "turn" or {"messages": N}',
    ),
    (
        "every with another key",
        memory(extraction={"every": {"messages": 3, "turns": 1}}),
        'harness.memory.extraction.every: must be "turn" or {"messages": N}',
    ),
    (
        "every messages zero",
        memory(extraction={"every": {"messages": 0}}),
        "harness.memory.extraction.every.messages: must be an integer from 1 to 10000, got 0",
    ),
    (
        "every messages not an integer",
        memory(extraction={"every": {"messages": "3"}}),
        "harness.memory.extraction.every.messages: must be an integer from 1 to 10000, got '3'",
    ),
    (
        "every messages a boolean",
        memory(extraction={"every": {"messages": True}}),
        "harness.memory.extraction.every.messages: must be an integer from 1 to 10000, got True",
    ),
    (
        "prompt empty",
        memory(extraction={"prompt": "  "}),
        "harness.memory.extraction.prompt: must be a non-empty string",
    ),
    (
        "prompt not a string",
        memory(extraction={"prompt": 7}),
        "harness.memory.extraction.prompt: must be a non-empty string",
    ),
    # search (M21, M22, M23)
    ("search not an object", memory(search="hybrid"), "harness.memory.search: must be an object"),
    (
        "search unknown field",
        memory(search={"limit": 3}),
        "harness.memory.search: unknown field 'limit'; allowed: mode, max_results, min_score",
    ),
    (
        "mode unknown",
        memory(search={"mode": "semantic"}),
        "harness.memory.search.mode: must be one of hybrid, lexical, vector, got 'semantic'",
    ),
    (
        "max_results zero",
        memory(search={"max_results": 0}),
        "harness.memory.search.max_results: must be an integer from 1 to 100, got 0",
    ),
    (
        "max_results too many",
        memory(search={"max_results": 101}),
        "harness.memory.search.max_results: must be an integer from 1 to 100, got 101",
    ),
    (
        "max_results a float",
        memory(search={"max_results": 2.5}),
        "harness.memory.search.max_results: must be an integer from 1 to 100, got 2.5",
    ),
    (
        "min_score below -1",
        memory(search={"min_score": -1.01}),
        "harness.memory.search.min_score: must be a number from -1 to 1, got -1.01",
    ),
    (
        "min_score above 1",
        memory(search={"min_score": 1.5}),
        "harness.memory.search.min_score: must be a number from -1 to 1, got 1.5",
    ),
    (
        "min_score a string",
        memory(search={"min_score": "0.5"}),
        "harness.memory.search.min_score: must be a number from -1 to 1, got '0.5'",
    ),
    (
        "min_score a boolean",
        memory(search={"min_score": True}),
        "harness.memory.search.min_score: must be a number from -1 to 1, got True",
    ),
    # tools (M39)
    (
        "tools not a list",
        memory(tools="add_memory"),
        "harness.memory.tools: must be a list of add_memory / read_memory / delete_memory",
    ),
    (
        "tools outside the set",
        memory(tools=["add_memory", "search_memory"]),
        "harness.memory.tools: 'search_memory' is not one of "
        "add_memory, read_memory, delete_memory: search_memory is always offered when memory is "
        "enabled; leave it out",
    ),
    (
        "tools naming search_history",
        memory(tools=["search_history"]),
        "harness.memory.tools: 'search_history' is not one of "
        "add_memory, read_memory, delete_memory: search_history is offered with harness.history; "
        "leave it out",
    ),
    (
        "tools naming no tool",
        memory(tools=["programmatic_tool_caller"]),
        "harness.memory.tools: 'programmatic_tool_caller' is not one of "
        "add_memory, read_memory, delete_memory",
    ),
    (
        "tools repeat",
        memory(tools=["read_memory", "read_memory"]),
        "harness.memory.tools: must not repeat a value",
    ),
    # pinned (M49)
    ("pinned not an object", memory(pinned=2000), "harness.memory.pinned: must be an object"),
    (
        "pinned without max_tokens",
        memory(pinned={}),
        'harness.memory.pinned: needs max_tokens, e.g. {"max_tokens": 2000}',
    ),
    (
        "pinned unknown field",
        memory(pinned={"tokens": 5}),
        "harness.memory.pinned: unknown field 'tokens'; allowed: max_tokens",
    ),
    (
        "max_tokens zero",
        memory(pinned={"max_tokens": 0}),
        "harness.memory.pinned.max_tokens: must be an integer from 1 to 100000, got 0",
    ),
    (
        "max_tokens a string",
        memory(pinned={"max_tokens": "2000"}),
        "harness.memory.pinned.max_tokens: must be an integer from 1 to 100000, got '2000'",
    ),
    # kinds (M34)
    (
        "kinds empty",
        memory(kinds=[]),
        "harness.memory.kinds: must be a non-empty list of kind names",
    ),
    (
        "kinds not a list",
        memory(kinds="fact"),
        "harness.memory.kinds: must be a non-empty list of kind names",
    ),
    (
        "kinds not strings",
        memory(kinds=["fact", 3]),
        "harness.memory.kinds: must be a non-empty list of kind names",
    ),
    (
        "kind upper case",
        memory(kinds=["Fact"]),
        f"harness.memory.kinds: 'Fact' must be {NAME_RULE}",
    ),
    (
        "kind with a space",
        memory(kinds=["a fact"]),
        f"harness.memory.kinds: 'a fact' must be {NAME_RULE}",
    ),
    # Lower case letters and digits, yet refused: the message says why (it said only "lower
    # case letters, digits and _", which they are).
    (
        "kind starting with a digit",
        memory(kinds=["2fa"]),
        f"harness.memory.kinds: '2fa' must be {NAME_RULE}",
    ),
    (
        "kind of 64 characters",
        memory(kinds=["k" * 64]),
        f"harness.memory.kinds: '{'k' * 64}' must be {NAME_RULE}",
    ),
    (
        "kinds repeat",
        memory(kinds=["fact", "fact"]),
        "harness.memory.kinds: must not repeat a kind",
    ),
    # labels (M35)
    ("labels a list", memory(labels=[LABEL]), "harness.memory.labels: must be an object"),
    (
        "label bad name",
        memory(labels={"Customer": LABEL}),
        f"harness.memory.labels.Customer: label names are {NAME_RULE}",
    ),
    (
        "label not an object",
        memory(labels={"customer_id": 5}),
        "harness.memory.labels.customer_id: must be an object",
    ),
    (
        "label without number",
        memory(labels={"customer_id": {"description": "d"}}),
        "harness.memory.labels.customer_id: needs a number from 5 to 18",
    ),
    (
        "label number 4",
        memory(labels={"customer_id": {"number": 4, "description": "d"}}),
        "harness.memory.labels.customer_id.number: must be an integer from 5 to 18, got 4",
    ),
    (
        "label number 19",
        memory(labels={"customer_id": {"number": 19, "description": "d"}}),
        "harness.memory.labels.customer_id.number: must be an integer from 5 to 18, got 19",
    ),
    (
        "label number a string",
        memory(labels={"customer_id": {"number": "5", "description": "d"}}),
        "harness.memory.labels.customer_id.number: must be an integer from 5 to 18, got '5'",
    ),
    (
        "label without description",
        memory(labels={"customer_id": {"number": 5}}),
        "harness.memory.labels.customer_id: needs a description the agent reads",
    ),
    (
        "label blank description",
        memory(labels={"customer_id": {"number": 5, "description": "   "}}),
        "harness.memory.labels.customer_id: needs a description the agent reads",
    ),
    (
        "label unknown field",
        memory(labels={"customer_id": {**LABEL, "type": "string"}}),
        "harness.memory.labels.customer_id: unknown field 'type'; allowed: number, description",
    ),
    (
        "label numbers repeat",
        memory(labels={"customer_id": LABEL, "account_id": {"number": 5, "description": "d"}}),
        "harness.memory.labels.account_id: number 5 is already used by label 'customer_id'",
    ),
    # history (H2, H3)
    ("history not an object", {"history": "messages"}, "harness.history: must be an object"),
    (
        "history unknown field",
        {"history": {"keep": "all"}},
        "harness.history: unknown field 'keep'; allowed: index",
    ),
    (
        "history index unknown",
        {"history": {"index": "everything"}},
        "harness.history.index: must be one of messages, messages_and_tools, got 'everything'",
    ),
]


@pytest.mark.parametrize(("harness", "message"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_rule(harness, message):
    assert refused(harness) == message


# --- labels across versions (M36) -------------------------------------------------------------


def test_m36_a_later_version_keeps_a_label_and_may_add_labels():
    previous = memory(labels={"customer_id": LABEL})
    later = parse_harness(
        memory(
            labels={
                "customer_id": {"number": 5, "description": "Reworded."},
                "order_id": {"number": 6, "description": "d"},
            }
        ),
        parse_harness(previous),
    )
    assert [(label.name, label.number) for label in later.memory.labels] == [
        ("customer_id", 5),
        ("order_id", 6),
    ]


def test_m36_dropping_a_label_is_refused():
    assert refused(memory(), memory(labels={"customer_id": LABEL})) == (
        "harness.memory.labels.customer_id: an earlier version declares this label (number 5); "
        "later versions must keep it with the same number"
    )


def test_m36_renumbering_a_label_is_refused():
    assert refused(
        memory(labels={"customer_id": {"number": 7, "description": "d"}}),
        memory(labels={"customer_id": LABEL}),
    ) == (
        "harness.memory.labels.customer_id.number: "
        "an earlier version declares this label with number 5; "
        "it cannot change to 7"
    )


def test_m36_a_new_label_cannot_take_a_kept_labels_number():
    message = refused(
        memory(labels={"customer_id": LABEL, "other": {"number": 5, "description": "d"}}),
        memory(labels={"customer_id": LABEL}),
    )
    assert message == "harness.memory.labels.other: number 5 is already used by label 'customer_id'"


# --- through GraphQL --------------------------------------------------------------------------


async def test_graphql_invalid_harness_is_bad_request(gql, admin):
    result = await gql(
        admin, CREATE, input={"name": "a", "harness": memory(search={"mode": "fuzzy"})}
    )
    assert result.codes == ["BAD_REQUEST"] and result.data is None
    assert result.errors[0]["message"] == (
        "harness.memory.search.mode: must be one of hybrid, lexical, vector, got 'fuzzy'"
    )


async def test_graphql_harness_defaults_are_returned(gql, admin):
    created = (
        await gql(admin, CREATE, input={"name": "a", "harness": {"memory": {"enabled": True}}})
    ).ok()
    harness = created["createAction"]["harness"]
    assert harness["memory"]["enabled"] is True
    assert harness["memory"]["scope"] == {"read": ["session"], "write": ["session"]}
    assert harness["memory"]["search"] == {"mode": "hybrid", "max_results": 5}
    assert harness["memory"]["kinds"] == ["guidance", "fact", "event", "reference"]
    assert "history" not in harness


async def test_graphql_harness_literal_in_the_query(gql, admin):
    """A harness written inline (not as a variable) is parsed the same way."""
    result = await gql(
        admin,
        'mutation { createAction(input: {name: "a", harness: {memory: {enabled: true, '
        'tools: ["add_memory"], labels: {customer_id: {number: 5, description: "The customer."}}}, '
        'history: {index: "messages"}}}) '
        "{ harness } }",
    )
    harness = result.ok()["createAction"]["harness"]
    assert harness["memory"]["tools"] == ["add_memory"]
    assert harness["memory"]["labels"] == {
        "customer_id": {"number": 5, "description": "The customer."}
    }
    assert harness["history"] == {"index": "messages"}


async def test_m36_graphql_labels_kept_across_versions(gql, admin):
    v1 = (
        await gql(
            admin, CREATE, input={"name": "a", "harness": memory(labels={"customer_id": LABEL})}
        )
    ).ok()
    action_id = v1["createAction"]["actionId"]

    dropped = await gql(admin, UPDATE, id=action_id, input={"name": "a", "harness": memory()})
    assert dropped.codes == ["BAD_REQUEST"]
    assert "an earlier version declares this label (number 5)" in dropped.errors[0]["message"]

    moved = await gql(
        admin,
        UPDATE,
        id=action_id,
        input={"name": "a", "harness": memory(labels={"customer_id": {**LABEL, "number": 9}})},
    )
    assert moved.codes == ["BAD_REQUEST"]
    assert "it cannot change to 9" in moved.errors[0]["message"]

    # Refused updates wrote no version.
    assert (await gql(admin, ACTION, id=action_id)).ok()["action"]["version"] == 1

    added = {"customer_id": LABEL, "ticket_id": {"number": 12, "description": "The ticket."}}
    v2 = (
        await gql(admin, UPDATE, id=action_id, input={"name": "a", "harness": memory(labels=added)})
    ).ok()
    assert v2["updateAction"]["version"] == 2
    assert v2["updateAction"]["harness"]["memory"]["labels"] == added

    # Version 3 must keep what version 2 added, too.
    only_first = await gql(
        admin,
        UPDATE,
        id=action_id,
        input={"name": "a", "harness": memory(labels={"customer_id": LABEL})},
    )
    assert only_first.codes == ["BAD_REQUEST"]
    assert "harness.memory.labels.ticket_id" in only_first.errors[0]["message"]

    v1_read = (await gql(admin, ACTION, id=action_id, version=1)).ok()["action"]
    assert v1_read["harness"]["memory"]["labels"] == {"customer_id": LABEL}
