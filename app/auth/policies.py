"""The one place that decides grants.

A policy is `{effect: ALLOW|DENY, actions: [SELECT|INSERT|UPDATE|DELETE], resources: [...]}`.
Resources are dotted names such as `financial.AgentMemory.document`; a pattern may use `*`
(any run of characters, dots included) and `?` (any one character). A request is allowed
when at least one ALLOW matches it and no DENY does.

Patterns are never regular expressions: the resources a request can name are few and fixed
(`resources.KNOWN`), so each pattern is resolved once, when its policy is parsed, to the set
of known resources it matches, and a check is a set look-up. `glob_match` does that
resolution (and matches the rare name outside the set) in at most len(pattern) x len(name)
steps, however many wildcards the pattern holds.
"""

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError, ValidationInfo

from app.auth.resources import KNOWN
from app.errors import AccessDenied, BadInput
from app.shapes import WRITTEN, Shape, first_error, refuse

log = logging.getLogger(__name__)

Effect = Literal["ALLOW", "DENY"]
Verb = Literal["SELECT", "INSERT", "UPDATE", "DELETE"]
EFFECTS: tuple[str, ...] = ("ALLOW", "DENY")
VERBS: tuple[str, ...] = ("SELECT", "INSERT", "UPDATE", "DELETE")
_RESOURCE = re.compile(r"^[A-Za-z0-9_.*?]+$")
# Limits on what a client may write (stored policies load whatever they hold).
MAX_PATTERN_CHARS = 200
MAX_POLICIES = 100
MAX_RESOURCES = 100
_WARNED_MAX = 1024


def glob_match(pattern: str, name: str) -> bool:
    """Whether `name` matches `pattern` whole, `*` any run of characters and `?` any one.

    Greedy, going back only to the latest `*`: a later star can only extend what an earlier
    one would have, so no other choice needs revisiting.
    """
    p = n = 0
    star = -1  # pattern index just after the latest `*`
    star_n = 0  # the name index that star's run ends at, so far
    while n < len(name):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == name[n]):
            p += 1
            n += 1
        elif p < len(pattern) and pattern[p] == "*":
            p += 1
            star, star_n = p, n
        elif star >= 0:
            star_n += 1
            p, n = star, star_n
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


@lru_cache(maxsize=4096)
def resolve(pattern: str) -> frozenset[str]:
    """The known resources `pattern` matches."""
    return frozenset(name for name in KNOWN if glob_match(pattern, name))


@lru_cache(maxsize=4096)
def _match_other(pattern: str, name: str) -> bool:
    """A name outside KNOWN (a resource added without being listed there): still bounded."""
    return glob_match(pattern, name)


@dataclass(frozen=True)
class Policy:
    effect: Effect
    actions: tuple[Verb, ...]
    resources: tuple[str, ...]
    matched: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matched", frozenset().union(*map(resolve, self.resources)))

    def matches(self, verb: str, resource: str) -> bool:
        if verb not in self.actions:
            return False
        if resource in KNOWN:
            return resource in self.matched
        return any(_match_other(p, resource) for p in self.resources)

    def as_json(self) -> dict[str, Any]:
        return {
            "effect": self.effect,
            "actions": list(self.actions),
            "resources": list(self.resources),
        }


_warned: set[str] = set()


def forget_warnings() -> None:
    """Forgets which stored patterns were warned about, as a restart does: each is warned about
    once more (tests use it to start from a known state)."""
    _warned.clear()
    _stored.cache_clear()  # stored policies parsed before would not be parsed (nor warned) again


def _warn_unmatched(pattern: str) -> None:
    if pattern in _warned or len(_warned) >= _WARNED_MAX:
        return
    _warned.add(pattern)
    log.warning(
        "a stored policy names %r, which matches no known resource (%s): it grants or denies "
        "nothing; update the client's policies",
        pattern,
        ", ".join(sorted(KNOWN)),
    )


def _effect(value: Any) -> Any:
    if value not in EFFECTS:
        raise refuse(f"must be ALLOW or DENY, got {value!r}")
    return value


def _verbs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise refuse(f"must be a list naming at least one of {', '.join(VERBS)}")
    for verb in value:
        if verb not in VERBS:
            raise refuse(f"{verb!r} is not one of {', '.join(VERBS)}", inline=False)
    return tuple(value)


def _resources(value: Any, info: ValidationInfo) -> tuple[str, ...]:
    strict = bool(info.context and info.context.get("strict"))
    if not isinstance(value, list | tuple) or not value:
        raise refuse("must be a list naming at least one resource")
    if strict and len(value) > MAX_RESOURCES:
        raise refuse(f"may name at most {MAX_RESOURCES} resources")
    for resource in value:
        if not isinstance(resource, str) or not _RESOURCE.fullmatch(resource):
            raise refuse(
                f"{resource!r} is not a resource name "
                "(letters, digits, '_', '.', and the wildcards '*' and '?')",
                inline=False,
            )
        if strict and len(resource) > MAX_PATTERN_CHARS:
            raise refuse(
                f"a pattern is at most {MAX_PATTERN_CHARS} characters, got {len(resource)}",
                inline=False,
            )
        if not resolve(resource):
            if strict:
                raise refuse(
                    f"{resource!r} matches no known resource (names are case-sensitive); the "
                    f"resources are: {', '.join(sorted(KNOWN))}",
                    inline=False,
                )
            _warn_unmatched(resource)
    return tuple(value)


