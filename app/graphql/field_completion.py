"""Execution with a short path for plain fields, the bulk of every page.

graphql-core completes each field of each object the same way: it builds the resolver's
info, calls strawberry's resolver, checks whether the result is awaitable, then completes
it by its type. A field that only reads a stored attribute (strawberry's basic field: no
resolver, arguments, permission or extension) needs none of that but the read and, by its
type, the coercion of a scalar or enum, or the execution of an object's (or each listed
object's) own fields; a page of 100 records holds about 2,000 such fields (bench/memory_api.py,
figures in bench/README.md). A leaf field guarded by a permission that can say when it lets the
read through (`allows(source, context)`, as Action's document fields) is read the same way once
that check, made once per object, says yes; a no takes strawberry's path, which refuses.
Whatever the short path would not return as graphql-core does (null where null is not
allowed, a value that does not coerce or is not of its type, a directive on the field,
deferred fragments) takes graphql-core's own path, before anything of it ran, so results and
errors stay graphql-core's; an error raised below an object is handled by graphql-core's
handle_field_error, as its own path does.

Both paths count the answer's size as they complete it (`ENGRAM_MAX_ANSWER_BYTES`, made a
class by `answer_budget`): the names of the fields an object's selection holds, the length of
each text value, and of each JSON value as JSON. The object counts were bounded before any of it
ran (app/graphql/limits.py), but not their text: nine aliases of a page of 1,000 agents' 64 KiB
instructions are 9,009 objects and 590 MB. Past the budget, the request is refused whole: no
further object is executed and no further page read (fields awaited together are cancelled;
those graphql-core settles in the background stop at their next object or read), and the answer
is `data: null` with one BAD_REQUEST error. As a request reads its pages two at a time
(app/graphql/context.py, Reads), the pages it holds when refused are the few read before the
budget was passed, not every page it asked for.

Fields awaited together run as tasks (gather_with_cancel), and when one fails its object or
list, the others are cancelled, and the tasks below them with them. A task cancelled before its
first step never runs its coroutine, so the coroutines that coroutine holds (a field's awaitable
is made before it is awaited: graphql-core's complete_awaitable_value and get_results,
strawberry's resolver, this module's awaited and guarded) were collected unawaited, each logging
"coroutine ... was never awaited" (bench/README.md, fuzz_graphql). This module's
gather_with_cancel, which graphql-core's executor is made to use too, runs them as tasks that,
cancelled before their first step, close those coroutines: none of them could run, none runs.
"""

import json
import sys
from asyncio import Future, Task, ensure_future, gather, get_running_loop
from collections.abc import Awaitable, Callable, Iterable
from functools import cache, partial
from inspect import CORO_CREATED, getcoroutinestate
from operator import attrgetter
from types import CoroutineType
from typing import Any, TypeGuard

from graphql import (
    ExecutionResult,
    GraphQLEnumType,
    GraphQLError,
    GraphQLField,
    GraphQLLeafType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    OperationType,
    Undefined,
    is_leaf_type,
)
from graphql.execution import executor as graphql_executor
from graphql.pyutils import Path
from strawberry.permission import PermissionExtension
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter

from app.errors import BadInput
from app.graphql.context import Context

LEAF, OBJECT, LIST = "leaf", "object", "list"
# How a plain field is completed: (kind, read, nullable, its type, then by kind: the leaf's
# coercion and its guard (None, or a permission check: _guard), or the object type and, for a
# list, its item type and whether items may be null).
Plain = tuple[Any, ...]
Step = tuple[str, Any, Plain | None]  # a selected field: its response name, details, plan
# A type's plain fields by name, keyed by the type's id(), with the type held so that the id
# names it as long as the entry lives.
_PLANS: dict[int, tuple[GraphQLObjectType, dict[str, Plain]]] = {}
_GUARDS: dict[tuple[Any, ...], Callable[[Any, Any], bool]] = {}


def _unstarted(held: object) -> "TypeGuard[CoroutineType[Any, Any, Any]]":
    return isinstance(held, CoroutineType) and getcoroutinestate(held) == CORO_CREATED


