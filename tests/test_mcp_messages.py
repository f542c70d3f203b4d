"""app/mcp/messages.py words the MCP endpoint's refusals from what a client sent: any JSON value
as a message, any method and parameters, any protocol version. Each function answers every one
in words, never with an exception (which the SDK would answer in the exception's own text) and
never with pydantic's."""

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp_types import jsonrpc_message_adapter
from mcp_types import methods as mcp_methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from app.mcp import messages

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    | st.text(max_size=20)
    | st.just("2.0")
)
# Keys a JSON-RPC message and MCP's parameters have, or any.
KEYS = st.sampled_from(
    [
        "jsonrpc",
        "id",
        "method",
        "params",
        "result",
        "error",
        "code",
        "message",
        "name",
        "arguments",
        "cursor",
        "_meta",
        "protocolVersion",
        "capabilities",
        "clientInfo",
        "progressToken",
    ]
) | st.text(max_size=8)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=40,
)
SPEC_METHODS = sorted(
    {m for m, _ in mcp_methods.CLIENT_REQUESTS}
    | {m for m, _ in mcp_methods.CLIENT_NOTIFICATIONS}
    | {m for m, _ in mcp_methods.SERVER_REQUESTS}
)
METHODS = st.sampled_from(SPEC_METHODS) | st.text(max_size=30)
VERSIONS = st.sampled_from(list(KNOWN_PROTOCOL_VERSIONS))
# No example database: nothing written into the checkout.
QUICK = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
PYDANTIC = ("validation error", "pydantic", "input_value", "type=")


def _words(text: str) -> None:
    assert isinstance(text, str) and text
    assert not any(word in text for word in PYDANTIC), text


@QUICK
@given(JSON)
def test_any_json_value_is_a_message_or_said_why_not(value: Any) -> None:
    said = messages.not_a_message(value)
    if said is not None:
        _words(said)
    _words(messages.json_type(value))


@QUICK
@given(METHODS, st.none() | st.dictionaries(KEYS, JSON, max_size=6), VERSIONS)
def test_any_parameters_the_sdk_refuses_are_said_by_name(
    method: str, params: dict[str, Any] | None, version: str
) -> None:
    refusals = []
    try:
        mcp_methods.validate_client_request(method, version, params)
    except ValidationError as e:  # the parameters alone, as the SDK validates a spec method's
        refusals.append(e)
    except KeyError:  # not a request at this version: -32601, not this
        pass
    try:  # the whole message, as the SDK's reading of the body does
        message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError as e:
        refusals.append(e)
    for refusal in refusals:
        said = messages.params_refused(method, params, refusal)
        assert said.startswith("Invalid params: "), said
        _words(said)


@QUICK
@given(METHODS, VERSIONS | st.text(max_size=12), st.lists(st.text(max_size=12), max_size=4))
def test_any_method_not_found_and_batch_refusal_is_said(
    method: str, version: str, served: list[str]
) -> None:
    _words(messages.method_not_found(method, version, served))
    assert all(isinstance(m, str) for m in messages.served_methods(served, version))
    _words(messages.batch_refused(version))
