"""How the tables spread over a distributed PostgreSQL (Citus), by `account_id`.

Every table is distributed by `account_id` (its primary key and every unique index lead with
it, and every request's query filters on it, so it runs on one account's shard), except the
small global tables below, which are reference tables copied to every node. A test
(tests/test_distribution.py) reads the catalog after migrating and fails on any table or
unique index outside these rules; docs/scaling.md gives the DDL. A new table goes into this
list only when it is small and global (it has no account, or it is how an account is found).
"""

DISTRIBUTION_COLUMN = "account_id"

REFERENCE_TABLES: dict[str, str] = {
    "alembic_version": "the migration the database is at",
    "deployment": "deployment settings: the embedding model, maintenance rounds",
    "accounts": "the accounts (tenants) themselves",
    "token_accounts": "the token-hash lookup that finds a token's account",
    "service_processes": "the running service processes and their heartbeats",
    "revoked_bootstrap_tokens": "the bootstrap tokens revoked, which a start does not make again",
}
