"""One pytest test per registered check (``pytest --pyargs conformance``).

Test ids are the check ids (``ORD-2:seq-gap``): ``-k "ORD-2 or VER"`` selects by rule.
Checks that aggregate over every response (``run_last``) come last.
"""

from __future__ import annotations

import warnings

import pytest

from conformance.checks import all_checks
from conformance.registry import Check, Level, Status
from conformance.runner import Suite

_CHECKS = [c for c in all_checks() if not c.run_last] + [c for c in all_checks() if c.run_last]


class ConformanceWarning(UserWarning):
    """A SHOULD that fails, or a clause the endpoint did not let the suite exercise."""


@pytest.mark.parametrize("entry", _CHECKS, ids=[c.id for c in _CHECKS])
def test_rule(entry: Check, whitney_suite: Suite) -> None:
    outcome = whitney_suite.run_check(entry)
    label = f"{entry.rule} ({entry.level.value}): {entry.title}"
    if outcome.status is Status.UNSUPPORTED:
        pytest.skip(f"unsupported: {outcome.detail}")
    if outcome.status in (Status.FAIL, Status.ERROR) and entry.level is not Level.SHOULD:
        pytest.fail(f"{label}\n{outcome.status.value}: {outcome.detail}", pytrace=False)
    if outcome.status is Status.STRICT:
        pytest.fail(f"{label}\nstrict-only finding (the contract passes; the endpoint differs "
                    f"from the mock's exact shapes): {outcome.detail}", pytrace=False)
    if outcome.status is Status.WARN:
        warnings.warn(ConformanceWarning(f"{entry.id}: {outcome.detail}"), stacklevel=1)
