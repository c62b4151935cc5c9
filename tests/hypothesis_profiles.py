"""Hypothesis profiles for the whole test suite, selected by ``HYPOTHESIS_PROFILE``.

- ``fast`` (default; ``ci`` is the same profile): Hypothesis' usual 100 examples for cheap
  properties, few for expensive ones (:func:`examples`), **derandomised** (the examples
  are a function of the test alone, no example database), so a CI failure reproduces exactly
  on any machine with ``python -m pytest <the failing test>``.
- ``thorough``: many more examples and longer state-machine runs, random (a new seed per run,
  failures saved in ``.hypothesis/``); ``HYPOTHESIS_PROFILE=thorough python -m pytest
  tests/*/test_properties_*.py tests/backend/test_stateful_api.py --hypothesis-show-statistics``.

No profile has a deadline: the machine is shared, and timed assertions are banned in unit tests.

Imported by ``tests/conftest.py`` (so every test module sees the profile from its first
decorator on). Expensive properties take their example count from :func:`examples` instead of
the profile's ``max_examples``, so each one stays cheap in ``fast`` and grows in ``thorough``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILE", "THOROUGH", "examples", "steps"]

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("fast", max_examples=100, derandomize=True, database=None,
                          stateful_step_count=30, **_COMMON)
settings.register_profile("ci", parent=settings.get_profile("fast"))
settings.register_profile("thorough", max_examples=1000, stateful_step_count=60, **_COMMON)

#: The selected profile's name (``HYPOTHESIS_PROFILE``, default ``fast``).
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")
settings.load_profile(PROFILE)  # an unknown name raises InvalidArgument listing the known ones
THOROUGH = PROFILE == "thorough"


def examples(fast: int, thorough: int) -> int:
    """The ``max_examples`` of one expensive property: ``fast`` unless the thorough profile is
    selected."""
    return thorough if THOROUGH else fast


def steps(fast: int, thorough: int) -> int:
    """The ``stateful_step_count`` of one state machine, as :func:`examples`."""
    return thorough if THOROUGH else fast
