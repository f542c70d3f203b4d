"""What one request may ask of the service, checked before anything runs.

A request is one client's, but its cost is every tenant's: the event loop, the pool's
connections and the database's cores are shared. So beyond the size of its text
(`ENGRAM_MAX_QUERY_TOKENS`), a request is held to:

- its depth (`ENGRAM_MAX_QUERY_DEPTH`), with each fragment measured once, however often it is
  spread (measured at every spread, a document of 30 fragments each spreading the one before
  twice took 2^30 steps: minutes of a blocked event loop), and fragments spread within
  fragments at most `MAX_FRAGMENT_NESTING` deep;
- the objects its answer may hold (`ENGRAM_MAX_QUERY_NODES`), each list counted at its page
  size (`first`; `nodes` at its `ids`): aliases and the loops of the schema (a record's
  `action`, whose `memories` hold records) repeat a page of 1,000 records as often as the
  text allows, 514 MB in one answer;
- the searches it may run (`ENGRAM_MAX_QUERY_SEARCHES`): each is a ranked query on the
  database, and aliases ran 50 of them at once, holding every pooled connection;
- introspection: the schema once (`__schema`), and at most `MAX_TYPES` types (`__type`);
- fields of one response name in one selection: at most `MAX_SAME_FIELD`, counted before
  validation, whose check that such fields merge compares them pairwise and deeper (300
  `viewer { principal }` took 0.6 s of the event loop, 1,200 took 1.4 s before it gave up).

The counts are upper bounds from the text and its variables, so a refusal costs nothing: the
request is refused whole, BAD_REQUEST saying what to ask for instead, before any of it runs
(a mutation included, as the rest of graphql/selection.py's rules refuse theirs).
"""

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLList,
    GraphQLNamedType,
    GraphQLNonNull,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    Undefined,
    ValidationRule,
    get_named_type,
    is_leaf_type,
    value_from_ast_untyped,
)
from graphql.validation import ValidationContext
from strawberry.extensions import SchemaExtension

from app.errors import BadInput
from app.graphql.node import MAX_IDS
from app.graphql.relay import MAX_PAGE
from app.graphql.selection import (
    Refusing,
    fragments_of,
    root_fields,
    runs,
)
from app.runtime.review import MAX_CANDIDATES

# Fragments spread within fragments: beyond this, graphql-core's own walks (and ours) would
# recurse past Python's stack; no client nests its fragments a tenth as deep.
MAX_FRAGMENT_NESTING = 100
# Fields that run a ranked search, and whether the field's arguments ask for one.
_SEARCHES = {
    "Action.searchMemories": lambda arguments: bool(str(arguments.get("query") or "").strip()),
    "ActionSession.searchHistory": lambda arguments: True,
}
# Introspection a request may ask for: the schema once, and this many types by name. Its
# answer is no list of records, so ENGRAM_MAX_QUERY_NODES does not count it; but 40 aliases of
# a full `__schema` held the event loop a second, for a client holding no grant at all.
MAX_TYPES = 20
# Fields of one response name (an alias, or the field's) one selection may hold, merged as
# execution merges them; a legible query repeats none.
MAX_SAME_FIELD = 100
# The arguments the counts read.
_COUNTED = frozenset({"first", "inputs", "query", "ids"})
# Lists that take no `first`, at the most items they hold (others: their page, or one).
_LIST_BOUNDS = {"RememberConversationResult.records": MAX_CANDIDATES}
# Lists of an object per ID they are given.
_BY_IDS = frozenset({"Query.nodes"})


def _spreads(selections: SelectionSetNode | None) -> Iterator[str]:
    """The fragments a selection spreads, at any depth of its fields."""
    stack = [selections]
    while stack:
        current = stack.pop()
        for node in current.selections if current else ():
            if isinstance(node, FragmentSpreadNode):
                yield node.name.value
            elif isinstance(node, FieldNode | InlineFragmentNode):
                stack.append(node.selection_set)


def _in_order(fragments: Mapping[str, FragmentDefinitionNode]) -> tuple[list[str], int]:
    """The fragments, each after every fragment it spreads (one of a cycle, which validation
    refuses, after the others of it), and the deepest nesting of spreads within spreads."""
    order: list[str] = []
    nesting: dict[str, int] = {}
    for start in fragments:
        if start in nesting:
            continue
        nesting[start] = 0  # on the path: a spread back to it is a cycle, counted as nothing
        stack = [(start, iter(list(_spreads(fragments[start].selection_set))))]
        while stack:
            name, pending = stack[-1]
            spread = next((s for s in pending if s in fragments and s not in nesting), None)
            if spread is not None:
                nesting[spread] = 0
                stack.append((spread, iter(list(_spreads(fragments[spread].selection_set)))))
                continue
            stack.pop()
            inner = [nesting[s] for s in _spreads(fragments[name].selection_set) if s in nesting]
            nesting[name] = 1 + max(inner, default=0)
            order.append(name)
    return order, max(nesting.values(), default=0)


