"""The native tools' arguments: every refusal the model reads, in words it can act on, before
anything runs (M47; the tools of M38, M40, M43, M44; M41, M49). Each refused call is a tool
result, and the turn goes on; what a valid call does is tested through turns elsewhere."""

import json
from uuid import uuid4

import pytest

from app.actions.harness import parse_harness
from app.runtime.model import ToolCall
from app.runtime.tools import NativeTools, tool_schemas
from app.runtime.transcript import Transcript

LABEL = {"number": 5, "description": "The customer the memory is about."}


def tools(**memory) -> NativeTools:
    harness = {"memory": {"enabled": True, "kinds": ["fact", "preference"], **memory}}
    return NativeTools(None, parse_harness(harness).memory, Transcript(1), "static")


ALL = {"tools": ["add_memory", "read_memory", "delete_memory"]}
SESSION_ONLY = tools(**ALL)
EVERYTHING = tools(
    **ALL,
    scope={"read": ["session", "agent"], "write": ["session", "agent"]},
    pinned={"max_tokens": 100},
    labels={"customer_id": LABEL},
)

REFUSALS = [
    ("search_memory", {"query": 3}, "query must be a string, got 3"),
    ("search_memory", {"after": ["c"]}, "after must be a string, got ['c']"),
    ("search_memory", {"limit": 0}, "limit must be an integer from 1 to 100"),
    ("search_memory", {"limit": True}, "limit must be an integer from 1 to 100"),
    ("search_memory", {"limit": None}, "limit must be an integer from 1 to 100"),
    ("search_memory", {"ids": "x"}, "ids must be a list of at most 100 record IDs"),
    (
        "search_memory",
        {"ids": [str(uuid4())] * 101},
        "ids must be a list of at most 100 record IDs",
    ),
    (
        "search_memory",
        {"ids": ["nope"]},
        "ids[] must be a record ID (a UUID such as 3f2a...), got 'nope'",
    ),
    ("search_memory", {"kind": "event"}, "kind 'event' is not one of your kinds: fact, preference"),
    (
        "search_memory",
        {"labels": ["c-1"]},
        'labels must be an object keyed by label name, e.g. {"customer_id": "c-1"}',
    ),
    (
        "search_memory",
        {"labels": {"customer_id": True}},
        "label 'customer_id' must be an exact string value",
    ),
    # The one label resolver's words (MemoryConfig.resolve_label), as a client reads them too.
    (
        "search_memory",
        {"labels": {"region": "eu"}},
        "label 'region' is not declared by this agent; its labels are: customer_id (number 5)",
    ),
    (
        "search_memory",
        {"scope": "AGENT"},
        "unknown parameter 'scope'; the parameters are: query, kind, labels, ids, limit, after",
    ),
    ("add_memory", {"kind": "fact"}, "summary is required"),
    ("add_memory", {"summary": "", "kind": "fact"}, "summary is required"),
    ("add_memory", {"summary": "s"}, "kind is required"),
    (
        "add_memory",
        {"summary": "s", "kind": "fact", "content": 1},
        "content must be a string, got 1",
    ),
    ("add_memory", {"summary": "s", "kind": 3}, "kind must be a string, got 3"),
    ("add_memory", {"summary": "s", "kind": "fact", "scope": 1}, "scope must be a string, got 1"),
    (
        "add_memory",
        {"summary": "s", "kind": "fact", "scope": "global"},
        "scope must be one of SESSION, AGENT",
    ),
    (
        "add_memory",
        {"summary": "s", "kind": "fact", "pinned": "yes"},
        "pinned must be true or false",
    ),
    (
        "add_memory",
        {"summary": "s", "kind": "fact", "pinned": None},
        "pinned must be true or false",
    ),
    (
        "add_memory",
        {"summary": "s", "kind": "fact", "replaces": 7},
        "replaces must be a record ID (a UUID such as 3f2a...), got 7",
    ),
    ("read_memory", {}, "id is required"),
    ("read_memory", {"id": "x"}, "id must be a record ID (a UUID such as 3f2a...), got 'x'"),
    ("delete_memory", {"id": [1]}, "id must be a record ID (a UUID such as 3f2a...), got [1]"),
    (
        "read_memory",
        {"id": str(uuid4()), "why": 1},
        "unknown parameter 'why'; the parameters are: id",
    ),
]


