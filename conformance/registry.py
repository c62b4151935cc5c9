"""The check registry: every conformance check names a contract rule id and a level.

A check is a function ``check(ctx) -> None`` decorated with :func:`check`. It passes by
returning, and reports anything else by raising one of the outcome exceptions below. Several
checks may cite the same rule id (ERR-2 has many clauses); the report aggregates them per rule.

Levels:

- ``MUST``: a failure fails the run (exit code 1).
- ``SHOULD``: a failure is reported as ``warn`` and does not change the exit code.
- ``OPTIONAL``: a rule that applies only when ``GET /capabilities`` declares ``capability``.
  Undeclared -> ``unsupported`` (never ``pass``); declared and failing -> ``fail`` (a declared
  capability is a promise, so it then counts like a MUST).

Strict-only findings: a check notes a difference from the mock's exact shapes or choices that
the contract allows (EXT-1) with ``ctx.strict_only(...)`` and goes on; under ``--profile
strict`` a check that otherwise passes is then reported ``strict``, never ``fail``.

A leaf: imports nothing of the package; the checks register into it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Level", "Status", "Check", "CheckFailed", "CheckWarning", "CheckUnsupported",
    "check", "registered", "select", "family_of", "FAMILIES",
]

# Report order of the rule families (contract order, then the suite's own schema family).
FAMILIES = (
    "TRANSPORT", "SEC", "ERR", "DISC", "LIFE", "ORD", "VER", "LOSS", "OPT", "GRAD", "SAMPLE",
    "CKPT", "EXPORT", "SCHEMA",
)

# A check receives the suite's context (``conformance.context.Ctx``; not imported here, the
# registry stays a leaf) and passes by returning.
CheckFunc = Callable[[Any], None]

_RULE_RE = re.compile(r"^([A-Z]+)-(\d+)$")


class Level(str, enum.Enum):
    MUST = "MUST"
    SHOULD = "SHOULD"
    OPTIONAL = "OPTIONAL"


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    UNSUPPORTED = "unsupported"
    ERROR = "error"  # the check itself crashed (transport error, bug); counts as a failure
    NOT_RUN = "not_run"  # interrupted, or skipped after a failure without --keep-going
    # --profile strict only: the contract passes, but the endpoint differs from the mock's exact
    # shapes or choices (strict-only findings). Never a contract failure.
    STRICT = "strict"


class CheckFailed(AssertionError):
    """The endpoint violates the rule; the message is the failing detail."""


class CheckWarning(Exception):
    """Not a violation, but something the user should see (a clause not exercisable here)."""


class CheckUnsupported(Exception):
    """The endpoint does not declare what the check needs (or the suite lacks an input, e.g.
    the second API key for SEC-2)."""


@dataclass(frozen=True)
class Check:
    """One registered check."""

    rule: str
    name: str
    level: Level
    title: str
    func: CheckFunc = field(compare=False, repr=False)
    capability: str | None = None
    needs_second_key: bool = False
    run_last: bool = False
    slow: bool = False  # mostly waiting (TTL expiry, order_wait_ms): runs beside the others

    @property
    def id(self) -> str:
        """Unique id ``RULE:name`` (pytest parametrization id, report key)."""
        return f"{self.rule}:{self.name}"

    @property
    def family(self) -> str:
        return family_of(self.rule)


_REGISTRY: dict[str, Check] = {}


def family_of(rule: str) -> str:
    match = _RULE_RE.match(rule)
    if not match:
        raise ValueError(f"rule id {rule!r} is not FAMILY-N")
    return match.group(1)


def check(
    rule: str,
    name: str,
    *,
    level: Level = Level.MUST,
    title: str,
    capability: str | None = None,
    needs_second_key: bool = False,
    run_last: bool = False,
    slow: bool = False,
) -> Callable[[CheckFunc], CheckFunc]:
    """Register ``func`` as the check ``rule:name``.

    ``capability`` is a dotted path into the capabilities document that must be declared
    (truthy) for the check to apply, e.g. ``features.session_ttl``, ``loss_functions.ppo`` or
    ``primitives.logprobs`` (membership in a list). It implies ``level=OPTIONAL``.
    """
    family = family_of(rule)
    if family not in FAMILIES:
        raise ValueError(f"unknown rule family {family!r} in {rule!r}")
    if capability is not None:
        level = Level.OPTIONAL
    elif level is Level.OPTIONAL:
        raise ValueError(f"{rule}:{name}: OPTIONAL needs a capability")

    def decorate(func: CheckFunc) -> CheckFunc:
        entry = Check(rule=rule, name=name, level=level, title=title, func=func,
                      capability=capability, needs_second_key=needs_second_key,
                      run_last=run_last, slow=slow)
        if entry.id in _REGISTRY and _REGISTRY[entry.id].func is not func:
            raise ValueError(f"check {entry.id} registered twice")
        _REGISTRY[entry.id] = entry
        return func

    return decorate


def registered() -> list[Check]:
    """Every check registered so far, in family order then rule number then registration
    order. The suite's checks register when :mod:`conformance.checks` is imported; use
    ``conformance.checks.all_checks()`` to get them all."""
    order = {family: i for i, family in enumerate(FAMILIES)}
    indexed = list(enumerate(_REGISTRY.values()))
    indexed.sort(key=lambda item: (order[item[1].family], int(item[1].rule.split("-")[1]),
                                   item[0]))
    return [entry for _, entry in indexed]


def select(checks: list[Check], only: list[str] | None) -> list[Check]:
    """Filter by ``--only`` prefixes (``ORD``, ``ORD-2``, ``ORD-2:replay``); matches on rule
    ids ``ORD-2`` and ``ORD-20`` are kept apart (``ORD-2`` does not select ``ORD-20``)."""
    if not only:
        return list(checks)

    def wanted(entry: Check) -> bool:
        for prefix in only:
            prefix = prefix.strip()
            if not prefix:
                continue
            if ":" in prefix:
                if entry.id.startswith(prefix):
                    return True
            elif _RULE_RE.match(prefix):
                if entry.rule == prefix:
                    return True
            elif entry.rule.startswith(prefix):
                return True
        return False

    return [entry for entry in checks if wanted(entry)]
