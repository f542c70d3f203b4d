"""What is wrong with a JSON-RPC message the MCP endpoint refuses, in words a client's developer
can act on: which member or parameter, what it takes, what came instead. Never pydantic's
text: the SDK answered a body that is no JSON-RPC message, and a batch, with pydantic's
validation dump (-32602), and parameters of the wrong shape with "Invalid request parameters"
alone.

The JSON-RPC codes (JSON-RPC 2.0, section 5.1, which every MCP version follows): -32700 Parse
error (not JSON), -32600 Invalid Request ("The JSON sent is not a valid Request object"),
-32601 Method not found ("The method does not exist / is not available"), -32602 Invalid
params ("Invalid method parameter(s)")."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mcp_types import jsonrpc_message_adapter
from mcp_types.methods import CLIENT_NOTIFICATIONS, CLIENT_REQUESTS, SERVER_REQUESTS
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    KNOWN_PROTOCOL_VERSIONS,
    MODERN_PROTOCOL_VERSIONS,
)
from pydantic import ValidationError

# The protocol version that takes JSON-RPC batches: 2025-03-26 added them ("MCP implementations
# MAY support sending JSON-RPC batches, but MUST support receiving JSON-RPC batches"), 2025-06-18
# removed them ("Remove support for JSON-RPC batching"), and 2024-11-05 predates them (2025-03-26
# speaks of "prior protocol versions that do not explicitly support JSON-RPC batches").
BATCHING_VERSION = "2025-03-26"
# The most messages one batch may hold: the batch is one request, holding one of the account's
# places (ENGRAM_MAX_REQUESTS_PER_ACCOUNT) while its messages are served one after another.
MAX_BATCH = 20


def _order(version: str) -> int:
    """Where `version` comes among MCP's versions (-1 for one MCP has not): they are an
    enumerated set, not dates to compare (mcp_types.version)."""
    return KNOWN_PROTOCOL_VERSIONS.index(version) if version in KNOWN_PROTOCOL_VERSIONS else -1


def json_type(value: Any) -> str:
    """A JSON value's type as a sentence names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _quoted(value: Any, limit: int = 60) -> str:
    """A JSON scalar as JSON text (escaped to ASCII, cut at `limit`); a structure's type."""
    if isinstance(value, list | dict):
        return json_type(value)
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def not_a_message(item: Any) -> str | None:
    """Why `item` is no JSON-RPC 2.0 message (request, notification or response) the SDK
    takes, after "Invalid Request: "; None when it is one. The SDK's own reading decides
    (so nothing it takes is refused here); this only says why."""
    try:
        jsonrpc_message_adapter.validate_python(item, by_name=False)
        return None
    except ValidationError:
        pass
    if not isinstance(item, dict):
        return f"a JSON-RPC message is an object, not {json_type(item)}"
    if item.get("jsonrpc") != "2.0":
        given = f", not {_quoted(item['jsonrpc'])}" if "jsonrpc" in item else " (it is missing)"
        return f'a JSON-RPC 2.0 message has "jsonrpc": "2.0"{given}'
    if "method" in item:
        method = item["method"]
        if not isinstance(method, str):
            return (
                f'"method" must be a string (the method\'s name, such as "tools/call"), not '
                f"{json_type(method)}"
            )
        params = item.get("params")
        if params is not None and not isinstance(params, dict):
            return (
                f'"params" must be an object (the method\'s parameters by name), not '
                f"{json_type(params)}"
            )
    elif "result" in item or "error" in item:
        if "id" not in item:
            return 'a response has the "id" of the request it answers (it is missing)'
        if "result" in item and not isinstance(item["result"], dict):
            return f'"result" must be an object, not {json_type(item["result"])}'
        error = item.get("error")
        if "result" not in item and not isinstance(error, dict):
            return f'"error" must be an object, not {json_type(error)}'
        if isinstance(error, dict) and not isinstance(error.get("code"), int):
            return '"error.code" must be an integer (the JSON-RPC error code)'
        if isinstance(error, dict) and not isinstance(error.get("message"), str):
            return '"error.message" must be a string'
    else:
        return (
            'a JSON-RPC message has a "method" (a request or a notification), or a "result" '
            'or an "error" (a response): this has none'
        )
    return "it is no JSON-RPC 2.0 request, notification or response"


