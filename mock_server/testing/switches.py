"""In-process switches: a mock built to behave differently on purpose, for tests of clients and
of the conformance suite. Nothing outside ``mock_server.testing`` names a switch.

A switch belongs to a :class:`Family`; the families are

- ``violations`` (:mod:`.violations`): each breaks one contract rule, to prove the
  conformance suite fails exactly that rule;
- ``legal_variants`` (:mod:`.variants`): each uses a freedom the contract leaves
  a server (extra response fields, other error types for situations it does not name,
  ``Whitney-Replayed: false`` on first executions, another vocabulary size, other limits,
  fewer features or losses), to prove the suite does not fail a conforming server.

A family acts through the seams a faithful mock keeps trivial: a ``Backend`` subclass that
overrides seam methods (it reads the chosen names from its ``switches`` class attribute), a
wrapper of the app's request-body reader, and ASGI middleware for what only shows on the wire.
:func:`create_app_with` builds the app with every chosen switch on; ``create_app(violations=...)``
delegates to it.

To add a switch: name and describe it in its family's catalogue (``VIOLATIONS`` or
``LEGAL_VARIANTS``), implement it in that family's module (a ``Backend`` subclass overriding
seams, and/or a reader or middleware), and list what the conformance suite must make of it in
``tests/testing/test_conformance_violations.py`` or ``tests/testing/test_legal_variants.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware

from ..backend.state import Backend
from ..http.app import create_app
from ..http.endpoints import BodyReader, read_json
from .variants import LEGAL_VARIANTS, VariantBackend, variant_middleware, variant_reader
from .violations import VIOLATIONS, ViolatingBackend, violating_middleware, violating_reader

__all__ = ["FAMILIES", "LEGAL_VARIANTS", "LEGAL_VARIANT_FAMILY", "VIOLATION_FAMILY", "Family",
           "create_app_with"]


@dataclass(frozen=True)
class Family:
    """One family of switches: their names and what they change, and how they act.

    ``backend``: a ``Backend`` subclass overriding seams; ``reader(switches, read)``: wraps
    the app's body reader; ``middleware(switches)``: wire-level ASGI middleware. Each part
    receives (or, for ``backend``, reads from ``self.switches``) the chosen switch names.
    """

    keyword: str
    noun: str
    catalogue: Mapping[str, str]
    backend: type[Backend] | None = None
    reader: Callable[[frozenset[str], BodyReader], BodyReader] | None = None
    middleware: Callable[[frozenset[str]], Sequence[Middleware]] | None = None

    def check(self, names: Iterable[str]) -> frozenset[str]:
        """The chosen names; an unknown one is refused (a typo must not silently test the
        faithful mock)."""
        chosen = frozenset(names)
        unknown = sorted(chosen - set(self.catalogue))
        if unknown:
            raise ValueError(f"unknown {self.noun}(s) {unknown}; known: {sorted(self.catalogue)}")
        return chosen


VIOLATION_FAMILY = Family("violations", "violation", VIOLATIONS, backend=ViolatingBackend,
                          reader=violating_reader, middleware=violating_middleware)
LEGAL_VARIANT_FAMILY = Family("legal_variants", "legal variant", LEGAL_VARIANTS,
                              backend=VariantBackend, reader=variant_reader,
                              middleware=variant_middleware)

#: Every family by its ``create_app_with`` keyword; a switch name belongs to one family only.
FAMILIES: dict[str, Family] = {f.keyword: f for f in (VIOLATION_FAMILY, LEGAL_VARIANT_FAMILY)}


def create_app_with(*, violations: Iterable[str] = (), legal_variants: Iterable[str] = (),
                    **options: Any) -> Starlette:
    """``create_app(**options)`` with the named switches on (each family's names checked)."""
    given = {"violations": violations, "legal_variants": legal_variants}
    chosen = [(family, names) for keyword, family in FAMILIES.items()
              if (names := family.check(given[keyword]))]
    if not chosen:
        return create_app(**options)
    switches = frozenset().union(*(names for _, names in chosen))
    bases = tuple(family.backend for family, _ in chosen if family.backend is not None)
    backend_class = type("SwitchedBackend", bases or (Backend,), {"switches": switches})
    read: BodyReader = read_json
    middleware: list[Middleware] = []
    for family, names in chosen:
        if family.reader is not None:
            read = family.reader(names, read)
        if family.middleware is not None:
            middleware.extend(family.middleware(names))
    return create_app(**options, backend_factory=backend_class, body_reader=read,
                      middleware=middleware)
