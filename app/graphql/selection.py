"""A change is never made and then lost with its answer: checked before a mutation runs.

A failed request answers `data: null` (DESIGN.md), so a request whose answer asks for a field
the client may not read (`executeAction { action { name } }` by a client that may only run
turns, `createAction { memories }` by one that may only create) would make its change, then
leave its caller without even the ID of what it made: a retry would make it twice. Likewise a
request of two mutations whose second fails after the first ran. The `SelectionGrants`
extension refuses both before anything runs: the first naming the field (ACCESS_DENIED), the
second naming the mutations (BAD_REQUEST: a request runs one mutation). So is a mutation whose
answer asks for a page its list refuses (`createAction { sessions(first: 0) }`): the change
was made before the list's own check of `first` failed, and the answer was lost with it.
"""

from collections.abc import Iterator, Mapping
from typing import Any, cast

from graphql import (
    DocumentNode,
    ExecutionResult,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLNamedType,
    GraphQLSchema,
    InlineFragmentNode,
    Node,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    get_named_type,
    value_from_ast_untyped,
)
from graphql.execution.values import get_variable_values
from strawberry.extensions import SchemaExtension

from app.auth import resources
from app.auth.caller import Caller
from app.auth.operations import OPERATIONS
from app.auth.policies import is_allowed
from app.auth.resources import Grant
from app.errors import AccessDenied, BadInput, DomainError
from app.graphql.actions import DOCUMENT_FIELDS
from app.graphql.relay import MAX_PAGE
from app.history.search import MAX_LIMIT as HISTORY_SEARCH_MAX
from app.memory import search as memory_search
from app.memory.search import search_grants

_ACTION_DOCUMENT = (("SELECT", resources.ACTION),)
# "Type.field" -> the grants reading it needs: those viewer.allowed knows, and the fields that
# read through a loader or an action's document.
FIELD_GRANTS: dict[str, tuple[Grant, ...]] = {
    **{name: grants for name, grants in OPERATIONS.items() if "." in name},
    "ActionExecution.session": (("SELECT", resources.SESSION_INDEX),),
    "ActionAgentMemory.session": (("SELECT", resources.SESSION_INDEX),),
    "ActionAgentMemory.execution": (("SELECT", resources.EXECUTION_DOCUMENT),),
    **{f"Action.{name}": _ACTION_DOCUMENT for name in DOCUMENT_FIELDS},
}
# Mutations whose answer is the version they wrote: its document fields need no SELECT.
_WRITES_ACTION = ("createAction", "updateAction")
# The most a field's `first` may ask for, where it is not a connection's MAX_PAGE (each field
# refuses its own out of range: check_first, searchHistory).
FIRST_MAXIMA: dict[str, int] = {
    "Action.searchMemories": memory_search.MAX_PAGE,
    "ActionSession.searchHistory": HISTORY_SEARCH_MAX,
}


def _search_grants(node: FieldNode, variables: Mapping[str, Any]) -> tuple[Grant, ...]:
    """`searchMemories` needs what the search its arguments ask for needs."""
    # (graphql-core types the variables, which it only reads, as a dict.)
    arguments = {
        a.name.value: value_from_ast_untyped(a.value, variables)  # type: ignore[arg-type]
        for a in node.arguments or ()
    }
    query = arguments.get("query")
    return search_grants(query if isinstance(query, str) else None, arguments.get("ids"))


def selection_refusal(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any],
    caller: Caller,
) -> str | None:
    """Why the caller may not read what a mutation operation's answers select, or None."""
    root = schema.mutation_type
    assert root is not None and operation.operation == OperationType.MUTATION

    def grants_of(parent: GraphQLNamedType, node: FieldNode, written: bool) -> tuple[Grant, ...]:
        name = f"{parent.name}.{node.name.value}"
        if name == "Action.searchMemories":
            return _search_grants(node, variables)
        if written and parent.name == "Action" and node.name.value in DOCUMENT_FIELDS:
            return ()
        return FIELD_GRANTS.get(name, ())

    for node in root_fields(operation.selection_set, fragments):
        field = root.fields.get(node.name.value)
        if field is None:
            continue
        answer = get_named_type(field.type)
        written = node.name.value in _WRITES_ACTION
        for parent, inner, inner_written in selected(
            schema, fragments, answer, node.selection_set, written
        ):
            name = f"{parent.name}.{inner.name.value}"
            for verb, resource in grants_of(parent, inner, inner_written):
                if is_allowed(caller.policies, verb, resource):
                    continue
                return (
                    f"this client is not allowed to {verb} {resource}, which the answer's {name} "
                    f"needs: nothing ran; leave {name} out of the selection"
                )
    return None


