"""Filtered `Action.memories` listings: planned for their values (as shipped) against the plan
a prepared statement caches after its fifth run (generic), on an existing database.

    python bench/listing_plans.py 'postgresql://postgres@/postgres?host=DIR&port=5432'

Takes the agent with the most records, a label value many of its records hold, one few hold,
one none holds, and its most and least common kinds; runs each filtered first page (50
records, newest first) 16 times through `app.memory.store.list_page`, and the same statement
under `plan_cache_mode = force_generic_plan`; prints p50 and max of runs 9-16 (ms). Read-only.
"""

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db.pool import init_connection  # noqa: E402
from app.memory import store  # noqa: E402
from app.memory.visibility import OperatorReader  # noqa: E402


async def _timed(conn, reader, filters: store.ListFilters, generic: bool) -> list[float]:
    times = []
    for _ in range(16):
        started = time.perf_counter()
        async with conn.transaction():
            if generic:
                await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                await _generic_page(conn, reader, filters)
            else:
                await store.list_page(
                    conn, reader, after=None, limit=50, ascending=False, filters=filters
                )
        times.append((time.perf_counter() - started) * 1000)
    return times[8:]


class _Connection(asyncpg.Connection):
    """Skips list_page's own `SET LOCAL plan_cache_mode` while `generic` (it would undo the
    caller's setting)."""

    generic = False

    async def execute(self, query: str, *args, timeout: float | None = None) -> str:
        if self.generic and query.startswith("SET LOCAL plan_cache_mode = force_custom"):
            return "SET"
        return await super().execute(query, *args, timeout=timeout)


async def _generic_page(conn: _Connection, reader, filters: store.ListFilters) -> None:
    """The filtered statement list_page sends, under the caller's setting (a generic plan)."""
    conn.generic = True
    try:
        await store.list_page(conn, reader, after=None, limit=50, ascending=False, filters=filters)
    finally:
        conn.generic = False


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("database_url")
    args = parser.parse_args()
    conn = await asyncpg.connect(args.database_url, connection_class=_Connection)
    await init_connection(conn)
    try:
        account, action, records = await conn.fetchrow(
            "SELECT account_id, action_id, count(*) FROM agent_memories"
            " GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 1"
        )
        labels = await conn.fetch(
            "SELECT key::int AS number, value #>> '{}' AS value, count(*) AS n"
            " FROM agent_memories, jsonb_each(labels) WHERE account_id = $1 AND action_id = $2"
            " GROUP BY 1, 2 ORDER BY 3 DESC",
            account,
            action,
        )
        kinds = await conn.fetch(
            "SELECT kind, count(*) AS n FROM agent_memories WHERE account_id = $1"
            " AND action_id = $2 GROUP BY 1 ORDER BY 2 DESC",
            account,
            action,
        )
        cases = {}
        if labels:
            common, rare = labels[0], labels[-1]
            cases[f"label {common['value']} ({common['n']:,} records)"] = {
                common["number"]: common["value"]
            }
            cases[f"label {rare['value']} ({rare['n']:,} records)"] = {
                rare["number"]: rare["value"]
            }
            cases["label none holds"] = {common["number"]: "no-such-value"}
        print(f"# agent {action}: {records:,} records; p50 / max ms of runs 9-16")
        print("| filter | generic plan | planned for its values (shipped) |")
        print("| --- | --- | --- |")
        filters = {name: store.ListFilters(labels=v) for name, v in cases.items()}
        for k in (kinds[0], kinds[-1]):
            filters[f"kind {k['kind']} ({k['n']:,} records)"] = store.ListFilters(kind=k["kind"])
        reader = OperatorReader(account, action)
        for name, f in filters.items():
            generic = await _timed(conn, reader, f, True)
            custom = await _timed(conn, reader, f, False)
            print(
                f"| {name} | {statistics.median(generic):.1f} / {max(generic):.1f} |"
                f" {statistics.median(custom):.1f} / {max(custom):.1f} |",
                flush=True,
            )
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
