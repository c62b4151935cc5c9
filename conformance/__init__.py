"""Black-box conformance suite for Whitney endpoints (the contract in ``openapi.yaml``).

Entry points: ``whitney-conformance`` / ``python -m conformance`` (see ``cli.py``), and
``pytest --pyargs conformance`` (see ``plugin.py``). Library use::

    from conformance import open_target, run_suite
    summary = run_suite(open_target())          # the embedded mock
    summary.exit_code, summary.failing_rules()
    run_suite(target, options=Options(profile="strict"))   # also the mock's exact shapes

``run_suite`` raises ``PreflightFailed`` (one line saying what to fix) when the endpoint cannot
be tested at all.

The names below are imported on first use: importing ``conformance`` (as the pytest plugin
does in every pytest run) loads no HTTP, schema or numeric library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checks import all_checks
    from .options import Options
    from .registry import Check, Level, Status
    from .runner import CheckOutcome, PreflightFailed, Summary, run_suite
    from .target import Target, open_target

__all__ = ["Check", "CheckOutcome", "Level", "Options", "PreflightFailed", "Status", "Summary",
           "Target", "all_checks", "open_target", "run_suite"]

_HOME = {"Check": "registry", "Level": "registry", "Status": "registry",
         "CheckOutcome": "runner", "PreflightFailed": "runner", "Summary": "runner",
         "run_suite": "runner",
         "Target": "target", "open_target": "target", "Options": "options",
         "all_checks": "checks"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