def _close_held(coro: "CoroutineType[Any, Any, Any]") -> None:
    """Close the coroutines that `coro`, which never started, holds (as arguments, in its
    closure, or as items of a list, tuple or dict there), and those they hold in turn: none of
    them can run once `coro` does not, and each, collected unclosed, logs that it was never
    awaited. All are found before any is closed, so that none is collected first. (A coroutine
    handed to another is that one's alone to await, as graphql-core's, strawberry's and this
    module's are: one also kept to be awaited elsewhere would be closed all the same.)"""
    found: dict[int, CoroutineType[Any, Any, Any]] = {}
    stack = [coro]
    while stack:
        frame = stack.pop().cr_frame
        if frame is None:
            continue
        for value in frame.f_locals.values():
            if isinstance(value, list | tuple):
                items: Iterable[object] = value
            elif isinstance(value, dict):
                items = value.values()
            else:
                items = (value,)
            for held in items:
                if _unstarted(held) and id(held) not in found:
                    found[id(held)] = held
                    stack.append(held)
    for held in found.values():
        held.close()


class _FieldTask(Task[Any]):
    """A task of gather_with_cancel. Cancelled before its first step (by gather_with_cancel,
    or by asyncio's gather when the task awaiting it is cancelled), it closes what its
    coroutine holds: that coroutine never runs, and neither will they."""

    def cancel(self, msg: Any = None) -> bool:
        coro = self.get_coro()
        if not self.done() and _unstarted(coro):
            _close_held(coro)
        return super().cancel(msg)


async def gather_with_cancel(*awaitables: Awaitable[Any]) -> list[Any]:
    """graphql-core's gather_with_cancel (the awaitables run at once; the first failure is
    raised once the others are cancelled and settled), with tasks that close, cancelled before
    they started, the coroutines they hold."""
    loop = get_running_loop()
    futures: list[Future[Any]] = [
        _FieldTask(aw, loop=loop) if isinstance(aw, CoroutineType) else ensure_future(aw)
        for aw in awaitables
    ]
    try:
        return await gather(*futures)
    except Exception:
        for future in futures:
            if not future.done():
                future.cancel()
        await gather(*futures, return_exceptions=True)
        raise


# graphql-core's executor gathers an object's fields, a list's items and a resolver's
# gather_async_work with its module's gather_with_cancel: with this one instead.
if not hasattr(graphql_executor, "gather_with_cancel"):  # pragma: no cover
    raise ImportError("graphql-core's executor no longer has gather_with_cancel to replace")
graphql_executor.gather_with_cancel = gather_with_cancel


class _Slow(Exception):
    """Raised before anything ran: graphql-core's own path completes the field."""


_SLOW = object()  # a field's result when graphql-core's own path is to complete it


def _size(value: Any) -> int:
    """A completed leaf's length in the answer, but for its name: a text's characters, a JSON
    value's as JSON (a number, boolean or null, a few)."""
    if value.__class__ is str:
        return len(value)
    if value.__class__ is int or value.__class__ is bool:
        return 4
    if isinstance(value, dict | list) and value:
        try:
            return len(json.dumps(value, ensure_ascii=False, check_circular=False, default=str))
        except (TypeError, ValueError, RecursionError):
            return len(str(value))
    return 4


def _unwrapped(type_: GraphQLOutputType) -> tuple[GraphQLOutputType, bool]:
    if isinstance(type_, GraphQLNonNull):
        return type_.of_type, False
    return type_, True


