"""Black-box conformance suite for Whitney endpoints (the contract in ``openapi.yaml``).

Entry points: ``whitney-conformance`` / ``python -m conformance`` (see ``cli.py``), and
``pytest --pyargs conformance`` (see ``plugin.py``). Library use::

    from conformance import open_target, run_suite
    summary = run_suite(open_target())          # the embedded mock
    summary.exit_code, summary.failing_rules()
"""

from .registry import Check, Level, Status, all_checks
from .runner import Outcome, Summary, run_suite
from .target import Target, open_target

__all__ = ["Check", "Level", "Outcome", "Status", "Summary", "Target", "all_checks",
           "open_target", "run_suite"]
