"""pytest plugin: ``pytest --pyargs conformance [--whitney-base-url URL --whitney-api-key K]``.

Registered through the ``pytest11`` entry point (``whitney_conformance``) when the package is
installed; ``conformance/conftest.py`` registers the same options when pytest is started from
the repository without the entry point. ``conformance/test_rules.py`` parametrizes one test
per registered check (ids like ``ORD-2:seq-gap``, so ``-k ORD-2`` selects), all sharing one
session-scoped :class:`~conformance.runner.Suite` whose teardown cancels and closes every
resource, also on Ctrl-C.

Result mapping: pass -> passed; fail/error -> failed; warn -> passed with a warning;
unsupported -> skipped (with the reason); strict (``--whitney-profile strict`` only) -> failed,
labelled "strict-only finding (the contract passes)".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .options import PROFILES, Options

__all__ = ["add_options", "whitney_suite", "pytest_addoption", "pytest_terminal_summary"]

_RESULT_KEY = pytest.StashKey[dict[str, Any]]()


def add_options(parser: pytest.Parser) -> None:
    """Add the ``--whitney-*`` options once (plugin and conftest may both ask)."""
    if getattr(parser, "_whitney_conformance_options", False):
        return
    parser._whitney_conformance_options = True  # type: ignore[attr-defined]
    group = parser.getgroup("whitney-conformance", "Whitney conformance suite")
    group.addoption("--whitney-base-url", default=None,
                    help="endpoint root (env WHITNEY_BASE_URL); default: the embedded mock")
    group.addoption("--whitney-api-key", default=None, help="bearer key (env WHITNEY_API_KEY)")
    group.addoption("--whitney-second-api-key", default=None,
                    help="second tenant's key for SEC-2 (env WHITNEY_SECOND_API_KEY)")
    group.addoption("--whitney-profile", choices=PROFILES, default="contract",
                    help="contract (default): what every deployment must do; strict: also the "
                         "mock's exact shapes (strict-only findings fail their test, labelled so)")
    group.addoption("--whitney-timeout", type=float, default=30.0, help="per-request timeout")
    group.addoption("--whitney-fuzz-examples", type=int, default=Options.fuzz_examples,
                    help="schemathesis examples per operation (0 disables SCHEMA-2)")
    group.addoption("--whitney-quota-probe", type=int, default=Options.quota_probe,
                    help="fill quotas up to N to provoke quota_exceeded")
    group.addoption("--whitney-max-duration", type=float, default=None,
                    help="bound on the whole run in seconds (checks not started by then are "
                         "not run)")
    group.addoption("--whitney-max-wait", type=float, default=Options.max_wait_seconds,
                    help="longest deliberate wait in seconds (TTL expiry)")
    group.addoption("--whitney-openapi", default=None, help="contract file to validate against")


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.fixture(scope="session")
def whitney_suite(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The run shared by every check test: target, wire, capabilities; teardown sweeps."""
    from .runner import PreflightFailed, Suite
    from .schema import OpenAPI
    from .target import open_target

    config = request.config
    target = open_target(config.getoption("whitney_base_url"),
                         config.getoption("whitney_api_key"),
                         config.getoption("whitney_second_api_key"),
                         timeout=config.getoption("whitney_timeout"))
    options = Options(profile=config.getoption("whitney_profile"),
                      max_wait_seconds=config.getoption("whitney_max_wait"),
                      max_duration_seconds=config.getoption("whitney_max_duration"),
                      quota_probe=config.getoption("whitney_quota_probe"),
                      fuzz_examples=config.getoption("whitney_fuzz_examples"))
    suite = Suite(target, openapi=OpenAPI.load(config.getoption("whitney_openapi")),
                  options=options)
    try:
        suite.preflight()
    except PreflightFailed as exc:
        suite.wire.close()
        target.close()
        pytest.exit(f"whitney-conformance: {exc}", returncode=2)
    try:
        yield suite
    finally:
        try:
            resources = suite.teardown()
            config.stash[_RESULT_KEY] = {"target": target.description, "tag": suite.run_tag,
                                         "profile": suite.profile,
                                         "resources": resources,
                                         "requests": suite.wire.requests}
        finally:
            suite.wire.close()
            target.close()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    result = config.stash.get(_RESULT_KEY, None)
    if not result or getattr(config, "_whitney_summary_printed", False):
        return
    config._whitney_summary_printed = True  # type: ignore[attr-defined]
    res = result["resources"]
    state = "all closed" if res.all_closed else f"NOT all closed: {res.leaked[:5]}"
    terminalreporter.write_sep("-", f"whitney conformance, profile {result['profile']}, against "
                                    f"{result['target']} (run {result['tag']})")
    terminalreporter.write_line(
        f"{res.sessions_created} sessions and {res.runs_created} runs created, "
        f"{res.sessions_closed} closed / {res.runs_terminal} terminal: {state}; "
        f"{result['requests']} requests")