def version_unknown(message: Any, version: str) -> str | None:
    """The refusal of a request whose MCP-Protocol-Version header names a version MCP has not
    (`2025-06-17`, a typo), sent without 2026-07-28's envelope: the SDK took it for that
    version's request and asked for `params._meta`, which a client of the handshake's versions
    never sends. None when the version is one MCP has, or the envelope names one (the SDK
    answers that itself, -32022 with the versions it serves)."""
    if version in KNOWN_PROTOCOL_VERSIONS:
        return None
    params = message.get("params") if isinstance(message, Mapping) else None
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    if isinstance(meta, Mapping) and _VERSION_META in meta:
        return None
    return (
        f"Invalid Request: the MCP-Protocol-Version header says {_quoted(version, 40)}, a protocol "
        f"version this server does not serve: it serves {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}"
        " (opened by initialize, whose answer names the version to send) and "
        f"{', '.join(MODERN_PROTOCOL_VERSIONS)}"
    )


def batch_refused(version: str) -> str:
    """The refusal of a batch at a protocol version that takes none."""
    if _order(version) > _order(BATCHING_VERSION):
        why = "MCP removed batching in 2025-06-18"
    else:
        why = f"batches came with {BATCHING_VERSION}"
    return (
        f"Invalid Request: protocol version {version} takes one JSON-RPC message per request, "
        f"not a batch (a JSON array): {why}. POST each message on its own"
    )


# What a parameter is, where a method's parameters are named in a refusal.
_HINTS: Mapping[tuple[str, str], str] = {
    ("tools/call", "params"): 'the tool and its arguments: {"name": ..., "arguments": {...}}',
    ("tools/call", "params.name"): "the tool's name, as tools/list gives it",
    ("tools/call", "params.arguments"): "the tool's arguments by name",
    ("tools/list", "params.cursor"): "the nextCursor of the listing before",
    ("initialize", "params"): "protocolVersion, capabilities and clientInfo",
    ("initialize", "params.protocolVersion"): "the protocol version the client asks for",
    ("initialize", "params.capabilities"): "the client's capabilities, {} for none",
    ("initialize", "params.clientInfo"): 'the client\'s {"name": ..., "version": ...}',
    ("", "params"): "the method's parameters by name",
    ("", "params._meta"): "the request's metadata",
}

# What a value must be, for pydantic's error types.
_EXPECTED: Mapping[str, str] = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "mapping_type": "an object",
    "list_type": "an array",
    "tuple_type": "an array",
    "none_required": "null",
    "url_type": "a URL",
    "url_parsing": "a URL",
}


def _located(root: Any, loc: Sequence[str | int]) -> tuple[str, Any, bool]:
    """The path a pydantic error's `loc` names in `root` (the names of union members it holds
    left out), the value there, and whether there is one."""
    path = ""
    value = root
    present = True
    for i, key in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(value, dict) and isinstance(key, str) and (key in value or last):
            path += f".{key}" if path else key
            present = key in value
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
            path += f"[{key}]"
            value = value[key]
        # Anything else names a member of a union (a model's or a type's name): no step.
    return path, value, present


def params_refused(method: str, params: Mapping[str, Any] | None, error: ValidationError) -> str:
    """The refusal of a request's parameters that do not validate, naming each parameter at
    fault (up to three), what it takes and what came: "Invalid params: params.name must be a
    string (the tool's name, as tools/list gives it), not 5"."""
    # The SDK validates either the whole message ({"params": ...}, its members under "params")
    # or the parameters alone (their names first).
    errors = error.errors(include_url=False, include_input=False)
    found: dict[str, tuple[list[str], Any, bool]] = {}
    values: set[str] = set()  # paths where the value is wrong, not its type
    for e in errors:
        loc = tuple(e["loc"])
        root: Any = {} if params is None else {"params": params}
        if not loc or loc[0] != "params":
            loc = ("params", *loc)
        path, value, present = _located(root, loc)
        expected, problem = found.setdefault(path, ([], value, present))[0], e["type"]
        if problem == "missing":
            continue
        if problem in _EXPECTED:
            words = _EXPECTED[problem]
        elif problem in ("literal_error", "enum"):
            words = f"one of {e.get('ctx', {}).get('expected', '...')}"
            values.add(path)
        else:
            words = str(e["msg"]).rstrip(".")
            words = words[0].lower() + words[1:] if words else "valid"
            words = f"valid ({words})"
        if words not in expected:
            expected.append(words)
    said = []
    for path, (expected, value, present) in found.items():
        hint = _HINTS.get((method, path)) or _HINTS.get(("", path))
        about = f" ({hint})" if hint else ""
        if not present:
            said.append(f"{path} is required{about}")
        elif expected:
            # A wrong value, or a scalar of the wrong type, is shown; a structure is named.
            shown = path in values or not isinstance(value, str | list | dict)
            came = _quoted(value, 40) if shown else json_type(value)
            said.append(f"{path} must be {' or '.join(expected)}{about}, not {came}")
        else:
            said.append(f"{path} is not valid here{about}")
    more = f"; and {len(said) - 3} more" if len(said) > 3 else ""
    return f"Invalid params: {'; '.join(said[:3])}{more}"


