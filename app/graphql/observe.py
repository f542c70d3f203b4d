"""Tells the request middleware which root fields a request ran and how it ended (metrics)."""

from collections.abc import Iterator

from graphql import FieldNode, OperationDefinitionNode
from strawberry.extensions import SchemaExtension

from app.observability.requests import outcome

MAX_OPERATION_CHARS = 120  # a label, not a query: long selections are cut


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


def _root_fields(context: object) -> str:
    """The operation's root field names (schema words, never client-chosen names)."""
    document = getattr(context, "graphql_document", None)
    if document is None:
        return "invalid"
    name = getattr(context, "operation_name", None)
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    chosen = [o for o in operations if name is None or (o.name and o.name.value == name)]
    if len(chosen) != 1:
        return "invalid"
    fields = sorted(
        {s.name.value for s in chosen[0].selection_set.selections if isinstance(s, FieldNode)}
    )
    return ",".join(fields)[:MAX_OPERATION_CHARS] or "invalid"
