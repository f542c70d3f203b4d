"""Citus readiness (issue 16): after migrating to head, every table is either distributed by
`account_id` (its primary key and every unique index lead with it; its foreign keys to other
distributed tables carry it on both sides) or a reference table named in
app/db/distribution.REFERENCE_TABLES, which no distributed table's foreign key can point from.
Reads the catalog, so a table or index added by a later migration is checked too."""

import asyncpg

from app.db.distribution import DISTRIBUTION_COLUMN, REFERENCE_TABLES

TABLES = """
SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname
"""
# Unique indexes (primary keys, unique constraints, unique indexes) and exclusion
# constraints, with their key columns in order (0: an expression).
UNIQUE = """
SELECT t.relname AS table, i.relname AS index, x.indisprimary AS primary,
       array(SELECT coalesce(a.attname, '(expression)')
             FROM unnest(x.indkey[0:x.indnkeyatts - 1]) WITH ORDINALITY k(attnum, n)
             LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             ORDER BY k.n) AS columns
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND (x.indisunique OR x.indisexclusion)
"""
FOREIGN_KEYS = """
SELECT c.conname, t.relname AS table, r.relname AS references,
       array(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
             ORDER BY k.n) AS columns,
       array(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
             ORDER BY k.n) AS referenced
FROM pg_constraint c
JOIN pg_class t ON t.oid = c.conrelid
JOIN pg_class r ON r.oid = c.confrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND c.contype = 'f'
"""


async def test_every_table_is_distributed_by_account_or_a_listed_reference_table(db_url):
    conn = await asyncpg.connect(db_url)
    try:
        tables = {r["relname"] for r in await conn.fetch(TABLES)}
        unique = await conn.fetch(UNIQUE)
        foreign = await conn.fetch(FOREIGN_KEYS)
        columns = {
            (r["table_name"], r["column_name"])
            for r in await conn.fetch(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = 'public'"
            )
        }
    finally:
        await conn.close()

    assert set(REFERENCE_TABLES) <= tables, "listed reference tables that do not exist"
    distributed = tables - set(REFERENCE_TABLES)
    problems: list[str] = []
    for table in sorted(distributed):
        if (table, DISTRIBUTION_COLUMN) not in columns:
            problems.append(f"{table}: no {DISTRIBUTION_COLUMN} column, and not a reference table")
        if not any(u["table"] == table and u["primary"] for u in unique):
            problems.append(f"{table}: no primary key")
    for u in unique:
        if u["table"] in distributed and list(u["columns"][:1]) != [DISTRIBUTION_COLUMN]:
            problems.append(
                f"{u['table']}: unique index {u['index']} on ({', '.join(u['columns'])}) does "
                f"not lead with {DISTRIBUTION_COLUMN}"
            )
    for f in foreign:
        if f["table"] in REFERENCE_TABLES and f["references"] in distributed:
            problems.append(
                f"{f['table']}: reference table with a foreign key {f['conname']} to the "
                f"distributed {f['references']}"
            )
        if f["table"] in distributed and f["references"] in distributed:
            pairs = list(zip(f["columns"], f["referenced"], strict=True))
            if (DISTRIBUTION_COLUMN, DISTRIBUTION_COLUMN) not in pairs:
                problems.append(
                    f"{f['table']}: foreign key {f['conname']} to {f['references']} does not "
                    f"join on {DISTRIBUTION_COLUMN}"
                )
    assert problems == []
    # The rules hold on the tables the service is built on (a sanity check of the queries).
    assert {"agent_memories", "executions", "client_tokens", "clients"} <= distributed


async def test_the_distribution_check_sees_a_table_outside_the_rules(db_url):
    # The same queries catch what the rules forbid: a unique index without the account first.
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("CREATE UNIQUE INDEX bad_unique ON executions (execution_id)")
        rows = await conn.fetch(UNIQUE)
    finally:
        await conn.close()
    (bad,) = [r for r in rows if r["index"] == "bad_unique"]
    assert list(bad["columns"]) == ["execution_id"]
