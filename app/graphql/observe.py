"""Tells the request middleware which root fields a request ran and how it ended (metrics)."""

from collections.abc import Iterator

from graphql import FieldNode, OperationDefinitionNode, OperationType
from strawberry.extensions import SchemaExtension
from strawberry.types import ExecutionContext

from app.observability.requests import outcome

MAX_OPERATION_CHARS = 120  # a label, not a query: long selections are cut
INTROSPECTION = frozenset({"__schema", "__type", "__typename"})


class Outcome(SchemaExtension):
    """Runs outside ErrorCodes, so it sees the codes clients get."""

    def on_operation(self) -> Iterator[None]:
        yield
        slot = outcome.get()
        if slot is None:
            return
        context = self.execution_context
        slot.operation = _root_fields(context)
        result = context.result
        if result is not None and result.errors:
            slot.code = str((result.errors[0].extensions or {}).get("code", "INTERNAL"))
        else:
            slot.code = "OK"


def _root_fields(context: ExecutionContext) -> str:
    """The operation's root field names: schema words only, never a client's own (a field the
    schema lacks, an alias or an operation name would let clients write label values)."""
    document = context.graphql_document
    if document is None:
        return "invalid"
    name = context.operation_name
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    chosen = [o for o in operations if name is None or (o.name and o.name.value == name)]
    if len(chosen) != 1:
        return "invalid"
    schema = context.schema._schema
    root = {
        OperationType.QUERY: schema.query_type,
        OperationType.MUTATION: schema.mutation_type,
        OperationType.SUBSCRIPTION: schema.subscription_type,
    }[chosen[0].operation]
    known = set(root.fields) if root is not None else set()
    fields = {s.name.value for s in chosen[0].selection_set.selections if isinstance(s, FieldNode)}
    if not fields or not all(f in known or f in INTROSPECTION for f in fields):
        return "invalid"
    return ",".join(sorted(fields))[:MAX_OPERATION_CHARS]