def method_not_found(method: str, version: str, served: Sequence[str]) -> str:
    """The refusal of a method this server does not answer at `version`, saying whether MCP has
    it at that version and what the server answers there."""
    name = _quoted(method)
    answers = f"this server answers {_listed(served)} at protocol version {version}"
    versions = [v for (m, v) in CLIENT_REQUESTS if m == method]
    if not versions and any(m == method for (m, _) in CLIENT_NOTIFICATIONS):
        return (
            f"Method not found: {name} is a notification, not a request: send it without an "
            f"id (and nothing answers it); {answers}"
        )
    if not versions and any(m == method for (m, _) in SERVER_REQUESTS):
        return (
            f"Method not found: {name} is a request a server sends its client, not one it "
            f"answers; {answers}"
        )
    if not versions:
        return f"Method not found: {name} is no method this server knows; {answers}"
    if version in versions:
        return (
            f"Method not found: this server does not offer {name} (its capabilities name tools "
            f"only); {answers}"
        )
    last = max(versions, key=_order)
    if _order(version) > _order(last):
        removed = KNOWN_PROTOCOL_VERSIONS[_order(last) + 1]
        was = ", which removed it" if removed == version else f" (MCP removed it in {removed})"
    elif 0 <= _order(version) < _order(min(versions, key=_order)):
        was = f" (it came with {min(versions, key=_order)})"
    else:
        was = ""
    return f"Method not found: {name} is not part of protocol version {version}{was}; {answers}"


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def served_methods(handled: Sequence[str], version: str) -> list[str]:
    """The request methods a server with handlers for `handled` answers at `version`: those
    MCP has at that version (the handshake's `initialize` is the runner's own)."""
    return sorted(m for m in {*handled, "initialize"} if (m, version) in CLIENT_REQUESTS)


# The key of a request's `params._meta` naming its protocol version (2026-07-28 on).
_VERSION_META = "io.modelcontextprotocol/protocolVersion"


def header_refused(message: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """What is wrong with a request's routing headers at 2026-07-28, which the SDK found
    (-32020 HeaderMismatch) and said as "mcp-method header does not match the request body's
    method", also of a header that is missing, and without the value to send; None when it is
    none of these (the SDK's words then stand)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    version = meta.get(_VERSION_META) if isinstance(meta, Mapping) else None
    sent_version = headers.get("mcp-protocol-version")
    if isinstance(version, str) and sent_version != version:
        return (
            f"the MCP-Protocol-Version header says {sent_version!r}, but params._meta's "
            f"{_VERSION_META} says {version!r}: send the same version in both"
        )
    method = message.get("method")
    if not isinstance(method, str):
        return None
    if headers.get("mcp-method") != method:
        return (
            f"{_header('Mcp-Method', headers.get('mcp-method'))}, but the request's method is "
            f"{method!r}: at protocol version {version} every request names its method in the "
            f"Mcp-Method header (Mcp-Method: {method})"
        )
    name = params.get("name") if method == "tools/call" and isinstance(params, Mapping) else None
    if isinstance(name, str) and name.isascii() and headers.get("mcp-name") != name:
        return (
            f"{_header('Mcp-Name', headers.get('mcp-name'))}, but the tool called is {name!r}: at "
            f"protocol version {version} a tools/call names its tool in the Mcp-Name header "
            f"(Mcp-Name: {name})"
        )
    return None


def _header(name: str, value: str | None) -> str:
    return f"the {name} header is missing" if value is None else f"the {name} header says {value!r}"
