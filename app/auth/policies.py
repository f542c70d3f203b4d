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

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from app.auth.resources import KNOWN
from app.errors import AccessDenied, BadInput

log = logging.getLogger(__name__)

Effect = Literal["ALLOW", "DENY"]
Verb = Literal["SELECT", "INSERT", "UPDATE", "DELETE"]
EFFECTS: tuple[str, ...] = ("ALLOW", "DENY")
VERBS: tuple[str, ...] = ("SELECT", "INSERT", "UPDATE", "DELETE")
_RESOURCE = re.compile(r"^[A-Za-z0-9_.*?]+$")
_FIELDS = ("effect", "actions", "resources")
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


def parse_policies(raw: Iterable[Mapping[str, Any]], *, strict: bool = False) -> tuple[Policy, ...]:
    """Validates policies given by a client (`strict`) or read from the database.

    `strict` also refuses what a stored policy is forgiven: a pattern longer than
    MAX_PATTERN_CHARS, too many policies or resources, and a pattern that matches no known
    resource (a typo such as `financial.agentmemory.*` would silently grant or deny nothing).
    Read from the database, such a pattern still loads, with one warning.
    """
    policies = []
    for i, item in enumerate(raw):
        if strict and i >= MAX_POLICIES:
            raise BadInput(f"a client holds at most {MAX_POLICIES} policies")
        if not isinstance(item, Mapping):
            raise BadInput(
                f"policies[{i}] must be an object such as "
                '{"effect": "ALLOW", "actions": ["SELECT"], "resources": ["financial.*"]}'
            )
        unknown = sorted(set(item) - set(_FIELDS))
        if unknown:
            raise BadInput(
                f"policies[{i}]: unknown field {unknown[0]!r}; allowed: {', '.join(_FIELDS)}"
            )
        effect = item.get("effect")
        actions = item.get("actions") or []
        resources = item.get("resources") or []
        if effect not in EFFECTS:
            raise BadInput(f"policies[{i}].effect must be ALLOW or DENY, got {effect!r}")
        if not isinstance(actions, list | tuple) or not actions:
            raise BadInput(
                f"policies[{i}].actions must be a list naming at least one of {', '.join(VERBS)}"
            )
        for verb in actions:
            if verb not in VERBS:
                raise BadInput(f"policies[{i}].actions: {verb!r} is not one of {', '.join(VERBS)}")
        if not isinstance(resources, list | tuple) or not resources:
            raise BadInput(f"policies[{i}].resources must be a list naming at least one resource")
        if strict and len(resources) > MAX_RESOURCES:
            raise BadInput(f"policies[{i}].resources may name at most {MAX_RESOURCES} resources")
        for resource in resources:
            if not isinstance(resource, str) or not _RESOURCE.fullmatch(resource):
                raise BadInput(
                    f"policies[{i}].resources: {resource!r} is not a resource name "
                    "(letters, digits, '_', '.', and the wildcards '*' and '?')"
                )
            if strict and len(resource) > MAX_PATTERN_CHARS:
                raise BadInput(
                    f"policies[{i}].resources: a pattern is at most {MAX_PATTERN_CHARS} "
                    f"characters, got {len(resource)}"
                )
            if not resolve(resource):
                if strict:
                    raise BadInput(
                        f"policies[{i}].resources: {resource!r} matches no known resource "
                        f"(names are case-sensitive); the resources are: "
                        f"{', '.join(sorted(KNOWN))}"
                    )
                _warn_unmatched(resource)
        policies.append(Policy(effect, tuple(actions), tuple(resources)))
    return tuple(policies)


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


ADMIN_POLICIES: tuple[Policy, ...] = (Policy("ALLOW", tuple(VERBS), ("*",)),)  # type: ignore[arg-type]