def depth_rule(max_depth: int) -> type[ValidationRule]:
    """Refuses operations deeper than `max_depth` fields that select fields (introspection's
    own not counted), as strawberry's QueryDepthLimiter does, but measuring each fragment
    once; and documents whose fragments nest past MAX_FRAGMENT_NESTING."""

    class DepthLimit(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            fragments = fragments_of(context.document.definitions)
            order, nesting = _in_order(fragments)
            if nesting > MAX_FRAGMENT_NESTING:
                context.report_error(
                    GraphQLError(
                        f"fragments are spread within fragments {nesting} deep; at most "
                        f"{MAX_FRAGMENT_NESTING}"
                    )
                )
                return
            heights: dict[str, int] = {}

            def height(selections: SelectionSetNode | None) -> int:
                found = 0
                for node in selections.selections if selections else ():
                    if isinstance(node, FieldNode):
                        if node.selection_set and not node.name.value.startswith("__"):
                            found = max(found, 1 + height(node.selection_set))
                    elif isinstance(node, InlineFragmentNode):
                        found = max(found, height(node.selection_set))
                    elif isinstance(node, FragmentSpreadNode):
                        found = max(found, heights.get(node.name.value, 0))
                return found

            for name in order:
                heights[name] = height(fragments[name].selection_set)
            for definition in context.document.definitions:
                if not isinstance(definition, OperationDefinitionNode):
                    continue
                depth = height(definition.selection_set)
                if depth > max_depth:
                    operation = definition.name.value if definition.name else "anonymous"
                    context.report_error(
                        GraphQLError(
                            f"'{operation}' exceeds maximum operation depth of {max_depth} "
                            f"(ENGRAM_MAX_QUERY_DEPTH): it nests fields {depth} deep, and "
                            "nothing ran; ask for less nesting, and read what is deeper by "
                            "requests of its own (`node(id)` reads any object by its `id`)",
                            [definition],
                        )
                    )

    return DepthLimit


@dataclass(frozen=True)
class Cost:
    """What a selection costs, for one object it selects on, holding a page of `page` items
    (a connection's `first`): `nodes` objects in the answer and `searches` run, each the
    constant part plus the part per item of the page."""

    nodes: int = 0
    nodes_per_item: int = 0
    searches: int = 0
    searches_per_item: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        if other is NOTHING:
            return self
        return Cost(
            self.nodes + other.nodes,
            self.nodes_per_item + other.nodes_per_item,
            self.searches + other.searches,
            self.searches_per_item + other.searches_per_item,
        )

    def at(self, page: int) -> tuple[int, int]:
        """Objects and searches, for a page of `page` items."""
        return (
            self.nodes + self.nodes_per_item * page,
            self.searches + self.searches_per_item * page,
        )


NOTHING = Cost()


def _page(field: Any, arguments: Mapping[str, Any]) -> int | None:
    """The items a field's lists hold: its `first`, or as many as the records it writes."""
    if "first" in field.args:
        first = arguments.get("first", field.args["first"].default_value)
        # Out of range, the field refuses it itself, naming its own limit, and reads nothing.
        return first if isinstance(first, int) and 0 < first <= MAX_PAGE else 0
    inputs = arguments.get("inputs")
    return len(inputs) if isinstance(inputs, list) else None


def _by_ids(arguments: Mapping[str, Any]) -> int:
    """The objects of a list of `ids`: one per ID (a single ID, not in a list, is a list of
    one); past MAX_IDS, none: the field refuses them itself, naming its own limit."""
    ids = arguments.get("ids")
    count = len(ids) if isinstance(ids, list) else 1
    return count if count <= MAX_IDS else 0


def request_cost(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any],
) -> tuple[int, int]:
    """The most objects the operation's answer may hold and searches it may run."""
    costs: dict[str, Cost] = {}

    def cost(parent: GraphQLNamedType | None, selections: SelectionSetNode | None) -> Cost:
        total = NOTHING
        fields = getattr(parent, "fields", None) or {}
        for node in selections.selections if selections else ():
            if node.directives and not runs(node, variables):
                continue
            if isinstance(node, FieldNode):
                field = fields.get(node.name.value)
                if field is not None and not is_leaf_type(get_named_type(field.type)):
                    total += _field(parent, field, node)
            elif isinstance(node, InlineFragmentNode):
                condition = node.type_condition
                target = schema.get_type(condition.name.value) if condition else parent
                total += cost(target, node.selection_set)
            elif isinstance(node, FragmentSpreadNode):
                total += costs.get(node.name.value, NOTHING)
        return total

    def _field(parent: Any, field: Any, node: FieldNode) -> Cost:
        type_ = field.type.of_type if isinstance(field.type, GraphQLNonNull) else field.type
        named = get_named_type(type_)
        arguments = {
            # (graphql-core types the variables, which it only reads, as a dict.)
            a.name.value: value_from_ast_untyped(a.value, variables)  # type: ignore[arg-type]
            for a in node.arguments or ()
            if a.name.value in _COUNTED
        }
        arguments = {k: v for k, v in arguments.items() if v is not Undefined}
        name = f"{parent.name}.{node.name.value}"
        searches = int(_SEARCHES[name](arguments)) if name in _SEARCHES else 0
        page = _by_ids(arguments) if name in _BY_IDS else _page(field, arguments)
        inner = cost(named, node.selection_set)
        if isinstance(type_, GraphQLList):
            nodes, searches_each = inner.at(1)
            if page is None and name not in _LIST_BOUNDS:
                # Items of the enclosing object's page: a connection's edges and nodes.
                return Cost(0, 1 + nodes, searches, searches_each)
            items = page if page is not None else _LIST_BOUNDS[name]
            return Cost(items * (1 + nodes), 0, searches + items * searches_each, 0)
        # An object without a page of its own counts its unpaged lists as one item each.
        nodes, searches_each = inner.at(page if page is not None else 1)
        return Cost(1 + nodes, 0, searches + searches_each, 0)

    order, _ = _in_order(fragments)
    for name in order:
        fragment = fragments[name]
        costs[name] = cost(
            schema.get_type(fragment.type_condition.name.value), fragment.selection_set
        )
    root = schema.get_root_type(operation.operation)
    return cost(root, operation.selection_set).at(1)


