"""The pytest plugin as a downstream user meets it: installed through the ``pytest11`` entry
point, nothing else. Each test runs a fresh pytest in a subprocess (``pytester``) on files a user
would write, and checks the outcome counts that pytest itself reports."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing-your-training-code.md"
SECTION = "## Testing your training code"


def _example(markdown: str) -> str:
    """The first python code block of the "Testing your training code" section."""
    section = markdown[markdown.index(SECTION):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the section has no python example"
    return match.group(1)


def test_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert points.get("whitney_mock") == "mock_server.testing.plugin", (
        'pyproject.toml needs [project.entry-points.pytest11] whitney_mock = '
        '"mock_server.testing.plugin" (then reinstall)')


def test_readme_example_passes_as_written(pytester: pytest.Pytester) -> None:
    example = _example(DOC.read_text())
    readme = (ROOT / "README.md").read_text()
    if SECTION in readme:  # the README carries the same example, character for character
        assert _example(readme) == example
    pytester.makepyfile(test_training_with_whitney_mock=example)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


def test_fresh_state_for_every_test(pytester: pytest.Pytester) -> None:
    # Two tests create a session each on the same kind of fixture; with fresh state each sees
    # exactly its own session, and a fault armed in the first never reaches the second.
    pytester.makepyfile(test_fresh="""
        import pytest

        @pytest.mark.parametrize("fixture", ["whitney_mock", "whitney_server"])
        @pytest.mark.parametrize("round", [1, 2])
        def test_isolated(request, fixture, round):
            whitney = request.getfixturevalue(fixture)
            assert whitney.faults() == []
            assert whitney.backend.sessions == {}
            r = whitney.client.post("/v1/training/sessions", json={})
            assert r.status_code == 201
            whitney.inject_fault("error", "create_session", count=None)
            assert whitney.client.post("/v1/training/sessions", json={}).status_code == 503
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_marker_beats_command_line_beats_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("""
        [pytest]
        whitney_mock_seed = 3
        whitney_mock_limits =
            max_num_samples=5
            max_sessions=7
        whitney_mock_api_keys = ini-key other-ini-key
    """)
    pytester.makepyfile(test_config="""
        import pytest

        def caps(whitney):
            return whitney.client.get("/v1/training/capabilities").json()["limits"]

        def test_ini_and_command_line(whitney_mock):
            assert whitney_mock.backend.seed == 11             # --whitney-mock-seed
            assert caps(whitney_mock)["max_num_samples"] == 9  # --whitney-mock-limit
            assert caps(whitney_mock)["max_sessions"] == 7     # ini
            assert whitney_mock.api_keys == ("ini-key", "other-ini-key")

        @pytest.mark.whitney_mock(seed=5, limits={"max_sessions": 2}, api_keys=["marker-key"])
        @pytest.mark.parametrize("fixture", ["whitney_mock", "whitney_server"])
        def test_marker(request, fixture):
            whitney = request.getfixturevalue(fixture)
            assert whitney.backend.seed == 5
            assert caps(whitney)["max_sessions"] == 2
            assert caps(whitney)["max_num_samples"] == 9
            assert whitney.api_key == "marker-key"
            stale = whitney.client.get(
                "/v1/training/capabilities", headers={"Authorization": "Bearer ini-key"})
            assert stale.status_code == 401

        def test_server_back_to_session_settings(whitney_server):
            assert whitney_server.backend.seed == 11
            assert caps(whitney_server)["max_sessions"] == 7
            assert whitney_server.api_key == "ini-key"
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--whitney-mock-seed", "11",
                                           "--whitney-mock-limit", "max_num_samples=9")
    result.assert_outcomes(passed=4)


def test_bad_options_are_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(whitney_mock):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--whitney-mock-limit", "max_bogus=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--whitney-mock-limit*'max_bogus=1' is not NAME=INTEGER*"])


def test_bad_marker_fails_the_test_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="""
        import pytest

        @pytest.mark.whitney_mock(sede=1)
        def test_typo(whitney_mock):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown argument(s)*sede*"])


def test_help_lists_the_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--whitney-mock-seed=N*", "*--whitney-mock-limit=NAME=VALUE*",
                                 "*--whitney-mock-api-key=KEY*", "*whitney_mock_limits*"])
