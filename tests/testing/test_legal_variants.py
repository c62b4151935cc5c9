"""The conformance suite fails a server only for breaking the contract: the mirror of
``tests/testing/test_conformance_violations.py``.

Each legal variant of the mock (``mock_server.testing.variants``) uses one freedom the contract
leaves a server. For each, the ``contract`` profile must pass it (exit 0, no failure, every
resource closed), and the ``strict`` profile must report exactly how it differs from the mock's
own shapes: the strict-only findings, classified below, equal the variant's ``Expect`` (nothing
at all for a variant that changes no shape the mock fixes, e.g. vocabulary or limits).
``test_variant_is_on`` proves each switch really changes the mock, so a variant that passes
both profiles does so because the suite tolerates it, not because nothing changed.

``EXPECTED`` is written from the contract and ``strict.yaml``, not from the suite's output.
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest

from conformance import all_checks, run_suite
from conformance.options import Options
from conformance.registry import Status
from conformance.runner import Summary
from conformance.target import (
    EMBEDDED_API_KEY,
    EMBEDDED_BASE_URL,
    EMBEDDED_DEFAULTS,
    EMBEDDED_SECOND_API_KEY,
    Target,
)
from mock_server import Backend, InProcessTransport
from mock_server.testing.switches import create_app_with
from mock_server.testing.variants import LEGAL_VARIANTS

# Short waits keep one suite run at a few seconds (ORD-2 waits order_wait_ms).
MOCK = {**EMBEDDED_DEFAULTS, "order_wait_ms": 300}
SCHEMA_1 = "SCHEMA-1:every-response"


@dataclass(frozen=True)
class Expect:
    """What the suite makes of one variant.

    ``strict``: the strict-only findings, each as (kind, value) (see :func:`classify`);
    ``off``: the capabilities (``registry.check``'s dotted paths) the variant does not declare,
    whose checks must be reported unsupported, and no others; ``limits``: the variant declares
    small limits, so checks may warn that a clause was not exercised (never anything else).
    """

    strict: frozenset[tuple[str, str]] = frozenset()
    off: frozenset[str] = frozenset()
    limits: bool = False


def _fields(*names: str) -> frozenset[tuple[str, str]]:
    return frozenset(("unexpected field", name) for name in names)


EXPECTED: dict[str, Expect] = {
    # strict.yaml closes every response object (contract-changes 3.4); metrics stay open.
    "extra_response_fields": Expect(strict=_fields(
        "server_version", "family", "streaming", "max_concurrent_runs", "description",
        "ttl_seconds", "run_ids", "read_at", "base_model", "lora", "held_requests", "saved_by",
        "primitive", "run_step", "num_positions", "num_tokens", "media_type")),
    # The envelope and the error object are closed under strict; details stays open, so the
    # extra details key is legal under both profiles.
    "extra_error_fields": Expect(strict=_fields("documentation_url", "retryable")),
    # strict.yaml's x-error-types and details keys (contract-changes 1.1-1.6); the renamed
    # recorded failures (loss_overflow ...) and 405/429/5xx are not provoked by the suite.
    "other_error_types": Expect(strict=frozenset(
        {("error.type", t) for t in ("auth_failed", "session_missing", "run_not_found",
                                      "seq_not_recorded", "export_missing", "missing_field",
                                      "invalid_value")}
        | {("details key", "fields"), ("details key", "limit")})),
    # strict.yaml narrows the header to 'true'; ORD-3 notes the value on first executions.
    "replayed_false": Expect(strict=frozenset({("Whitney-Replayed", "false"),
                                               ("ORD-3 first execution", "false")})),
    "small_vocab": Expect(),
    "large_vocab": Expect(),
    "tight_limits": Expect(limits=True),
    "minimal_limits": Expect(limits=True),
    "fewer_features": Expect(off=frozenset({
        "features.session_ttl", "features.deterministic_sampling", "features.idempotent_create",
        "features.session_listing", "features.seq_error_details",
        "features.exports_after_close"})),
    "fewer_losses": Expect(off=frozenset({"loss_functions.ppo", "loss_functions.cispo",
                                          "loss_functions.dro"})),
    "fewer_primitives": Expect(off=frozenset({
        "primitives.logprobs", "primitives.save_state", "primitives.load_state",
        "primitives.export_lora", "features.exports_after_close"})),
    "different_ids": Expect(),
    "slow_cancel": Expect(),
    "ttl_bounds": Expect(),
    "timestamp_offset": Expect(),
    "float32_results": Expect(),
}

_UNEXPECTED = re.compile(r"Additional properties are not allowed \((.+) (?:was|were) "
                         r"unexpected\)")
_ERROR_TYPE = re.compile(r"error\.type '([^']*)' not in x-error-types")
_DETAILS_KEY = re.compile(r"body at error/details: '([^']+)' is a required property")
_HEADER = re.compile(r"header Whitney-Replayed: '([^']*)': '[^']*' is not one of \['true'\]")
_FIRST_EXECUTION = re.compile(r"carries Whitney-Replayed: '([^']*)' \(the mock sends the "
                              r"header only on replays\)")


def classify(check_id: str, finding: str) -> set[tuple[str, str]]:
    """The (kind, value) pairs one strict-only finding stands for; ("other", text) when it
    is none of the kinds a legal variant may cause."""
    if check_id.startswith("ORD-3:"):
        values = _FIRST_EXECUTION.findall(finding)
        return {("ORD-3 first execution", v) for v in values} or {("other", finding)}
    if match := _UNEXPECTED.search(finding):
        return {("unexpected field", name) for name in re.findall(r"'([^']+)'", match[1])}
    for pattern, kind in ((_ERROR_TYPE, "error.type"), (_DETAILS_KEY, "details key"),
                          (_HEADER, "Whitney-Replayed")):
        if match := pattern.search(finding):
            return {(kind, match[1])}
    return {("other", finding)}


@functools.cache
def summary_of(variant: str, profile: str) -> Summary:
    """One suite run against the mock with ``variant`` on (cached: each test reads it)."""
    app = create_app_with(legal_variants={variant},
                          api_keys=(EMBEDDED_API_KEY, EMBEDDED_SECOND_API_KEY), **MOCK)
    target = Target(base_url=EMBEDDED_BASE_URL, api_key=EMBEDDED_API_KEY,
                    second_api_key=EMBEDDED_SECOND_API_KEY, timeout=30.0, embedded=True,
                    transport=InProcessTransport(app))
    try:
        return run_suite(target, options=Options(profile=profile, fuzz_examples=1))
    finally:
        target.close()


def strict_findings(summary: Summary) -> set[tuple[str, str]]:
    """Every strict-only finding of a run, classified: SCHEMA-1's whole list of response
    problems, and each other check's notes."""
    found: set[tuple[str, str]] = set()
    for _check_id, problem in summary.strict_problems:
        found |= classify(SCHEMA_1, problem)
    for outcome in summary.outcomes:
        if outcome.check.id != SCHEMA_1:
            for finding in outcome.strict:
                found |= classify(outcome.check.id, finding)
    return found


def test_every_variant_is_documented_and_expected() -> None:
    assert set(EXPECTED) == set(LEGAL_VARIANTS)
    assert len(LEGAL_VARIANTS) >= 10
    for name, doc in LEGAL_VARIANTS.items():
        assert re.search(r"\b[A-Z]+-\d\b|[Ss]ection \d", doc), \
            f"{name}: its docstring cites no rule"


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_contract_profile_passes(variant: str) -> None:
    summary = summary_of(variant, "contract")
    expect = EXPECTED[variant]
    details = {o.check.id: o.detail for o in summary.outcomes
               if o.status not in (Status.PASS, Status.UNSUPPORTED, Status.WARN)}
    assert details == {}
    assert summary.exit_code == 0
    assert summary.resources.all_closed, summary.resources.leaked
    unsupported = {o.check.id for o in summary.outcomes if o.status is Status.UNSUPPORTED}
    assert unsupported == {c.id for c in all_checks() if c.capability in expect.off}
    assert bool(unsupported) == bool(expect.off)
    warned = {o.check.id: o.detail for o in summary.outcomes if o.status is Status.WARN}
    if expect.limits:
        assert warned, "the variant's limits were expected to leave clauses unexercised"
        for check_id, detail in warned.items():
            assert "not exercised" in detail, (check_id, detail)
    else:
        assert warned == {}


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_strict_profile_flags_exactly_the_difference(variant: str) -> None:
    summary = summary_of(variant, "strict")
    expect = EXPECTED[variant]
    failures = {o.check.id: o.detail for o in summary.outcomes if o.counts_as_failure}
    assert failures == {}  # strict never turns a legal difference into a contract failure
    assert strict_findings(summary) == set(expect.strict)
    flagged = {o.check.id for o in summary.outcomes if o.status is Status.STRICT}
    # Which checks see a difference is the suite's business; that only SCHEMA-1 (responses)
    # and ORD-3 (first executions) may report one, and that they do, is the contract's.
    if any(kind != "ORD-3 first execution" for kind, _ in expect.strict):
        assert SCHEMA_1 in flagged
    if ("ORD-3 first execution", "false") in expect.strict:
        assert "ORD-3:replay" in flagged
        assert flagged <= {SCHEMA_1} | {c.id for c in all_checks() if c.rule == "ORD-3"}
    else:
        assert flagged <= {SCHEMA_1}
    assert summary.exit_code == (3 if expect.strict else 0)


def test_variants_are_not_reachable_over_http() -> None:
    """Like the violations: in-process only; the control plane has no field for them."""
    app = create_app_with(api_keys=("k",), control_plane=True, control_key="control")
    with httpx.Client(transport=InProcessTransport(app), base_url="http://m",
                      headers={"Authorization": "Bearer control"}) as client:
        reply = client.post("/_mock/reset", json={"legal_variants": ["small_vocab"]})
        assert (reply.status_code, reply.json()["error"]["type"]) == (422, "unknown_field")
    assert type(app.state.backend) is Backend


# -- each switch really changes the mock ---------------------------------------------------
KEY = "variant-key"


def _client(variant: str) -> httpx.Client:
    app = create_app_with(legal_variants={variant}, api_keys=(KEY,), **MOCK)
    return httpx.Client(transport=InProcessTransport(app), base_url="http://m/v1/training",
                        headers={"Authorization": f"Bearer {KEY}"})


@dataclass
class Probe:
    client: httpx.Client
    caps: dict = field(default_factory=dict)

    def run(self, rank: int = 1) -> tuple[str, str]:
        session = self.client.post("/sessions", json={}).json()
        model = self.caps["base_models"][0]["id"]
        run = self.client.post(f"/sessions/{session['session_id']}/runs", json={
            "base_model": model, "lora": {"rank": rank, "alpha": 2.0, "seed": 1},
            "optimizer": "adamw"})
        assert run.status_code == 201, run.text
        return session["session_id"], run.json()["run_id"]

    def forward(self, run_id: str, tokens: list[int], loss: str = "cross_entropy",
                seq: int = 1) -> httpx.Response:
        return self.client.post(f"/runs/{run_id}/forward", json={
            "seq": seq, "loss_function": loss, "loss_config": {},
            "data": [{"model_input": {"token_ids": tokens[:-1]},
                      "loss_inputs": {"target_tokens": tokens[1:]}}]})


def _vocab(size: int, eos: int) -> Callable[[Probe], None]:
    def probe(p: Probe) -> None:
        [model] = p.caps["base_models"]
        assert (model["vocab_size"], model["eos_token_id"]) == (size, eos)
        _, run_id = p.run()
        assert p.forward(run_id, [0, size - 1, 1]).status_code == 200
        assert p.forward(run_id, [0, size], seq=2).status_code == 422
    return probe


def _limits(context: int, rank: int, **limits: int) -> Callable[[Probe], None]:
    def probe(p: Probe) -> None:
        [model] = p.caps["base_models"]
        assert (model["max_context"], model["max_lora_rank"]) == (context, rank)
        assert {k: p.caps["limits"][k] for k in limits} == limits
        session = p.client.post("/sessions", json={}).json()["session_id"]
        too_big = p.client.post(f"/sessions/{session}/runs", json={
            "base_model": model["id"], "lora": {"rank": rank + 1, "alpha": 1.0},
            "optimizer": "adamw"})
        assert too_big.status_code == 422
    return probe


def _fewer_features(p: Probe) -> None:
    features = p.caps["features"]
    assert (features["session_ttl"], features["deterministic_sampling"]) == (False, False)
    assert p.client.post("/sessions", json={"ttl_seconds": 60}).status_code == 422
    _, run_id = p.run()
    p.client.post(f"/runs/{run_id}/save_weights_for_sampler", json={"seq": 1, "version": 0})
    body = {"version": 0, "prompt": {"token_ids": [1, 2]}, "num_samples": 4,
            "sampling": {"max_tokens": 16, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                         "seed": 7, "stop_token_ids": []}}
    first, second = (p.client.post(f"/runs/{run_id}/sample", json={"seq": seq, **body}).json()
                     for seq in (2, 3))
    assert first["sequences"] != second["sequences"]  # the seed is not honoured


def _fewer_losses(p: Probe) -> None:
    assert sorted(p.caps["loss_functions"]) == ["cross_entropy", "importance_sampling"]
    _, run_id = p.run()
    refused = p.forward(run_id, [1, 2, 3], loss="ppo")
    assert (refused.status_code, refused.json()["error"]["type"]) == \
        (422, "unsupported_loss_function")


def _fewer_primitives(p: Probe) -> None:
    assert "logprobs" not in p.caps["primitives"]
    _, run_id = p.run()
    reply = p.client.post(f"/runs/{run_id}/logprobs", json={"seq": 1, "version": 0,
                                                            "token_ids": [1, 2]})
    assert reply.status_code == 404


def _different_ids(p: Probe) -> None:
    session_id, run_id = p.run()
    assert str(uuid.UUID(session_id)) == session_id and str(uuid.UUID(run_id)) == run_id


def _slow_cancel(p: Probe) -> None:
    _, run_id = p.run()
    started = time.monotonic()
    assert p.client.post(f"/runs/{run_id}/cancel", json={}).json()["state"] == "cancelling"
    while p.client.get(f"/runs/{run_id}").json()["state"] == "cancelling":
        assert time.monotonic() - started < 10
        time.sleep(0.05)
    assert time.monotonic() - started >= 1.0  # the mock's own delay is 50 ms


def _ttl_bounds(p: Probe) -> None:
    limits = p.caps["limits"]
    assert (limits["min_ttl_seconds"], limits["max_ttl_seconds"]) == (2, 600)
    assert p.client.post("/sessions", json={"ttl_seconds": 1}).status_code == 422
    assert p.client.post("/sessions", json={"ttl_seconds": 601}).status_code == 422


def _timestamp_offset(p: Probe) -> None:
    session = p.client.post("/sessions", json={"ttl_seconds": 60}).json()
    for key in ("created_at", "expires_at"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", session[key])


def _float32_results(p: Probe) -> None:
    assert p.caps["features"]["logprob_tolerance"] == 1e-4
    _, run_id = p.run()
    result = p.forward(run_id, [1, 2, 3, 4]).json()
    values = [result["loss"], *result["outputs"][0]["logprobs"]]
    assert all(float(np.float32(v)) == v for v in values)
    assert any(v != round(v) for v in values)


def _extra_response_fields(p: Probe) -> None:
    assert "server_version" in p.caps
    _, run_id = p.run()
    assert p.client.get(f"/runs/{run_id}").json()["base_model"] == \
        p.caps["base_models"][0]["id"]


def _extra_error_fields(p: Probe) -> None:
    body = p.client.get("/capabilities", headers={"Authorization": "Bearer nope"}).json()
    assert "documentation_url" in body and "retryable" in body["error"]
    assert "hint" in body["error"]["details"]


def _other_error_types(p: Probe) -> None:
    unauthorized = p.client.get("/capabilities", headers={"Authorization": "Bearer nope"})
    assert unauthorized.json()["error"]["type"] == "auth_failed"
    assert p.client.get("/runs/nope").json()["error"]["type"] == "run_not_found"
    assert p.client.get("/sessions/nope").json()["error"]["type"] == "session_missing"


def _replayed_false(p: Probe) -> None:
    _, run_id = p.run()
    first = p.forward(run_id, [1, 2, 3])
    again = p.forward(run_id, [1, 2, 3])
    assert (first.headers["whitney-replayed"], again.headers["whitney-replayed"]) == \
        ("false", "true")


PROBES: dict[str, Callable[[Probe], None]] = {
    "extra_response_fields": _extra_response_fields,
    "extra_error_fields": _extra_error_fields,
    "other_error_types": _other_error_types,
    "replayed_false": _replayed_false,
    "small_vocab": _vocab(32, 17),
    "large_vocab": _vocab(262_144, 1),
    "tight_limits": _limits(40, 2, max_datums_per_request=2, max_tokens_per_request=48,
                            max_num_samples=2, max_sample_tokens=4, max_sessions=4,
                            max_runs_per_session=2, max_versions_per_run=3),
    "minimal_limits": _limits(24, 1, max_datums_per_request=1, max_tokens_per_request=16,
                              max_num_samples=1, max_sample_tokens=1, max_sessions=1,
                              max_runs_per_session=1, max_versions_per_run=1),
    "fewer_features": _fewer_features,
    "fewer_losses": _fewer_losses,
    "fewer_primitives": _fewer_primitives,
    "different_ids": _different_ids,
    "slow_cancel": _slow_cancel,
    "ttl_bounds": _ttl_bounds,
    "timestamp_offset": _timestamp_offset,
    "float32_results": _float32_results,
}


@pytest.mark.parametrize("variant", sorted(PROBES))
def test_variant_is_on(variant: str) -> None:
    assert set(PROBES) == set(LEGAL_VARIANTS)
    with _client(variant) as client:
        probe = Probe(client)
        probe.caps = client.get("/capabilities").json()
        PROBES[variant](probe)
