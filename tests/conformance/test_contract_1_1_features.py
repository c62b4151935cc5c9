"""The conformance suite's checks of contract 1.1's optional features (LIFE-9, LIFE-10, ORD-6,
EXPORT-2): ``unsupported`` on a server that does not declare them (the mock built as a 1.0
server feature by feature), ``pass`` on the mock that declares them, and nothing else changes:
every other check passes either way. That they can fail is in
``tests/testing/test_conformance_violations.py`` (one switch per rule, declared then broken).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance import open_target, run_suite
from conformance.options import Options
from conformance.registry import Level, Status
from mock_server import Features

NEW_RULES = {"LIFE-9": "idempotent_create", "LIFE-10": "session_listing",
             "ORD-6": "seq_error_details", "EXPORT-2": "exports_after_close"}


def run(features: Features):
    target = open_target(use_env=False, mock_options={"order_wait_ms": 300,
                                                      "features": features})
    try:
        return run_suite(target, options=Options(profile="contract", fuzz_examples=1))
    finally:
        target.close()


@pytest.mark.parametrize("off", [tuple(NEW_RULES.values()), ("session_listing",),
                                 ("idempotent_create", "exports_after_close")])
def test_undeclared_features_are_unsupported_and_nothing_else_moves(off) -> None:
    features = replace(Features(), **{name: False for name in off})
    summary = run(features)
    by_rule: dict[str, set[Status]] = {}
    for outcome in summary.outcomes:
        by_rule.setdefault(outcome.check.rule, set()).add(outcome.status)
    for rule, feature in NEW_RULES.items():
        expected = Status.UNSUPPORTED if feature in off else Status.PASS
        assert by_rule[rule] == {expected}, (rule, by_rule[rule])
    others = [(o.check.id, o.status, o.detail) for o in summary.outcomes
              if o.check.rule not in NEW_RULES and o.status not in (Status.PASS,)
              and not (o.status is Status.UNSUPPORTED and o.check.level is Level.OPTIONAL)]
    assert others == []
    assert summary.exit_code == 0 and summary.resources.all_closed


def test_the_new_checks_are_optional_and_name_their_feature() -> None:
    from conformance.checks import all_checks

    new = [c for c in all_checks() if c.rule in NEW_RULES]
    assert {c.rule for c in new} == set(NEW_RULES)
    assert len(new) == 7
    for entry in new:
        assert entry.level is Level.OPTIONAL
        assert entry.capability == f"features.{NEW_RULES[entry.rule]}", entry.id