def selected(
    schema: GraphQLSchema,
    fragments: Mapping[str, FragmentDefinitionNode],
    answer: GraphQLNamedType | None,
    selections: SelectionSetNode | None,
    written: bool,
    variables: Mapping[str, Any] | None = None,
) -> Iterator[tuple[GraphQLNamedType, FieldNode, bool]]:
    """Every field a selection of `answer` holds, at any depth, with its parent type and
    whether it is a field of the version a mutation wrote (`written`: the selection's own
    fields are); with `variables`, only those that run (not left out by @skip or @include,
    theirs or an enclosing selection's). Depth first, in the selection's order, without
    recursion (fragments spread within fragments nest as deep as the text allows); a fragment
    walked once, however often it is spread (its fields are the same each time: spread twice
    in each of 30 fragments, it was walked 2^30 times)."""
    if answer is None or selections is None:
        return
    stack = [(answer, iter(selections.selections), written)]
    walked: set[tuple[str, bool]] = set()
    while stack:
        parent, pending, written = stack[-1]
        node = next(pending, None)
        if node is None:
            stack.pop()
        elif variables is not None and not runs(node, variables):
            continue
        elif isinstance(node, FieldNode):
            field = getattr(parent, "fields", {}).get(node.name.value)
            if field is None:  # __typename
                continue
            yield parent, node, written
            if node.selection_set:
                inner = get_named_type(field.type)
                stack.append((inner, iter(node.selection_set.selections), False))
        elif isinstance(node, InlineFragmentNode):
            condition = node.type_condition
            target = schema.get_type(condition.name.value) if condition else parent
            if target is not None:
                inside = written and target is parent
                stack.append((target, iter(node.selection_set.selections), inside))
        elif isinstance(node, FragmentSpreadNode) and node.name.value in fragments:
            fragment = fragments[node.name.value]
            target = schema.get_type(fragment.type_condition.name.value)
            key = (node.name.value, written and target is parent)
            if target is not None and key not in walked:
                walked.add(key)
                stack.append((target, iter(fragment.selection_set.selections), key[1]))


def first_refusal(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any],
) -> str | None:
    """Why a list a mutation operation's answers select may not be asked for with its
    `first`, or None."""
    root = schema.mutation_type
    assert root is not None and operation.operation == OperationType.MUTATION
    for node in root_fields(operation.selection_set, fragments, variables):
        field = root.fields.get(node.name.value)
        if field is None:
            continue
        answer = get_named_type(field.type)
        for parent, inner, _ in selected(
            schema, fragments, answer, node.selection_set, False, variables
        ):
            asked = getattr(parent, "fields", {})[inner.name.value].args.get("first")
            if asked is None:
                continue
            given = next((a.value for a in inner.arguments or () if a.name.value == "first"), None)
            # (graphql-core types the variables, which it only reads, as a dict.)
            first = (
                value_from_ast_untyped(given, variables)  # type: ignore[arg-type]
                if given is not None
                else asked.default_value
            )
            name = f"{parent.name}.{inner.name.value}"
            maximum = FIRST_MAXIMA.get(name, MAX_PAGE)
            if isinstance(first, int) and not 1 <= first <= maximum:
                return (
                    f"`first` of the answer's {name} must be from 1 to {maximum:,}, got {first}: "
                    "nothing ran (the change would have been made, and its answer refused)"
                )
    return None


def fragments_of(definitions: Any) -> dict[str, FragmentDefinitionNode]:
    """A document's fragments by name."""
    return {d.name.value: d for d in definitions if isinstance(d, FragmentDefinitionNode)}


def root_fields(
    selections: SelectionSetNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any] | None = None,
) -> Iterator[FieldNode]:
    """The operation's root fields, through fragments (each spread once, as execution collects
    them); with `variables`, only those that run (not left out by @skip or @include)."""
    stack = [iter(selections.selections)]
    spread: set[str] = set()
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
        elif variables is not None and not runs(node, variables):
            continue
        elif isinstance(node, FieldNode):
            yield node
        elif isinstance(node, InlineFragmentNode):
            stack.append(iter(node.selection_set.selections))
        elif (
            isinstance(node, FragmentSpreadNode)
            and node.name.value in fragments
            and node.name.value not in spread
        ):
            spread.add(node.name.value)
            stack.append(iter(fragments[node.name.value].selection_set.selections))