def _plain(field: GraphQLField) -> Plain | None:
    # A strawberry field without resolver or extensions (permissions are one) reads an attribute.
    definition = (field.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
    if definition is None:  # not a strawberry field
        return None
    if field.args or not getattr(definition, "is_basic_field", False):
        guard = _guard(definition)
        if field.args or guard is None:
            return None
        type_, nullable = _unwrapped(field.type)
        if not is_leaf_type(type_) or definition.default_resolver is not getattr:
            return None
        leaf = _coercion(type_)
        return LEAF, attrgetter(definition.python_name), nullable, field.type, leaf, guard
    read: Callable[[Any], Any]
    if definition.default_resolver is getattr:  # strawberry's default: read it directly
        read = attrgetter(definition.python_name)
    else:
        read = partial(definition.get_result, info=None, args=[], kwargs={})
    type_, nullable = _unwrapped(field.type)
    if is_leaf_type(type_):
        return LEAF, read, nullable, field.type, _coercion(type_), None
    if isinstance(type_, GraphQLObjectType):
        return OBJECT, read, nullable, field.type, type_
    if isinstance(type_, GraphQLList):
        item, item_nullable = _unwrapped(type_.of_type)
        if isinstance(item, GraphQLObjectType):
            return LIST, read, nullable, field.type, item, type_.of_type, item_nullable
    return None


def _guard(definition: Any) -> Callable[[Any, Any], bool] | None:
    """For a leaf field whose only extension is a permission whose classes each say, with
    `allows(source, context)`, when has_permission would let the read through: that check (a
    yes reads the attribute directly; a no takes strawberry's path, which refuses as before)."""
    extensions = getattr(definition, "extensions", None) or []
    if getattr(definition, "base_resolver", True) or len(extensions) != 1:
        return None
    permission = extensions[0]
    if not isinstance(permission, PermissionExtension) or not permission.permissions:
        return None
    checks: list[Callable[[Any, Any], bool]] = []
    for p in permission.permissions:
        allows = getattr(p, "allows", None)
        if not callable(allows):
            return None
        checks.append(allows)

    def guard(source: Any, context: Any) -> bool:
        return all(c(source, context) for c in checks)

    # One guard for the fields of alike permissions (the same classes with the same settings):
    # an object checks it once. Keyed by class alone, Needs("a") answered for Needs("b").
    try:
        key = tuple((type(p), tuple(sorted(vars(p).items()))) for p in permission.permissions)
        return _GUARDS.setdefault(key, guard)
    except TypeError:  # a setting that cannot be a key: the field's own guard
        return guard


def _coercion(leaf_type: GraphQLLeafType) -> Callable[[Any], Any]:
    """The leaf's output coercion; for a strawberry enum, its names by member in a dict
    (strawberry looks the name up among the enum's values one by one)."""
    members = getattr(leaf_type, "wrapped_cls", None)
    if not isinstance(leaf_type, GraphQLEnumType) or members is None:
        return leaf_type.coerce_output_value
    names = {m: name for name, v in leaf_type.values.items() for m in members if m.value == v.value}
    return lambda member: names.get(member) or leaf_type.coerce_output_value(member)


def _plan(parent_type: GraphQLObjectType) -> dict[str, Plain]:
    found = _PLANS.get(id(parent_type))
    if found is not None and found[0] is parent_type:
        return found[1]
    plain = {name: p for name, f in parent_type.fields.items() if (p := _plain(f)) is not None}
    _PLANS[id(parent_type)] = (parent_type, plain)
    return plain


def _of_type(object_type: GraphQLObjectType, value: Any) -> bool:
    is_type_of = object_type.is_type_of
    # strawberry's is_type_of reads only the value (an isinstance check): no info.
    return is_type_of is None or is_type_of(value, None) is True  # type: ignore[arg-type]


class ExecutionContext(StrawberryGraphQLCoreExecutionContext):
    max_answer_bytes = sys.maxsize  # answer_budget makes a class of a budget
    _answered = 0  # what this request's answer holds so far, as _size counts it
    _refusal: GraphQLError | None = None  # set once the answer passed max_answer_bytes
    # Each selection's steps (`_steps`), by the identities of its parent type and fields.
    _selections: dict[tuple[int, int], tuple[Any, Any, list[Step], int]] | None = None

    def _refuse(self) -> None:
        if self._refusal is None:
            written = (
                "; the change the mutation asked for was made: read it back in smaller pages"
                if self.operation.operation is OperationType.MUTATION
                else ""
            )
            message = (
                f"this request's answer passed {self.max_answer_bytes:,} bytes "
                "(ENGRAM_MAX_ANSWER_BYTES, counting its field names and the text of its values) "
                "before it was complete, and was not sent: ask for smaller pages or fewer "
                f"fields, and page on{written}"
            )
            self._refusal = GraphQLError(message, original_error=BadInput(message))
            if isinstance(self.context_value, Context):  # no further page is read
                self.context_value.reads.refusal = self._refusal
        raise self._refusal.with_traceback(None)

    def build_response(self, data: dict[str, Any] | None) -> Any:
        response = super().build_response(data)
        if self._refusal is None:
            return response
        return ExecutionResult(None, [self._refusal])  # the refusal alone, whatever else failed

    def handle_field_error(self, raw_error: Exception, *args: Any) -> None:
        if self._refusal is not None:  # no field nulled: the whole answer is refused
            self._refuse()
        super().handle_field_error(raw_error, *args)

    def complete_leaf_value(self, return_type: GraphQLLeafType, result: Any) -> Any:  # type: ignore[override]
        completed = super().complete_leaf_value(return_type, result)
        self._answered += _size(completed)
        if self._answered > self.max_answer_bytes:
            self._refuse()
        return completed

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Any,
        grouped_field_set: Any,
        *rest: Any,
    ) -> Any:
        if self._refusal is not None:  # nothing more runs
            self._refuse()
        middleware = self.middleware_manager
        if (middleware and middleware.middlewares) or (rest and rest[0] is not None):
            # Middleware wraps every field; a deferred fragment's fields are planned apart.
            return super().execute_fields(parent_type, source_value, path, grouped_field_set, *rest)
        steps, size = self._steps(parent_type, grouped_field_set)
        done: dict[str, Any] = {}  # by the short path: values, or awaitables named in pending
        others: dict[str, Any] = {}  # for graphql-core's path
        pending: list[str] = []
        allowed: dict[Any, bool] = {}  # by guard: its answer for this object
        try:
            for name, details, plain in steps:
                if plain is None:
                    others[name] = details
                    continue
                if plain[0] is LEAF:  # the most of them: inline
                    guard = plain[5]
                    if guard is not None:
                        if guard not in allowed:  # once per object and permission
                            allowed[guard] = guard(source_value, self.context_value)
                        if not allowed[guard]:
                            others[name] = details
                            continue
                    try:
                        value = plain[1](source_value)
                        completed = plain[4](value) if value is not None else None
                    except Exception:
                        completed = _SLOW
                    if completed is None:
                        completed = None if value is None and plain[2] else _SLOW
                    elif completed is Undefined:
                        completed = _SLOW
                    elif completed.__class__ is str:
                        size += len(completed)
                    elif completed.__class__ is not bool and completed.__class__ is not int:
                        size += _size(completed)
                else:
                    completed = self._plain_field(
                        plain, parent_type, source_value, path, name, details
                    )
                    if completed is not _SLOW and self.is_awaitable(completed):
                        pending.append(name)
                if completed is _SLOW:  # graphql-core completes it, and reports what fails
                    others[name] = details
                else:
                    done[name] = completed
            self._answered += size
            if self._answered > self.max_answer_bytes:
                self._refuse()
            if not others and not pending:
                return done
            completed = (
                super().execute_fields(parent_type, source_value, path, others, *rest)
                if others
                else {}
            )
        except Exception:
            if pending:  # settled, as graphql-core does when a field fails
                self.settle_in_background([done[n] for n in pending])
            raise
        # (The ignores: graphql-core's is_awaitable is a TypeGuard, which narrows only a yes.)
        if not pending and not self.is_awaitable(completed):
            return _in_order(grouped_field_set, done, completed)  # type: ignore[arg-type]

        async def awaited() -> dict[str, Any]:
            # Together, as graphql-core does: DataLoaders batch what they all load.
            others_pending = self.is_awaitable(completed)
            waits = [completed] if others_pending else []
            results = await gather_with_cancel(*waits, *(done[n] for n in pending))  # type: ignore[arg-type]
            done.update(zip(pending, results[len(waits) :], strict=True))
            return _in_order(grouped_field_set, done, results[0] if others_pending else completed)  # type: ignore[arg-type]

        return awaited()

    def _steps(self, parent_type: GraphQLObjectType, fields: Any) -> tuple[list[Step], int]:
        """The selection's fields, each with its plan (None: graphql-core's path), and the
        size of their names (the answer's count starts from it: numbers and booleans are
        bounded by their names). The same for every object a list holds, so found once a
        request and selection."""
        selections = self._selections
        if selections is None:
            selections = self._selections = {}
        found = selections.get((id(parent_type), id(fields)))
        if found is not None and found[0] is parent_type and found[1] is fields:
            return found[2], found[3]
        plan = _plan(parent_type)
        steps: list[Step] = []
        for name, details in fields.items():
            node = details[0].node
            plain = plan.get(node.name.value)
            steps.append((name, details, None if node.arguments or node.directives else plain))
        size = sum(map(len, fields))
        selections[(id(parent_type), id(fields))] = (parent_type, fields, steps, size)
        return steps, size

    def _plain_field(
        self,
        plain: Plain,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Any,
        name: str,
        details: Any,
    ) -> Any:
        """A plain object's or list's completed value (or an awaitable of it), or _SLOW."""
        kind, read, nullable, type_ = plain[:4]
        try:
            value = read(source_value)
        except Exception:
            return _SLOW
        if value is None:
            return None if nullable else _SLOW
        field_path = Path(path, name, parent_type.name)
        try:
            if kind is OBJECT:
                completed = self._object(plain[4], details, field_path, value)
            else:
                completed = self._list(plain, details, field_path, value)
        except _Slow:
            return _SLOW
        except Exception as raw_error:
            self.handle_field_error(raw_error, type_, details, field_path)
            return None
        if self.is_awaitable(completed):
            return self._guarded(completed, type_, details, field_path)
        return completed

    def _object(self, object_type: GraphQLObjectType, details: Any, path: Path, value: Any) -> Any:
        if not _of_type(object_type, value):
            raise _Slow
        sub_fields, defers, *_ = self.collect_subfields(object_type, details)
        if defers:
            raise _Slow
        return self.execute_fields(object_type, value, path, sub_fields, None)

    def _list(self, plain: Plain, details: Any, path: Path, items: Any) -> Any:
        object_type, item_type, item_nullable = plain[4:]
        if not isinstance(items, list | tuple):
            raise _Slow
        for item in items:
            if (item is None and not item_nullable) or not (
                item is None or _of_type(object_type, item)
            ):
                raise _Slow
        sub_fields, defers, *_ = self.collect_subfields(object_type, details)
        if defers:
            raise _Slow
        results: list[Any] = []
        pending: list[int] = []
        for index, item in enumerate(items):
            if item is None:
                results.append(None)
                continue
            item_path = path.add_key(index, None)
            try:
                completed = self.execute_fields(object_type, item, item_path, sub_fields, None)
            except Exception as raw_error:
                try:
                    self.handle_field_error(raw_error, item_type, details, item_path)
                except Exception:  # the list fails: the items started are settled
                    if pending:
                        self.settle_in_background([results[i] for i in pending])
                    raise
                completed = None
            if self.is_awaitable(completed):
                completed = self._guarded(completed, item_type, details, item_path)
                pending.append(index)
            results.append(completed)
        if not pending:
            return results

        async def awaited() -> list[Any]:
            completed = await gather_with_cancel(*(results[i] for i in pending))
            for index, value in zip(pending, completed, strict=True):
                results[index] = value
            return results

        return awaited()

    def _guarded(
        self, completed: Awaitable[Any], type_: GraphQLOutputType, details: Any, path: Path
    ) -> Awaitable[Any]:
        async def guarded() -> Any:
            try:
                return await completed
            except Exception as raw_error:
                self.handle_field_error(raw_error, type_, details, path)
                return None

        return guarded()


@cache
def answer_budget(max_bytes: int) -> type[ExecutionContext]:
    """The execution context that refuses an answer past `max_bytes` (one class per budget)."""
    return type("BudgetedExecutionContext", (ExecutionContext,), {"max_answer_bytes": max_bytes})


def _in_order(fields: Any, done: dict[str, Any], others: dict[str, Any]) -> dict[str, Any]:
    """The results in the order the query asked for them, as graphql-core returns them."""
    if not done:
        return others
    return {
        name: done[name] if name in done else others[name]
        for name in fields
        if name in done or name in others
    }
