"""Test support for code that talks to Whitney: ``MockWhitney`` (:mod:`.mock`), the pytest plugin
(:mod:`.plugin`), and the in-process switches that prove the conformance suite's reach
(violations) and its tolerance (legal variants) (:mod:`.switches`, :mod:`.violations`).

Public surface (imported lazily, so ``import mock_server.testing`` costs nothing until a
name is used)::

    MockWhitney, MockControlError, DEFAULT_API_KEY, IN_PROCESS_BASE_URL, TraceEntry
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .mock import (
        DEFAULT_API_KEY,
        IN_PROCESS_BASE_URL,
        MockControlError,
        MockWhitney,
        TraceEntry,
    )

__all__ = ["DEFAULT_API_KEY", "IN_PROCESS_BASE_URL", "MockControlError", "MockWhitney",
           "TraceEntry"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import mock

        return getattr(mock, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