def cost_refusal(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any],
    max_nodes: int,
    max_searches: int,
) -> str | None:
    """Why the operation asks for more than a request may, or None."""
    nodes, searches = request_cost(schema, operation, fragments, variables)
    if nodes > max_nodes:
        return (
            f"this request's answer could hold {nodes:,} objects, counting each list at its "
            f"`first`; a request may ask for at most {max_nodes:,} (ENGRAM_MAX_QUERY_NODES): "
            "nothing ran; ask for smaller pages, fewer aliases or less nesting, and page on"
        )
    roots = root_fields(operation.selection_set, fragments, variables)
    asked = Counter(node.name.value for node in roots)
    if asked["__schema"] > 1 or asked["__type"] > MAX_TYPES:
        return (
            f"this request asks for the schema {asked['__schema']} times and for "
            f"{asked['__type']} types; a request may ask for it once (`__schema`) and for at "
            f"most {MAX_TYPES} types (`__type`): nothing ran"
        )
    if searches > max_searches:
        return (
            f"this request would run {searches:,} searches (searchMemories with a query, "
            f"searchHistory, counted for each item of the lists they are in); a request may run "
            f"at most {max_searches} (ENGRAM_MAX_QUERY_SEARCHES): nothing ran; send the others "
            "in requests of their own"
        )
    return None


class RequestLimits(Refusing):
    """Answers BAD_REQUEST, instead of running the operation, when its answer could hold more
    objects, or it would run more searches, than a request may."""

    def __init__(self, *, max_nodes: int, max_searches: int) -> None:
        self.max_nodes, self.max_searches = max_nodes, max_searches

    def _refusal(self) -> BadInput | None:
        asked = self._asked()
        refusal = cost_refusal(*asked, self.max_nodes, self.max_searches) if asked else None
        return BadInput(refusal) if refusal else None


def _level(selections: SelectionSetNode, spread: Mapping[str, Counter[str]]) -> Counter[str]:
    """The response names of one selection, as execution merges them: through its inline
    fragments, and its spreads (`spread`: each fragment's own)."""
    names: Counter[str] = Counter()
    stack = [selections]
    while stack:
        for node in stack.pop().selections:
            if isinstance(node, FieldNode):
                names[(node.alias or node.name).value] += 1
            elif isinstance(node, InlineFragmentNode):
                stack.append(node.selection_set)
            elif isinstance(node, FragmentSpreadNode):
                names.update(spread.get(node.name.value, {}))
    return names


def repeated_field(document: DocumentNode) -> str | None:
    """Why a selection of the document holds too many fields of one name, or None."""
    fragments = fragments_of(document.definitions)
    spread: dict[str, Counter[str]] = {}
    for name in _in_order(fragments)[0]:
        spread[name] = _level(fragments[name].selection_set, spread)
    stack = [d.selection_set for d in document.definitions if hasattr(d, "selection_set")]
    while stack:
        current = stack.pop()
        repeated = _level(current, spread).most_common(1)
        if repeated and repeated[0][1] > MAX_SAME_FIELD:
            name, count = repeated[0]
            return (
                f"one selection asks for `{name}` {count:,} times, its fragments' fields "
                f"counted; at most {MAX_SAME_FIELD} fields of a selection may share a name (an "
                "alias, or the field's own): name them apart with aliases"
            )
        for node in current.selections:
            if getattr(node, "selection_set", None) is not None:
                stack.append(node.selection_set)
    return None


class RepeatedFields(SchemaExtension):
    """Refuses, before validation compares them pairwise, a document holding more than
    MAX_SAME_FIELD fields of one name (a document validated before passed it already)."""

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        document = context.graphql_document
        if document is not None and context.pre_execution_errors is None:
            refusal = repeated_field(document)
            if refusal is not None:
                context.pre_execution_errors = [
                    GraphQLError(refusal, original_error=BadInput(refusal))
                ]
        yield