@pytest.mark.parametrize(("tool", "args", "message"), REFUSALS)
async def test_a_malformed_argument_is_refused_with_what_is_expected(tool, args, message):
    answer = await EVERYTHING.call(ToolCall("c1", tool, json.dumps(args)))
    assert json.loads(answer.content) == {"error": message}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # M41 scope is offered only when scope.write includes agent.
        ({"scope": "AGENT"}, "scope is not available: this agent writes only session scope"),
        # M49 without `pinned`, nothing can be pinned.
        ({"pinned": True}, "pinning is not available: harness.memory.pinned is not configured"),
    ],
)
async def test_m41_m49_an_argument_the_configuration_withholds_says_why(args, message):
    call = ToolCall("c1", "add_memory", json.dumps({"summary": "s", "kind": "fact", **args}))
    answer = await SESSION_ONLY.call(call)
    assert json.loads(answer.content)["error"].startswith(message)


def test_m41_the_schemas_offer_what_the_configuration_allows():
    offered = tool_schemas(EVERYTHING.memory)
    add = offered["add_memory"]["function"]["parameters"]
    assert add["required"] == ["summary", "kind"] and add["additionalProperties"] is False
    assert add["properties"]["scope"]["enum"] == ["SESSION", "AGENT"]
    assert "about 100 tokens" in add["properties"]["pinned"]["description"]
    search = offered["search_memory"]["function"]["parameters"]["properties"]
    assert search["limit"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 100,
        "description": "How many records (default 5).",
    }
    assert search["kind"]["enum"] == ["fact", "preference"]
    plain = tool_schemas(SESSION_ONLY.memory)["add_memory"]["function"]["parameters"]
    assert {"scope", "pinned", "labels"}.isdisjoint(plain["properties"])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"query": "x", "limit": NaN}', "NaN is not a JSON value"),
        ('{"query": "x", "limit": -Infinity}', "-Infinity is not a JSON value"),
        ('{"query": "x", "limit": 1e400}', "1e400 is beyond what a number can hold"),
        ('{"query": "x", "limit": 1%s}' % ("0" * 4300), "Exceeds the limit (4300 digits)"),
    ],
)
async def test_numbers_no_json_column_holds_are_refused_as_not_json(raw, message):
    """What Python's JSON would read (NaN, Infinity, 1e400 as inf) but no JSON column stores
    is the call's refusal, not a transcript the turn then cannot write."""
    answer = await EVERYTHING.call(ToolCall("c1", "search_memory", raw))
    error = json.loads(answer.content)["error"]
    assert error.startswith("the arguments are not valid JSON (") and message in error, error


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 5_000 + "]" * 5_000,  # deeper than Python's parser goes
        '{"query": ' * 900 + '"x"' + "}" * 900,  # read, but deeper than a walk of it goes
        '{"query": "x", "labels": ' + "[" * 32 + "]" * 32 + "}",
    ],
)
async def test_arguments_nested_too_deep_are_refused_for_the_model_to_read(raw):
    answer = await EVERYTHING.call(ToolCall("c1", "search_memory", raw))
    assert json.loads(answer.content) == {
        "error": "the arguments are not valid JSON for a tool: they nest deeper than 32 levels; "
        "send one JSON object"
    }


@pytest.mark.parametrize(
    ("tool", "args", "quoted"),
    [
        ("read_memory", {"id": "x" * 100_000}, "got 'xxxx"),
        ("search_memory", {"ids": ["y" * 100_000]}, "got 'yyyy"),
        ("search_memory", {"kind": "k" * 100_000}, "kind 'kkkk"),
        ("search_memory", {"labels": {"l" * 100_000: "v"}}, "label 'llll"),
        ("search_memory", {"labels": {"customer_id": "v", "m" * 100_000: None}}, "label 'mmmm"),
        ("read_memory", {"i" * 100_000: 1}, "unknown parameter 'iiii"),
        ("n" * 100_000, {}, "there is no tool named 'nnnn"),
    ],
    ids=["id", "ids", "kind", "label", "label-value", "parameter", "tool"],
)
async def test_a_refusal_quotes_only_the_start_of_a_long_value(tool, args, quoted):
    """A refusal repeated the value it refused whole: 100,000 characters sent back to the model,
    stored in the transcript and read again with every later call of the turn."""
    answer = await EVERYTHING.call(ToolCall("c1", tool, json.dumps(args)))
    error = json.loads(answer.content)["error"]
    assert quoted in error and "…" in error
    assert len(error) < 400, len(error)
