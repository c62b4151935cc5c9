"""whitney-conformance (CLI), ``pytest --pyargs conformance``, and the suite's hygiene:
tagged and closed resources (also on Ctrl-C), --only, --keep-going, timeouts, key masking,
reports, and the black-box boundary (mock_server imported in one place only)."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import conformance
from conformance import open_target, registry, run_suite
from conformance.checks import all_checks
from conformance.cli import main
from conformance.context import Ctx
from conformance.options import Options
from conformance.registry import CheckFailed, Status
from conformance.schema import contract_bytes
from mock_server import create_app
from mock_server.testing.mock import _UvicornThread

REPO = Path(__file__).resolve().parents[2]
KEYS = ("tcp-key-one-secret", "tcp-key-two-secret")


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """``python -m mock_server`` in its own process, two tenants: the suite over real TCP."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "mock_server", "--port", str(port), "--api-key", KEYS[0],
         "--api-key", KEYS[1], "--order-wait-ms", "600"], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/v1/training/capabilities", timeout=1).status_code == 401:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture()
def temporary_checks() -> Iterator[list[str]]:
    """Register test-only checks under TRANSPORT-9x and remove them afterwards."""
    added: list[str] = []
    yield added
    for check_id in added:
        registry._REGISTRY.pop(check_id, None)


def _register(added: list[str], rule: str, name: str, func) -> None:  # noqa: ANN001
    all_checks()  # load the real checks first
    registry.check(rule, name, title=f"test-only {name}")(func)
    added.append(f"{rule}:{name}")


def test_full_suite_over_tcp_passes_with_two_keys(served: str) -> None:
    target = open_target(served, KEYS[0], KEYS[1], use_env=False)
    summary = run_suite(target, options=Options(profile="strict", fuzz_examples=2))
    target.close()
    assert [(o.check.id, o.detail) for o in summary.outcomes
            if o.counts_as_failure or o.status is Status.STRICT] == []
    assert summary.exit_code == 0
    sec2 = [o for o in summary.outcomes if o.check.rule == "SEC-2"]
    assert sec2 and all(o.status is Status.PASS for o in sec2)
    assert summary.resources.all_closed and summary.resources.sessions_created > 10


def test_without_second_key_sec2_is_unsupported(served: str) -> None:
    target = open_target(served, KEYS[0], None, use_env=False)
    summary = run_suite(target, only=["SEC-2"])
    target.close()
    sec2 = [o for o in summary.outcomes if o.check.rule == "SEC-2"]
    assert [o.status for o in sec2] == [Status.UNSUPPORTED]
    assert "second API key" in sec2[0].detail
    assert summary.exit_code == 0


def test_sessions_are_tagged_with_the_run_id(served: str) -> None:
    target = open_target(served, KEYS[0], KEYS[1], use_env=False)
    summary = run_suite(target, only=["LIFE-3", "SEC-2", "SCHEMA-2"], run_tag="tagged-run-1",
                        options=Options(fuzz_examples=3))
    ids = summary.resources.session_ids
    assert len(ids) >= 3
    with httpx.Client(base_url=served + "/v1/training") as client:
        for session_id in ids:
            views = [client.get(f"/sessions/{session_id}",
                                headers={"Authorization": f"Bearer {key}"}) for key in KEYS]
            view = next(v.json() for v in views if v.status_code == 200)
            assert view["metadata"]["whitney-conformance-run"] == "tagged-run-1"
            assert view["state"] in ("closed", "expired")
    target.close()


def test_ctrl_c_still_closes_everything(temporary_checks: list[str]) -> None:
    def interrupted(ctx: Ctx) -> None:
        run = ctx.run()
        run.forward([{"model_input": {"token_ids": [1, 2]},
                      "loss_inputs": {"target_tokens": [2, 3]}}], backward=True)
        raise KeyboardInterrupt

    _register(temporary_checks, "TRANSPORT-91", "interrupt", interrupted)
    target = open_target(use_env=False)
    summary = run_suite(target, only=["TRANSPORT-91"])
    target.close()
    assert summary.interrupted and summary.exit_code == 130
    assert summary.resources.sessions_created == 1 and summary.resources.runs_created == 1
    assert summary.resources.all_closed, summary.resources.leaked