def coerced(
    schema: GraphQLSchema, operation: OperationDefinitionNode, variables: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The operation's variables as execution will read them (defaults applied), or None when
    they are wrong (execution refuses them, naming what is wrong)."""
    values = get_variable_values(schema, operation.variable_definitions or (), dict(variables))
    if isinstance(values, list):  # errors
        return None
    # graphql-core 3.3's VariableValues, or 3.2's dict.
    return cast(Mapping[str, Any], getattr(values, "coerced", values))


def runs(node: Node, variables: Mapping[str, Any]) -> bool:
    """Whether @skip and @include leave the selection in, by the coerced variables (a
    condition that is not a boolean leaves it in: validation refuses it anyway)."""
    for directive in getattr(node, "directives", None) or ():
        name = directive.name.value
        if name not in ("skip", "include"):
            continue
        condition = next((a.value for a in directive.arguments if a.name.value == "if"), None)
        # (graphql-core types the variables, which it only reads, as a dict.)
        value = value_from_ast_untyped(condition, variables) if condition else None  # type: ignore[arg-type]
        if isinstance(value, bool) and value == (name == "skip"):
            return False
    return True


def chosen_operation(document: DocumentNode, name: str | None) -> OperationDefinitionNode | None:
    """The operation a request runs: the one named, or the first (InputChecks refuses a
    document of several without a name)."""
    return next(
        (
            d
            for d in document.definitions
            if isinstance(d, OperationDefinitionNode)
            and (name is None or (d.name and d.name.value == name))
        ),
        None,
    )


def mutation_count_refusal(
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any],
) -> str | None:
    """Why a mutation operation may not run as sent: it runs more than one mutation."""
    keys = dict.fromkeys(
        (node.alias or node.name).value
        for node in root_fields(operation.selection_set, fragments, variables)
        if node.name.value != "__typename"
    )
    if len(keys) <= 1:
        return None
    return (
        f"a request runs one mutation, and this one asks for {len(keys)} ({', '.join(keys)}): "
        "nothing ran; send each in a request of its own, so that one failing cannot hide the "
        "answer of another already done"
    )


# The operation a request runs, as execution reads it: (schema, operation, fragments, variables).
Asked = tuple[
    GraphQLSchema, OperationDefinitionNode, dict[str, FragmentDefinitionNode], Mapping[str, Any]
]


class Refusing(SchemaExtension):
    """An extension that answers its `_refusal` (a DomainError: its code and message), with
    `data: null`, instead of running the operation; None lets it run."""

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        error = self._refusal() if context.result is None else None
        if error is not None:
            context.result = ExecutionResult(
                data=None, errors=[GraphQLError(error.message, original_error=error)]
            )
        yield

    def _refusal(self) -> DomainError | None:
        raise NotImplementedError

    def _asked(self, kind: OperationType | None = None) -> Asked | None:
        """The operation the request runs (if it is of `kind`), as execution reads it; None
        without one, or when its variables are wrong (execution refuses them, naming what is
        wrong)."""
        context = self.execution_context
        document = context.graphql_document
        if document is None:
            return None
        operation = chosen_operation(document, context.operation_name)
        if operation is None or kind not in (None, operation.operation):
            return None
        schema = context.schema._schema
        variables = coerced(schema, operation, context.variables or {})
        if variables is None:
            return None
        return schema, operation, fragments_of(document.definitions), variables


class SelectionGrants(Refusing):
    """Answers, instead of running a mutation, BAD_REQUEST when the request asks for several,
    and ACCESS_DENIED when what its answer selects needs a grant the caller does not hold."""

    def _refusal(self) -> DomainError | None:
        caller = getattr(self.execution_context.context, "caller", None)
        if not isinstance(caller, Caller):
            return None
        # A query changes nothing, and its fields check their own grants.
        asked = self._asked(OperationType.MUTATION)
        if asked is None:
            return None
        schema, operation, fragments, variables = asked
        several = mutation_count_refusal(operation, fragments, variables)
        if several:
            return BadInput(several)
        page = first_refusal(schema, operation, fragments, variables)
        if page:
            return BadInput(page)
        denied = selection_refusal(schema, operation, fragments, variables, caller)
        return AccessDenied(denied) if denied else None
