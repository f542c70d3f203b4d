from pathlib import Path

from app.graphql.schema import schema

SNAPSHOT = Path(__file__).resolve().parents[1] / "schema.graphql"


def test_schema_graphql_matches_code():
    """schema.graphql is exported from the code: `engram schema -o schema.graphql`."""
    assert SNAPSHOT.read_text() == schema.as_str() + "\n", "run `engram schema -o schema.graphql`"