def test_keep_going_and_stop_on_first_failure(temporary_checks: list[str]) -> None:
    def fails(ctx: Ctx) -> None:
        raise CheckFailed("deliberate")

    def passes(ctx: Ctx) -> None:
        assert ctx.caps["contract_version"] == "1.1"

    _register(temporary_checks, "TRANSPORT-92", "fails", fails)
    _register(temporary_checks, "TRANSPORT-93", "passes", passes)
    target = open_target(use_env=False)
    stopped = run_suite(target, only=["TRANSPORT-92", "TRANSPORT-93"], keep_going=False)
    going = run_suite(target, only=["TRANSPORT-92", "TRANSPORT-93"], keep_going=True)
    target.close()
    def statuses(summary):  # noqa: ANN001, ANN202
        return [o.status for o in summary.outcomes if o.check.rule.startswith("TRANSPORT-9")]

    assert statuses(stopped) == [Status.FAIL, Status.NOT_RUN]
    assert statuses(going) == [Status.FAIL, Status.PASS]
    assert stopped.exit_code == going.exit_code == 1


def test_key_is_masked_in_every_output(served: str, temporary_checks: list[str],
                                       tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def leaks(ctx: Ctx) -> None:
        raise CheckFailed(f"the server echoed Authorization: Bearer {ctx.wire.target.api_key}")

    _register(temporary_checks, "TRANSPORT-94", "leaks", leaks)
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["--base-url", served, "--api-key", KEYS[0], "--second-api-key", KEYS[1],
                 "--only", "TRANSPORT-94,DISC-1", "--keep-going", "--report-json", str(report),
                 "--junitxml", str(junit), "-v"])
    out = capsys.readouterr()
    assert code == 1
    for text in (out.out, out.err, report.read_text(), junit.read_text()):
        assert KEYS[0] not in text and KEYS[1] not in text
    assert "Bearer ***" in report.read_text()


def test_reports_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["--only", "ORD-1,DISC", "--report-json", str(report), "--junitxml", str(junit)])
    out = capsys.readouterr().out
    assert code == 0
    assert "ORD" in out and "DISC" in out and "all closed" in out
    data = json.loads(report.read_text())
    assert data["exit_code"] == 0 and data["resources"]["all_closed"]
    assert {c["id"] for c in data["checks"]} == {
        "ORD-1:advance", "DISC-1:capabilities", "DISC-2:no-substitution",
        "SCHEMA-1:every-response", "TRANSPORT-1:every-response"}
    assert all(c["level"] == "MUST" and c["status"] == "pass" for c in data["checks"])
    assert data["rules"]["ORD-1"] == {"status": "pass", "levels": ["MUST"],
                                      "checks": ["ORD-1:advance"]}
    suites = {s.get("name"): s for s in ET.parse(junit).getroot()}
    assert set(suites) == {"ORD", "DISC", "SCHEMA", "TRANSPORT"}
    assert len(list(suites["DISC"])) == 2


def test_usage_errors() -> None:
    assert main(["--only", "NOPE-1"]) == 2
    assert main(["--base-url", "http://127.0.0.1:9"]) == 2  # no key
    assert main(["--list", "--only", "LOSS"]) == 0


def test_per_request_timeout(served: str) -> None:
    """A request held for ordering longer than --timeout is reported, and still cleaned up."""
    target = open_target(served, KEYS[0], timeout=0.2, use_env=False)
    summary = run_suite(target, only=["ORD-2:seq-gap"])
    target.close()
    outcome = summary.outcomes[0]
    assert outcome.status is Status.ERROR and "Timeout" in outcome.detail
    assert summary.exit_code == 1 and summary.resources.all_closed


