"""The two profiles of one suite: ``contract`` judges only what the contract requires (EXT-1),
``strict`` also the mock's exact shapes, and reports what only it finds as strict-only (status
``strict``, exit code 3), never as a contract failure.

The endpoints below are the embedded mock behind a small wire-level wrapper that changes its
answers in a way EXT-1 allows (test-local: the mock's own legal-variant switches live in
``mock_server/testing``). Each wrapped endpoint must pass ``contract`` and be flagged by
``strict`` for exactly that difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from conformance import run_suite
from conformance.options import Options
from conformance.registry import Status
from conformance.report import to_json, write_junit
from conformance.target import (
    EMBEDDED_API_KEY,
    EMBEDDED_BASE_URL,
    EMBEDDED_DEFAULTS,
    EMBEDDED_SECOND_API_KEY,
    Target,
)
from mock_server import InProcessTransport, create_app

MOCK = {**EMBEDDED_DEFAULTS, "order_wait_ms": 300}
PRIMITIVES = {"forward", "forward_backward", "optim_step", "save_weights_for_sampler", "sample",
              "logprobs", "save_state", "load_state", "export_lora"}
FAST = {"fuzz_examples": 1}


class Rewriting(httpx.BaseTransport):
    """The mock's answers passed through ``rewrite(request, response) -> response``."""

    def __init__(self, rewrite: Callable[[httpx.Request, httpx.Response], httpx.Response]
                 ) -> None:
        self.inner = InProcessTransport(create_app(
            api_keys=(EMBEDDED_API_KEY, EMBEDDED_SECOND_API_KEY), **MOCK))
        self.rewrite = rewrite

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.rewrite(request, self.inner.handle_request(request))

    def close(self) -> None:
        self.inner.close()


def _replace_json(response: httpx.Response, body: object) -> httpx.Response:
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return httpx.Response(response.status_code, headers=headers, content=orjson.dumps(body))


def extra_fields(request: httpx.Request, response: httpx.Response) -> httpx.Response:
    """Every JSON object answer carries one more top-level field (and so does the result kept
    in an operation record, so records still equal the answers they record)."""
    if "/exports/" in request.url.path or not response.headers.get(
            "content-type", "").startswith("application/json"):
        return response  # export files are files, not response objects
    body = orjson.loads(response.content)
    if not isinstance(body, dict):
        return response
    body["server_note"] = "an extension field"
    if isinstance(body.get("result"), dict):
        body["result"]["server_note"] = "an extension field"
    return _replace_json(response, body)


def replayed_false(request: httpx.Request, response: httpx.Response) -> httpx.Response:
    """``Whitney-Replayed: false`` on every first execution of a primitive (EXT-1: only
    ``true`` marks a replay)."""
    primitive = request.url.path.rsplit("/", 1)[-1] in PRIMITIVES
    if primitive and request.method == "POST" and "whitney-replayed" not in response.headers:
        response.headers["Whitney-Replayed"] = "false"
    return response


def target_with(rewrite: Callable[[httpx.Request, httpx.Response], httpx.Response]) -> Target:
    return Target(base_url=EMBEDDED_BASE_URL, api_key=EMBEDDED_API_KEY,
                  second_api_key=EMBEDDED_SECOND_API_KEY, timeout=30.0, embedded=True,
                  transport=Rewriting(rewrite))


@pytest.fixture()
def extended() -> Iterator[Target]:
    target = target_with(extra_fields)
    yield target
    target.close()


def test_extra_response_fields_pass_the_contract_and_are_flagged_by_strict(
        extended: Target) -> None:
    contract = run_suite(extended, options=Options(**FAST))
    assert [(o.check.id, o.detail) for o in contract.outcomes if o.counts_as_failure] == []
    assert contract.exit_code == 0 and contract.profile == "contract"
    assert not any(o.status is Status.STRICT for o in contract.outcomes)

    strict = run_suite(extended, options=Options(profile="strict", **FAST))
    assert strict.failing_rules() == set()
    assert strict.strict_only_rules() == {"SCHEMA-1"}
    assert strict.exit_code == 3
    flagged = next(o for o in strict.outcomes if o.status is Status.STRICT)
    assert flagged.detail.startswith("strict-only: ") and "server_note" in flagged.detail
    assert flagged.strict and not flagged.counts_as_failure


def test_reports_say_which_profile_ran_and_keep_strict_findings_apart(
        extended: Target, tmp_path) -> None:  # noqa: ANN001
    summary = run_suite(extended, only=["DISC-1"], options=Options(profile="strict", **FAST))
    data = to_json(summary)
    assert data["profile"] == "strict" and data["exit_code"] == 3
    assert data["failing_rules"] == [] and data["strict_only_rules"] == ["SCHEMA-1"]
    schema1 = next(c for c in data["checks"] if c["id"] == "SCHEMA-1:every-response")
    assert schema1["status"] == "strict" and schema1["strict_only"]
    junit = tmp_path / "r.xml"
    write_junit(summary, junit)
    text = junit.read_text()
    assert "whitney-conformance (strict)" in text and "<failure" not in text
    assert "strict: strict-only:" in text


def test_the_mock_passes_both_profiles() -> None:
    """The project's own bar: the faithful mock has no strict-only finding either."""
    target = target_with(lambda request, response: response)
    try:
        summary = run_suite(target, options=Options(profile="strict", **FAST))
    finally:
        target.close()
    assert [(o.check.id, o.detail) for o in summary.outcomes
            if o.counts_as_failure or o.status is Status.STRICT] == []
    assert summary.exit_code == 0


def test_replayed_false_on_first_executions_is_not_a_replay() -> None:
    """Only ``Whitney-Replayed: true`` marks a replay: a server that says ``false`` on first
    executions passes the contract (the suite's seq counter keeps moving); strict reports the
    header the mock never sends, on ORD-3's own clause and in the response shapes."""
    target = target_with(replayed_false)
    try:
        contract = run_suite(target, options=Options(**FAST))
        strict = run_suite(target, options=Options(profile="strict", **FAST))
    finally:
        target.close()
    assert [(o.check.id, o.detail) for o in contract.outcomes if o.counts_as_failure] == []
    assert contract.exit_code == 0
    assert strict.failing_rules() == set() and strict.exit_code == 3
    assert strict.strict_only_rules() == {"ORD-3", "SCHEMA-1"}
    replay = next(o for o in strict.outcomes if o.check.id == "ORD-3:replay")
    assert replay.status is Status.STRICT and "Whitney-Replayed: 'false'" in replay.detail


def test_unknown_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        Options(profile="lenient")
