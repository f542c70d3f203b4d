"""The one place that decides grants.

A policy is `{effect: ALLOW|DENY, actions: [SELECT|INSERT|UPDATE|DELETE], resources: [...]}`.
Resources are dotted names such as `financial.AgentMemory.document`; a pattern may use `*`
(any run of characters, dots included) and `?` (any one character). A request is allowed
when at least one ALLOW matches it and no DENY does.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from app.errors import AccessDenied, BadInput

Effect = Literal["ALLOW", "DENY"]
Verb = Literal["SELECT", "INSERT", "UPDATE", "DELETE"]
EFFECTS: tuple[str, ...] = ("ALLOW", "DENY")
VERBS: tuple[str, ...] = ("SELECT", "INSERT", "UPDATE", "DELETE")
_RESOURCE = re.compile(r"^[A-Za-z0-9_.*?]+$")
_FIELDS = ("effect", "actions", "resources")


@dataclass(frozen=True)
class Policy:
    effect: Effect
    actions: tuple[Verb, ...]
    resources: tuple[str, ...]

    def matches(self, verb: str, resource: str) -> bool:
        return verb in self.actions and any(_pattern(p).fullmatch(resource) for p in self.resources)

    def as_json(self) -> dict[str, Any]:
        return {
            "effect": self.effect,
            "actions": list(self.actions),
            "resources": list(self.resources),
        }


@lru_cache(maxsize=4096)
def _pattern(glob: str) -> re.Pattern[str]:
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    )


def parse_policies(raw: Iterable[Mapping[str, Any]]) -> tuple[Policy, ...]:
    """Validates policies given by a client or read from the database."""
    policies = []
    for i, item in enumerate(raw):
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
        for resource in resources:
            if not isinstance(resource, str) or not _RESOURCE.fullmatch(resource):
                raise BadInput(
                    f"policies[{i}].resources: {resource!r} is not a resource name "
                    "(letters, digits, '_', '.', and the wildcards '*' and '?')"
                )
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