def test_every_rule_id_of_the_contract_has_a_check() -> None:
    contract = contract_bytes().decode()
    import re

    cited = set(re.findall(r"\b(TRANSPORT|SEC|ERR|DISC|LIFE|ORD|VER|LOSS|OPT|GRAD|SAMPLE|CKPT|"
                           r"EXPORT)-(\d+)\b", contract))
    checked = {c.rule for c in all_checks()}
    assert {f"{f}-{n}" for f, n in cited} <= checked


def test_mock_server_is_imported_in_one_place_only() -> None:
    package = Path(conformance.__file__).parent
    importers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "mock_server" or n.startswith("mock_server.") for n in names):
                importers.append(path.relative_to(package).as_posix())
    assert importers == ["target.py"]


HEAVY = ("httpx", "numpy", "starlette", "pydantic", "yaml", "jsonschema", "schemathesis",
         "hypothesis", "mock_server", "orjson", "rich", "referencing")


def test_loading_the_pytest_plugin_imports_nothing_heavy() -> None:
    """The pytest11 entry point loads in every pytest run of every project with whitney-kit
    installed: it (and the package it lives in) must import no HTTP, schema, numeric or mock
    module until a fixture is used."""
    code = ("import sys, conformance.plugin, conformance.options; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # The check is not vacuous: the same probe sees them once the suite itself is imported.
    code = code.replace("conformance.options", "conformance.runner")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert {"httpx", "yaml", "jsonschema"} <= set(ast.literal_eval(out.stdout))


def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("WHITNEY_BASE_URL", "WHITNEY_API_KEY", "WHITNEY_SECOND_API_KEY"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance",
                           "-p", "no:cacheprovider", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_pytest_pyargs_embedded() -> None:
    result = _pytest("-k", "ORD-1 or DISC-1 or VER-4 or SCHEMA-1", "--whitney-profile", "strict")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout and "all closed" in result.stdout
    assert "profile strict" in result.stdout


def test_pytest_pyargs_against_a_url(served: str) -> None:
    result = _pytest("-k", "SEC-2 or LIFE-3", "--whitney-base-url", served,
                     "--whitney-api-key", KEYS[0])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout  # SEC-2 needs the second key
    result = _pytest("-k", "SEC-2", "--whitney-base-url", served, "--whitney-api-key", KEYS[0],
                     "--whitney-second-api-key", KEYS[1])
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout


def test_pytest_pyargs_preflight_stops_with_one_line() -> None:
    result = _pytest("--whitney-base-url", "http://127.0.0.1:9", "--whitney-api-key", "k")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "check --base-url" in result.stdout + result.stderr
    assert " passed" not in result.stdout and " failed" not in result.stdout


def test_pytest_pyargs_reports_a_failing_rule() -> None:
    server = _UvicornThread(create_app(api_keys=KEYS, violations=frozenset(
        {"close_with_active_runs"})), "127.0.0.1")
    server.start()
    try:
        result = _pytest("-k", "LIFE-3", "--whitney-base-url",
                         f"http://127.0.0.1:{server.port}", "--whitney-api-key", KEYS[0])
    finally:
        server.stop()
    assert result.returncode == 1
    assert "LIFE-3" in result.stdout and "runs_not_terminal" in result.stdout
    assert KEYS[0] not in result.stdout


def test_only_selects_by_rule_prefix() -> None:
    checks = all_checks()

    def ids(only: list[str]) -> list[str]:
        return [c.id for c in registry.select(checks, only)]

    assert ids(["ORD-2"]) == ["ORD-2:out-of-order", "ORD-2:seq-gap"]
    assert ids(["ORD-2:seq"]) == ["ORD-2:seq-gap"]
    assert ids(["LOSS"]) == [f"LOSS-{n}:{name}" for n, name in enumerate(
        ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "refusals"], start=1)]
    assert ids(["LIFE-1"]) == ["LIFE-1:session-view", "LIFE-1:session-quota"]
    assert set(ids(["GRAD", "CKPT-1"])) == {"GRAD-1:forward-no-gradient", "GRAD-1:accumulate",
                                           "CKPT-1:with-optimizer", "CKPT-1:without-optimizer"}
