"""Process-level structures that grow with use hold at most their bound, however many distinct
keys a long-running process meets (bench/growth.py measures them under load)."""

import ctypes
import gc
import random
import string
import subprocess
import sys
import uuid
import weakref

import pytest
from graphql import parse

from app.auth import policies, verified
from app.embeddings.static import StaticEmbedder
from app.graphql.documents import Documents
from app.graphql.inputs import _LITERALS_PASSED, check_request
from app.history import search as history_search


def test_verified_tokens_are_at_most_max_entries():
    pool = object()
    since = verified.generation()
    try:
        for i in range(verified.MAX_ENTRIES + 500):
            verified.keep(pool, i.to_bytes(8, "big"), "caller", None, since, 1e12)
            assert len(verified._entries) <= verified.MAX_ENTRIES
        assert verified.recall(pool, (verified.MAX_ENTRIES + 499).to_bytes(8, "big")) == "caller"
    finally:
        verified.forget()


def test_learnt_session_plans_are_at_most_max_remembered():
    pool = -1  # no real pool has this id
    keys = [(pool, uuid.uuid4(), uuid.uuid4(), f"s{i}", False) for i in range(3)]
    keys += [
        (pool, keys[0][1], keys[0][2], f"t{i}", False)
        for i in range(history_search.MAX_REMEMBERED + 100)
    ]
    try:
        for key in keys:
            history_search._remember(key, "exact", 5)
        assert len(history_search._PLANS) <= history_search.MAX_REMEMBERED
        assert history_search._remembered(keys[-1], 5) == "exact"  # the latest kept
        assert history_search._remembered(keys[0], 5) is None  # the least lately learnt gone
    finally:
        for key in keys:
            history_search._PLANS.pop(key, None)


def test_valid_documents_are_at_most_maxsize_the_least_recently_used_going():
    documents = Documents(maxsize=3)
    for i in range(10):
        documents.add((f"query {i}", ()), object())  # type: ignore[arg-type]
        if i == 7:
            assert documents.get(("query 5", ())) is not None  # used: kept over 6 and 7
    assert len(documents._valid) == 3
    assert [k for k, _ in documents._valid] == ["query 5", "query 8", "query 9"]


def test_valid_documents_hold_at_most_max_chars_of_text():
    # A parsed document takes about 140 bytes a character: 256 texts near the token limit
    # held 600 MB before the characters were bounded too.
    documents = Documents(maxsize=256, max_chars=100)
    for i in range(10):
        documents.add((f"{i:<39}", ()), object())  # type: ignore[arg-type]
        assert documents.chars <= 100
    assert [k for k, _ in documents._valid] == [f"{i:<39}" for i in (8, 9)]
    documents.add(("x" * 101, ()), object())  # type: ignore[arg-type]
    assert documents.get(("x" * 101, ())) is None and len(documents._valid) == 2
    assert documents.chars == 78


def test_documents_whose_literals_passed_are_not_held_alive():
    held = []
    for i in range(300):
        document = parse(f'{{ viewer {{ principal }} a{i}: client(principal: "p{i}") {{ name }} }}')
        check_request(document, None, None)
        held.append(weakref.ref(document))
    assert len(_LITERALS_PASSED) >= 1  # the last one, alive until here
    del document
    gc.collect()
    assert [r for r in held if r() is not None] == []


def test_unmatched_policy_patterns_are_warned_about_at_most_warned_max(caplog):
    policies.forget_warnings()
    try:
        for i in range(policies._WARNED_MAX + 50):
            policies._warn_unmatched(f"nothing.Known{i}")
        assert len(policies._warned) == policies._WARNED_MAX
    finally:
        policies.forget_warnings()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc_in_use() -> int:
    """glibc malloc's bytes in use: what the tokenizer (Rust, out of tracemalloc's sight) holds."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc 2.33 or later")
def test_the_static_embedder_keeps_nothing_per_distinct_text():
    # Its tokenizer's BPE cache kept the tokens of each distinct text under 256 bytes, the first
    # 10,000 for good: about 8 kB a text such as these (16 MB for 2,000 of them).
    embedder = StaticEmbedder()  # its own: another test's texts may have filled a cache
    rng = random.Random(5)
    characters = string.ascii_letters + string.digits + string.punctuation

    def distinct(n: int) -> None:
        for _ in range(n):
            embedder._embed(["".join(rng.choices(characters, k=250))])

    distinct(200)  # the first calls' own allocations
    before = _malloc_in_use()
    distinct(2_000)
    assert _malloc_in_use() - before < 2 * 2**20


_FREED_AFTER_LOAD = """
import ctypes, os
from app.embeddings.static import StaticEmbedder

def rss():
    with open(f"/proc/{os.getpid()}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

embedder = StaticEmbedder()
before = rss()
ctypes.CDLL(None).malloc_trim(0)
print((before - rss()) * 1024)
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="glibc's malloc")
def test_the_static_embedder_gives_back_the_heap_its_load_freed():
    # Loading the model freed about 40 MB of heap that malloc kept: a process started 234 MB
    # where 195 serve. In a process of its own, so that no other test's heap is measured.
    found = subprocess.run(
        [sys.executable, "-c", _FREED_AFTER_LOAD], capture_output=True, text=True, check=True
    )
    assert int(found.stdout) < 8 * 2**20, "the load left its freed heap in the process"
