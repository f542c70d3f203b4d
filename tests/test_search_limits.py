"""Search queries are bounded (issue 11, item 5): an over-long query is refused with the limit
named, at every search entry point, and the static embedder embeds a long text in bounded memory.
"""

import json
import tracemalloc

import pytest
from factories import make_agent_id, memory_harness
from helpers import GQL
from openai_server import OpenAIServer
from runtime_support import chat, run, tool_results, tool_runs

from app.auth.caller import Caller
from app.embeddings.static import StaticEmbedder

# Every turn here talks to the scripted model server.
pytestmark = pytest.mark.usefixtures("model_server")

LIMIT = 4096  # ENGRAM_MAX_SEARCH_QUERY_CHARS's default
SEARCH = """query($a: UUID!, $q: String) {
  action(actionId: $a) { searchMemories(query: $q, first: 5) { nodes { memoryId } } }
}"""


async def test_search_memories_refuses_a_query_over_the_limit_naming_it(
    gql: GQL, admin: Caller
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())

    at_limit = await gql(admin, SEARCH, a=action_id, q="invoice " * (LIMIT // 8))
    assert at_limit.ok()["action"]["searchMemories"]["nodes"] == []

    over = await gql(admin, SEARCH, a=action_id, q="x" * (LIMIT + 1))
    assert over.codes == ["BAD_REQUEST"]
    message = over.errors[0]["message"]
    assert "4,097 characters" in message and "at most 4,096" in message
    assert "ENGRAM_MAX_SEARCH_QUERY_CHARS" in message


async def test_search_memory_tool_gets_an_error_the_model_reads_for_a_long_query(
    gql: GQL, admin: Caller, model_server: OpenAIServer
) -> None:
    action_id = await make_agent_id(gql.state, admin, harness=memory_harness())
    model_server.call_tools(("search_memory", {"query": "refund " * 1000}))
    model_server.say("That search was too long.")
    executed = await run(gql, admin, action_id, "find the refund")

    assert executed["status"] == "SUCCEEDED", executed["error"]
    (searched,) = [r for r in tool_runs(executed, "search_memory") if not r["input"].get("recall")]
    assert "at most 4,096 are searched" in searched["error"]
    (result,) = tool_results(chat(model_server)[1])
    assert "at most 4,096 are searched" in json.loads(result)["error"]


def test_static_embedder_embeds_a_long_text_in_bounded_memory(embedder: StaticEmbedder) -> None:
    # 900 KB, as in the report: the old code gathered a (tokens x 256) float32 matrix, 300 MB.
    text = ("the quick brown fox jumps over the lazy dog, 123 " * 20_000)[:900_000]
    tracemalloc.start()
    try:
        vectors, tokens = embedder._embed([text, "short"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16_000_000, f"embedding 900 KB peaked at {peak / 1e6:.0f} MB"
    assert tokens > 250_000  # every token still counts: none is dropped to bound memory
    # The same vector as the text's tokens averaged whole: pieces are cut between words.
    whole = embedder._tokenizer.encode(text[:20_000], add_special_tokens=False).ids
    assert embedder._embed([text[:20_000]])[1] == len(whole)
    assert abs(float(vectors[0] @ vectors[0]) - 1) < 1e-5
