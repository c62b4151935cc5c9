"""Makes ``pytest --pyargs conformance`` work from a checkout without the pytest11 entry
point: the options are added once whichever of this file and the plugin loads first."""

import pytest

from conformance.plugin import add_options, pytest_terminal_summary, whitney_suite  # noqa: F401


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