class _PolicyShape(Shape):
    not_object = (
        "must be an object such as "
        '{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.*"]}'
    )
    # Validated even when left out, to say what is missing.
    effect: Annotated[Effect, BeforeValidator(_effect)] = Field(None, validate_default=True)
    actions: Annotated[tuple[Verb, ...], BeforeValidator(_verbs)] = Field(
        None,
        validate_default=True,
    )
    resources: Annotated[tuple[str, ...], BeforeValidator(_resources)] = Field(
        None,
        validate_default=True,
    )


_POLICIES = TypeAdapter(list[_PolicyShape])


def parse_policies(raw: Iterable[Mapping[str, Any]], *, strict: bool = False) -> tuple[Policy, ...]:
    """Validates policies given by a client (`strict`) or read from the database.

    `strict` also refuses what a stored policy is forgiven: a pattern longer than
    MAX_PATTERN_CHARS, too many policies or resources, and a pattern that matches no known
    resource (a typo such as `financial.agentmemory.*` would silently grant or deny nothing).
    Read from the database, such a pattern still loads, with one warning.
    """
    items = list(raw)
    if not strict:
        # Read for every request a client makes: a client's policies are parsed once.
        return _stored(json.dumps(items, sort_keys=True))
    if len(items) > MAX_POLICIES:
        raise BadInput(f"a client holds at most {MAX_POLICIES} policies")
    return _parse(items, strict=True)


@lru_cache(maxsize=1024)
def _stored(text: str) -> tuple[Policy, ...]:
    return _parse(json.loads(text), strict=False)


def _parse(items: list[Any], *, strict: bool) -> tuple[Policy, ...]:
    try:
        shapes = _POLICIES.validate_python(items, context={**WRITTEN, "strict": strict})
    except ValidationError as e:
        raise BadInput(first_error(e, "policies", inline=True)) from None
    return tuple(Policy(p.effect, p.actions, p.resources) for p in shapes)


def is_allowed(policies: Sequence[Policy], verb: str, resource: str) -> bool:
    allowed = False
    for policy in policies:
        if policy.matches(verb, resource):
            if policy.effect == "DENY":
                return False
            allowed = True
    return allowed


def require(policies: Sequence[Policy], *grants: tuple[str, str]) -> None:
    """Raises AccessDenied naming the first (verb, resource) the policies do not allow."""
    for verb, resource in grants:
        if not is_allowed(policies, verb, resource):
            raise AccessDenied(f"this client is not allowed to {verb} {resource}")


# Stand-ins for resources a later release may add, one under each dotted prefix of a known
# name ("financial.AgentMemory.__later__", ...): a pattern wider than today's names
# (`financial.AgentMemory.*`) grants those too, and an explicit list of today's names does not.
_LATER = "__later__"
LATER: frozenset[str] = frozenset(
    ".".join([*name.split(".")[:i], _LATER]) for name in KNOWN for i in range(name.count(".") + 1)
)


def rights(policies: Sequence[Policy]) -> frozenset[tuple[str, str]]:
    """Every (verb, resource) the policies allow, of the known resources and of the stand-ins
    for those a later release may add (`LATER`)."""
    return frozenset((v, r) for r in KNOWN | LATER for v in VERBS if is_allowed(policies, v, r))


def _named(resource: str) -> str:
    if resource.endswith(_LATER):
        return resource.removesuffix(_LATER) + "* (resources a later release adds there)"
    return resource


def missing_rights(held: Sequence[Policy], other: Sequence[Policy]) -> list[tuple[str, str]]:
    """Every (verb, resource) `other` allows and `held` does not, today's resources first."""
    return sorted(
        rights(other) - rights(held),
        key=lambda g: (g[1] in LATER, g[1], VERBS.index(g[0])),
    )


def covers(held: Sequence[Policy], other: Sequence[Policy]) -> bool:
    """Whether `held` allows all that `other` does: what `require_covers` asks."""
    return not missing_rights(held, other)


def require_covers(held: Sequence[Policy], other: Sequence[Policy], what: str) -> None:
    """Raises AccessDenied unless `held` allows all that `other` does, naming what it lacks
    after `what` ("client 'x' holds").

    A client may give a client policies, issue it a token, or change it only when it holds
    every grant that client would hold: managing clients is not a way to more. (Deleting a
    client and revoking a token take rights away, and are not held back.)
    """
    missing = missing_rights(held, other)
    if not missing:
        return
    named = ", ".join(f"{verb} {_named(resource)}" for verb, resource in missing[:4])
    if len(missing) > 4:
        named += f" and {len(missing) - 4} more"
    raise AccessDenied(
        f"{what} {named}, which this client does not hold: a client gives only grants it holds, "
        "and changes or issues tokens only for clients that hold no more than it does"
    )


ADMIN_POLICIES: tuple[Policy, ...] = (Policy("ALLOW", tuple(VERBS), ("*",)),)  # type: ignore[arg-type]
