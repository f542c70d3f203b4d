"""The grants an answer's selection needs, checked before a mutation with effects runs.

A failed request answers `data: null` (DESIGN.md), so a turn whose answer asks for a field the
client may not read (`executeAction { action { name } }` by a client that may only run turns)
would run, commit, and leave its caller without even its `executionId`: a retry would run it
again. `require_selection` refuses such a request before anything runs, naming the field.
"""

from graphql import (
    FieldNode,
    FragmentSpreadNode,
    GraphQLNamedType,
    GraphQLResolveInfo,
    InlineFragmentNode,
    SelectionSetNode,
    get_named_type,
)
from strawberry.types import Info

from app.auth import resources
from app.auth.caller import Caller
from app.auth.operations import OPERATIONS
from app.auth.policies import is_allowed
from app.auth.resources import Grant
from app.errors import AccessDenied

_ACTION_DOCUMENT = (("SELECT", resources.ACTION),)
# "Type.field" -> the grants reading it needs: those viewer.allowed knows, and the fields that
# read through a loader or an action's document (no mutation's own answer: written just now).
FIELD_GRANTS: dict[str, tuple[Grant, ...]] = {
    **{name: grants for name, grants in OPERATIONS.items() if "." in name},
    "ActionExecution.session": (("SELECT", resources.SESSION_INDEX),),
    "ActionAgentMemory.session": (("SELECT", resources.SESSION_INDEX),),
    "ActionAgentMemory.execution": (("SELECT", resources.EXECUTION_DOCUMENT),),
    **{
        f"Action.{name}": _ACTION_DOCUMENT
        for name in (
            "currentVersion",
            "name",
            "instructions",
            "model",
            "harness",
            "created",
            "modified",
            "createdBy",
        )
    },
}


def selected_fields(info: Info) -> set[str]:
    """Every "Type.field" the current field's selection asks for, fragments included."""
    raw: GraphQLResolveInfo = info._raw_info
    found: set[str] = set()

    def walk(parent: GraphQLNamedType | None, selections: SelectionSetNode | None) -> None:
        if parent is None or selections is None:
            return
        fields = getattr(parent, "fields", {})
        for node in selections.selections:
            if isinstance(node, FieldNode):
                field = fields.get(node.name.value)
                if field is None:  # __typename
                    continue
                found.add(f"{parent.name}.{node.name.value}")
                walk(get_named_type(field.type), node.selection_set)
            elif isinstance(node, InlineFragmentNode):
                condition = node.type_condition
                walk(raw.schema.get_type(condition.name.value) if condition else parent,
                     node.selection_set)  # fmt: skip
            elif isinstance(node, FragmentSpreadNode):
                fragment = raw.fragments[node.name.value]
                walk(raw.schema.get_type(fragment.type_condition.name.value),
                     fragment.selection_set)  # fmt: skip

    for node in raw.field_nodes:
        walk(get_named_type(raw.return_type), node.selection_set)
    return found


def require_selection(info: Info, caller: Caller, effect: str) -> None:
    """AccessDenied, before `effect` happens, when the answer's selection asks for a field the
    caller may not read."""
    for name in sorted(selected_fields(info) & FIELD_GRANTS.keys()):
        for verb, resource in FIELD_GRANTS[name]:
            if not is_allowed(caller.policies, verb, resource):
                raise AccessDenied(
                    f"this client is not allowed to {verb} {resource}, which the answer's "
                    f"{name} needs: {effect} did not happen; leave {name} out of the selection"
                )
