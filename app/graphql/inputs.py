"""One check of a request's input before anything runs: every string it carries is storable
(no NUL, no lone surrogate), and a document with several operations names the one to run."""

import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

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

from app.errors import BadInput
from app.text import check_json, check_storable

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
        for item in value.fields:
            _check_literal(item.value, f"{field}.{item.name.value}")


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
        if len(_LITERALS_PASSED) > 256:
            _LITERALS_PASSED.popitem(last=False)


# Documents whose literals passed, by identity: the document cache (graphql/documents.py)
# hands back one document per query text. Each is held, so that its id stays its own.
_LITERALS_PASSED: OrderedDict[int, Node] = OrderedDict()


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
