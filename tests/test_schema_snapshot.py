import re
from pathlib import Path

from app.graphql.schema import schema

SNAPSHOT = Path(__file__).resolve().parents[1] / "schema.graphql"


def test_schema_graphql_matches_code():
    """schema.graphql is exported from the code: `engram schema -o schema.graphql`."""
    assert SNAPSHOT.read_text() == schema.as_str() + "\n", "run `engram schema -o schema.graphql`"


# Fields whose description names only the values they can take: an ingest's answer is never
# RUNNING (it answers once its review has ended).
ENUM_SUBSETS = {("RememberConversationResult", "status")}


def test_a_description_that_lists_an_enums_values_lists_each():
    """A field or argument of an enum type whose description names some of the enum's values
    names every one: `ActionAgentMemory.source` listed EXTRACTION, TOOL and OPERATOR after MCP
    wrote records too."""
    from graphql import GraphQLEnumType, get_named_type

    graphql = schema._schema
    partial = []
    for type_ in graphql.type_map.values():
        for name, field in getattr(type_, "fields", {}).items():
            uses = [((type_.name, name), field)]
            uses += [((type_.name, name, a), arg) for a, arg in getattr(field, "args", {}).items()]
            for where, use in uses:
                enum = get_named_type(use.type)
                if not isinstance(enum, GraphQLEnumType) or where in ENUM_SUBSETS:
                    continue
                said = {v for v in enum.values if re.search(rf"\b{v}\b", use.description or "")}
                if said and said != set(enum.values):
                    partial.append(f"{'.'.join(where)}: {sorted(set(enum.values) - said)}")
    assert partial == [], "name these values in the description too (app/graphql)"
