"""One check of a request's input before anything runs: every string it carries is storable
(no NUL, no lone surrogate), and a document with several operations names the one to run; and
input types built from their coerced values directly (built_directly)."""

import math
from collections.abc import Iterator, Mapping
from dataclasses import MISSING
from typing import Any, TypeVar
from weakref import WeakValueDictionary

from graphql import (
    ExecutionResult,
    FloatValueNode,
    GraphQLError,
    IntValueNode,
    ListValueNode,
    Node,
    ObjectValueNode,
    OperationDefinitionNode,
    StringValueNode,
    ValueNode,
    visit,
)
from graphql.language import ArgumentNode, Visitor
from strawberry.extensions import SchemaExtension
from strawberry.types.arguments import InputContext
from strawberry.types.base import (
    StrawberryList,
    StrawberryOptional,
    get_object_definition,
    has_object_definition,
)
from strawberry.types.lazy_type import LazyType

from app.errors import BadInput
from app.text import check_json, check_storable

T = TypeVar("T")

# The most digits of an integer literal Python converts (sys.get_int_max_str_digits's default).
_INT_DIGITS = 4300


def _check_literal(value: ValueNode, field: str) -> None:
    if isinstance(value, StringValueNode):
        check_storable(value.value, field)
    elif isinstance(value, FloatValueNode) and not math.isfinite(float(value.value)):
        raise BadInput(f"{field} is {value.value}, beyond what a number can hold")
    elif isinstance(value, IntValueNode) and (digits := len(value.value.lstrip("-"))) > _INT_DIGITS:
        # Python reads no longer integer from text, and graphql-core then takes it for NaN.
        raise BadInput(
            f"{field} is an integer of {digits:,} digits, beyond what a number can hold here"
            f" (at most {_INT_DIGITS:,})"
        )
    elif isinstance(value, ListValueNode):
        for i, item in enumerate(value.values):
            _check_literal(item, f"{field}[{i}]")
    elif isinstance(value, ObjectValueNode):
        for member in value.fields:
            _check_literal(member.value, f"{field}.{member.name.value}")


class _Literals(Visitor):
    """Every string literal of the document, in arguments and in variables' defaults."""

    def enter_argument(self, node: ArgumentNode, *_: Any) -> None:
        _check_literal(node.value, f"argument `{node.name.value}`")

    def enter_variable_definition(self, node: Any, *_: Any) -> None:
        if node.default_value is not None:
            _check_literal(node.default_value, f"the default of ${node.variable.name.value}")


def check_request(document: Node, variables: dict[str, Any] | None, operation: str | None) -> None:
    """BadInput when the request cannot run as sent."""
    if operation is None:
        names = [
            d.name.value if d.name else "(anonymous)"
            for d in getattr(document, "definitions", ())
            if isinstance(d, OperationDefinitionNode)
        ]
        if len(names) > 1:
            raise BadInput(
                f"the document has {len(names)} operations ({', '.join(names)}); "
                "name the one to run in operationName"
            )
    if variables:
        for name, value in variables.items():
            check_storable(str(name), "a variable's name")
            check_json(value, f"${name}", root=f"${name}")
    if id(document) not in _LITERALS_PASSED:
        visit(document, _Literals())
        _LITERALS_PASSED[id(document)] = document


# Documents whose literals passed, by identity: the document cache (graphql/documents.py)
# hands back one document per query text. Held weakly: an entry goes with its document (so
# its id stays its own), and this holds no more than the cache and the requests running do.
_LITERALS_PASSED: WeakValueDictionary[int, Node] = WeakValueDictionary()


class InputChecks(SchemaExtension):
    """Runs `check_request` once validation passed, and answers BAD_REQUEST instead of running."""

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        if context.graphql_document is not None and context.result is None:
            # strawberry runs the first operation when none is named; the spec calls that an error.
            named = getattr(context, "_provided_operation_name", None)
            try:
                check_request(context.graphql_document, context.variables, named)
            except BadInput as e:
                context.result = ExecutionResult(
                    data=None, errors=[GraphQLError(e.message, original_error=e)]
                )
        yield


def check_body(payload: Any, max_depth: int) -> None:
    """`check_json` over a decoded request body, its parts named from the top
    (`variables.input.summary`)."""
    check_json(payload, "the request body", max_depth)


def built_directly(cls: type[T]) -> type[T]:
    """An input type whose objects are built from graphql-core's coerced value by a table of
    its fields made once. Strawberry's own conversion resolves each field's type again for
    every object (84 ms of addAgentMemories' 1,000 records, bench/README.md); the values are
    the same: scalars and enums as graphql-core coerced them, anything else (lists, nested
    inputs) converted by strawberry, and a field without a default that the value omits None."""
    definition = get_object_definition(cls, strict=True)
    table: list[tuple[str, str, Any]] = []  # (GraphQL name, Python name, type if converted)
    unset = [
        f.python_name
        for f in definition.fields
        if f.default_value is MISSING and f.default_factory is MISSING
    ]

    def from_input(type_: type[T], value: Mapping[str, Any], context: InputContext) -> T:
        if not table:  # once the schema exists: a field's type may be a forward reference
            for f in definition.fields:
                resolved = f.resolve_type(type_definition=definition)
                table.append(
                    (
                        context.config.name_converter.from_field(f),
                        f.python_name,
                        None if _coerced_as_is(resolved) else resolved,
                    )
                )
        kwargs: dict[str, Any] = dict.fromkeys(unset)
        for name, python_name, converted in table:
            if name in value:
                raw = value[name]
                kwargs[python_name] = (
                    raw if converted is None else context.convert(raw, converted, name)
                )
        return type_(**kwargs)

    definition.from_input = from_input
    return cls


def _coerced_as_is(type_: Any) -> bool:
    """Whether strawberry keeps graphql-core's coerced value of the type as it is: a scalar or
    an enum, or an optional one."""
    if isinstance(type_, StrawberryOptional):
        type_ = type_.of_type
    return not isinstance(type_, StrawberryList | LazyType) and not has_object_definition(type_)
