"""MCP over real HTTP for the tests: the app served by uvicorn on loopback, and the official
SDK's own streamable-HTTP client talking to it with a client's bearer token."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

CLIENT_INFO = types.Implementation(name="test-agent", version="1.2.3")


def mcp_url(base: str, action_id: str, session: str | None = "s1", preview: bool = False) -> str:
    url = f"{base}/mcp/{action_id}"
    query = [f"session={session}"] if session else []
    if preview:
        query.append("preview=true")
    return url + ("?" + "&".join(query) if query else "")


@asynccontextmanager
async def mcp_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, client_info=CLIENT_INFO) as session,
    ):
        await session.initialize()
        yield session


def result_json(result: types.CallToolResult) -> dict[str, Any]:
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return json.loads(content.text)


async def call(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """A call that must succeed; returns its output."""
    result = await session.call_tool(name, arguments)
    assert not result.is_error, result.content
    return result_json(result)


async def refused(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """A call that must fail; returns its error body ({error, code?})."""
    result = await session.call_tool(name, arguments)
    assert result.is_error, result.content
    return result_json(result)
