"""First contact with a real endpoint: one preflight line instead of a wall of errors, a plain
layout off a terminal, waits bounded by what the suite asked, messages that say what to do,
nothing written into the caller's folder, and an API key masked only where it stands whole."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from conformance import registry, run_suite
from conformance.checks import all_checks
from conformance.cli import main
from conformance.context import Ctx
from conformance.options import Options
from conformance.registry import CheckFailed, Status
from conformance.target import (
    EMBEDDED_API_KEY,
    EMBEDDED_BASE_URL,
    EMBEDDED_DEFAULTS,
    EMBEDDED_SECOND_API_KEY,
    Target,
    mask_secrets,
    open_target,
)
from mock_server import InProcessTransport, create_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """A mock over TCP whose only key is one letter long."""
    from mock_server.testing.mock import _UvicornThread

    server = _UvicornThread(create_app(api_keys=("e",), order_wait_ms=300), "127.0.0.1")
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


@pytest.fixture()
def temporary_checks() -> Iterator[list[str]]:
    added: list[str] = []
    yield added
    for check_id in added:
        registry._REGISTRY.pop(check_id, None)


def _register(added: list[str], rule: str, name: str, func) -> None:  # noqa: ANN001
    all_checks()
    registry.check(rule, name, title=f"test-only {name}")(func)
    added.append(f"{rule}:{name}")


# ------------------------------------------------------------------------------ preflight
@pytest.mark.parametrize("argv, fix", [
    (["--base-url", "http://127.0.0.1:9", "--api-key", "k"], "check --base-url"),
    (["--api-key", "wrong"], "check --api-key"),
    (["--api-key", "e", "--second-api-key", "nope"], "check --second-api-key"),
    (["--api-key", "e", "--base-url", "{url}/v1"], "is --base-url the root"),
])
def test_preflight_says_what_to_fix_in_one_line(served: str, argv: list[str], fix: str,
                                                capsys: pytest.CaptureFixture) -> None:
    if "--base-url" not in argv:
        argv = ["--base-url", served, *argv]
    argv = [a.replace("{url}", served) for a in argv]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and fix in lines[0], lines


# ------------------------------------------------------------------------------ plain layout
def test_plain_layout_one_line_per_check_details_whole(temporary_checks: list[str],
                                                       capsys: pytest.CaptureFixture) -> None:
    long = "a-detail-word-longer-than-eighty-columns-" * 5 + "end"

    def fails(ctx: Ctx) -> None:
        raise CheckFailed(f"deliberate: {long}")

    _register(temporary_checks, "TRANSPORT-95", "long-detail", fails)
    # capsys is not a terminal: the plain layout is the default
    assert main(["--only", "TRANSPORT-95,ORD-1,DISC-1", "--keep-going"]) == 1
    out = capsys.readouterr().out.splitlines()
    check_lines = [line for line in out if line.split(" ", 1)[0] in ("PASS", "FAIL")]
    assert [line.split()[1] for line in check_lines] == [
        "TRANSPORT-95:long-detail", "DISC-1:capabilities", "ORD-1:advance",
        "TRANSPORT-1:every-response", "SCHEMA-1:every-response"]
    assert f"            deliberate: {long}" in out  # whole, on its own line, not cut
    assert not any("│" in line or "┃" in line for line in out)  # no table
    assert out[-1] == "failing rules: TRANSPORT-95"


# ------------------------------------------------------------------------------ waits
def _rewriting(rewrite) -> Target:  # noqa: ANN001
    inner = InProcessTransport(create_app(api_keys=(EMBEDDED_API_KEY, EMBEDDED_SECOND_API_KEY),
                                          **EMBEDDED_DEFAULTS))

    class Rewriting(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return rewrite(request, inner.handle_request(request))

        def close(self) -> None:
            inner.close()

    return Target(base_url=EMBEDDED_BASE_URL, api_key=EMBEDDED_API_KEY,
                  second_api_key=EMBEDDED_SECOND_API_KEY, timeout=30.0, embedded=True,
                  transport=Rewriting())


def far_expiry(request: httpx.Request, response: httpx.Response) -> httpx.Response:
    """Session views claim an expiry ten minutes after creation, whatever TTL was asked."""
    if response.status_code not in (200, 201) or "/sessions" not in request.url.path:
        return response
    body = orjson.loads(response.content)
    if isinstance(body, dict) and body.get("expires_at"):
        body["expires_at"] = body["created_at"][:11] + "23:59:59Z"
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return httpx.Response(response.status_code, headers=headers, content=orjson.dumps(body))
    return response


def test_life_4_does_not_wait_for_the_servers_word() -> None:
    """LIFE-4 waits for the TTL it asked for; timestamps that disagree fail at once."""
    target = _rewriting(far_expiry)
    started = time.monotonic()
    try:
        summary = run_suite(target, only=["LIFE-4"])
    finally:
        target.close()
    outcome = next(o for o in summary.outcomes if o.check.rule == "LIFE-4")
    assert outcome.status is Status.FAIL and "asked ttl_seconds 1" in outcome.detail
    assert time.monotonic() - started < 5


def test_long_waits_show_progress(capsys: pytest.CaptureFixture) -> None:
    assert main(["--only", "LIFE-4"]) == 0
    out = capsys.readouterr().out
    assert "... LIFE-4:expiry: waiting 2.0 s for the session to expire" in out


def test_max_duration_bounds_the_run() -> None:
    target = open_target(use_env=False)
    started = time.monotonic()
    try:
        summary = run_suite(target, options=Options(max_duration_seconds=0.5, fuzz_examples=1))
    finally:
        target.close()
    elapsed = time.monotonic() - started
    not_run = [o for o in summary.outcomes if o.status is Status.NOT_RUN]
    assert not_run and all("--max-duration" in o.detail for o in not_run)
    assert elapsed < 10 and summary.resources.all_closed
    assert summary.exit_code == 0  # nothing failed; the report says what did not run


def test_quota_warning_names_the_option() -> None:
    target = open_target(use_env=False)
    try:
        summary = run_suite(target, only=["LIFE-1:session-quota", "VER-1"],
                            options=Options(quota_probe=2))
    finally:
        target.close()
    warned = {o.check.id: o.detail for o in summary.outcomes if o.status is Status.WARN}
    assert "--quota-probe 12" in warned["LIFE-1:session-quota"]
    assert "--whitney-quota-probe 12" in warned["VER-1:increasing"]


def test_held_request_warnings_say_what_the_server_did() -> None:
    target = open_target(use_env=False, mock_options={"order_wait_ms": 300,
                                                      "violations": {"no_ordering_holds"}})
    try:
        summary = run_suite(target, only=["ORD-3:held-duplicate", "LIFE-6", "LIFE-7"])
    finally:
        target.close()
    said = {o.check.id: o.detail for o in summary.outcomes if o.status is Status.WARN}
    # This switch executes a seq at once, whatever its turn: what each request then met.
    assert "did not hold POST" in said["ORD-3:held-duplicate"]
    assert "answered 409 no_gradients after" in said["ORD-3:held-duplicate"]
    assert "answered 200 after" in said["LIFE-6:finish"]
    assert "did not hold POST" in said["LIFE-7:cancel"]


# ------------------------------------------------------------------------------ hygiene
def test_nothing_is_written_into_the_working_folder(tmp_path: Path) -> None:
    """SCHEMA-2 runs Hypothesis; its files go to a temporary home, not ./.hypothesis."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("WHITNEY_BASE_URL", "WHITNEY_API_KEY", "HYPOTHESIS_STORAGE_DIRECTORY"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", "conformance", "--only", "SCHEMA-2",
                             "--fuzz-examples", "2"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS        SCHEMA-2:fuzz" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_key_is_masked_only_where_it_stands_whole(served: str, temporary_checks: list[str],
                                                    capsys: pytest.CaptureFixture) -> None:
    assert mask_secrets("limit_exceeded: Bearer e; key=e", ["e"]) == \
        "limit_exceeded: Bearer ***; key=***"

    def leaks(ctx: Ctx) -> None:
        raise CheckFailed(f"limit_exceeded, echoed Authorization: Bearer {ctx.wire.target.api_key}")

    _register(temporary_checks, "TRANSPORT-96", "leaks", leaks)
    assert main(["--base-url", served, "--api-key", "e", "--only", "TRANSPORT-96"]) == 1
    out = capsys.readouterr().out
    assert "limit_exceeded, echoed Authorization: Bearer ***" in out
    assert "Bearer e" not in out
