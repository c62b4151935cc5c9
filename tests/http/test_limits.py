"""Limits and quotas (DISC-1 ``limits``, ERR-2 422, §4a quotas): each one is published in
``GET /capabilities`` and enforced exactly at its boundary: the value AT the limit is accepted,
limit + 1 is refused in the ERR-1 envelope, and the refusal changes nothing (ERR-3, ORD-4).
``max_body_bytes`` (ERR-2 413) and the request body reader are in test_body_size.py.

The limits are made small through ``create_app(limits={...})`` so every boundary is cheap to
reach. Expected statuses and error types come from the contract text (§1, §4a), not from the
mock's code.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import (
    API,
    BOS,
    KEY,
    MODEL,
    OTHER_KEY,
    RunHandle,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    state_snapshot,
)

MAX_CONTEXT = 2048  # whitney-mock/tiny-byte, published in capabilities.base_models (checked)


def capabilities(client: httpx.Client) -> dict[str, Any]:
    response = client.get(f"{API}/capabilities")
    assert response.status_code == 200, response.text
    return response.json()


def session_count(mock: Any) -> int:
    return len(mock.backend.sessions)


def datum_of_length(n: int, start: int = 0) -> dict[str, Any]:
    """A cross_entropy datum with exactly ``n`` positions (n + 1 byte tokens)."""
    tokens = [BOS] + [97 + (start + i) % 26 for i in range(n)]
    return ce_datum(tokens)


# -- DISC-1: every limit is published with the configured value ------------------------------
SMALL_LIMITS = {
    "max_body_bytes": 4096, "max_datums_per_request": 3, "max_tokens_per_request": 20,
    "max_num_samples": 3, "max_sample_tokens": 5, "order_wait_ms": 250, "max_sessions": 2,
    "max_runs_per_session": 2, "max_versions_per_run": 2, "min_ttl_seconds": 2,
    "max_ttl_seconds": 10,
}


def test_disc_1_every_limit_is_published_with_its_configured_value(make_mock):
    mock = make_mock(limits=SMALL_LIMITS, order_wait_ms=None)
    published = capabilities(mock.client(KEY))
    assert published["limits"] == SMALL_LIMITS
    [model] = [m for m in published["base_models"] if m["id"] == MODEL]
    assert model["max_context"] == MAX_CONTEXT


def test_disc_1_order_wait_ms_argument_is_what_capabilities_publish(make_mock):
    mock = make_mock(order_wait_ms=37)
    assert capabilities(mock.client(KEY))["limits"]["order_wait_ms"] == 37


def test_unknown_limit_name_is_refused_at_construction(make_mock):
    with pytest.raises(ValueError, match="unknown limit"):
        make_mock(limits={"max_bodies": 1})


# -- per-request limits (§4a: 422 limit_exceeded, refused before the turn, ORD-4) -------------
def refused_without_effect(mock: Any, run: RunHandle, primitive: str, body: dict[str, Any],
                           limit: str) -> None:
    before = state_snapshot(mock.backend, run.run_id)
    error = expect_error(run.post(primitive, body, seq=before["next_seq"]), 422,
                         "limit_exceeded")
    assert error["details"].get("limit", limit) == limit
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


def accepted(run: RunHandle, primitive: str, body: dict[str, Any]) -> Any:
    response = run.post(primitive, body, seq=run.view()["next_seq"])
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("primitive", ["forward", "forward_backward"])
def test_max_datums_per_request_at_limit_and_one_over(make_mock, primitive):
    mock = make_mock(limits={"max_datums_per_request": 3})
    run = new_run(mock.client(KEY))
    assert capabilities(run.client)["limits"]["max_datums_per_request"] == 3
    body = {"loss_function": "cross_entropy", "loss_config": {}}
    refused_without_effect(mock, run, primitive,
                           {**body, "data": [datum_of_length(2, i) for i in range(4)]},
                           "max_datums_per_request")
    result = accepted(run, primitive, {**body, "data": [datum_of_length(2, i) for i in range(3)]})
    assert len(result["outputs"]) == 3


@pytest.mark.parametrize("primitive", ["forward", "forward_backward"])
def test_max_tokens_per_request_at_limit_and_one_over(make_mock, primitive):
    mock = make_mock(limits={"max_tokens_per_request": 20})
    run = new_run(mock.client(KEY))
    assert capabilities(run.client)["limits"]["max_tokens_per_request"] == 20
    body = {"loss_function": "cross_entropy", "loss_config": {}}
    refused_without_effect(mock, run, primitive,
                           {**body, "data": [datum_of_length(10), datum_of_length(11)]},
                           "max_tokens_per_request")
    result = accepted(run, primitive, {**body, "data": [datum_of_length(10),
                                                        datum_of_length(10)]})
    assert result["metrics"]["tokens"] == 20


def test_max_tokens_per_request_applies_to_logprobs(make_mock):
    mock = make_mock(limits={"max_tokens_per_request": 20})
    run = new_run(mock.client(KEY))
    run.save(0)
    refused_without_effect(mock, run, "logprobs", {"version": 0, "token_ids": [BOS] + [97] * 20},
                           "max_tokens_per_request")
    result = accepted(run, "logprobs", {"version": 0, "token_ids": [BOS] + [97] * 19})
    assert len(result["logprobs"]) == 20


def sample_body(num_samples: int = 1, max_tokens: int = 2, prompt_len: int = 2) -> dict:
    return {"version": 0, "prompt": {"token_ids": [BOS] + [97] * (prompt_len - 1)},
            "num_samples": num_samples,
            "sampling": {"max_tokens": max_tokens, "temperature": 1.0, "top_k": 0,
                         "top_p": 1.0, "seed": 3}}


def test_max_num_samples_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_num_samples": 3})
    run = new_run(mock.client(KEY))
    run.save(0)
    assert capabilities(run.client)["limits"]["max_num_samples"] == 3
    refused_without_effect(mock, run, "sample", sample_body(num_samples=4), "max_num_samples")
    assert len(accepted(run, "sample", sample_body(num_samples=3))["sequences"]) == 3


def test_max_sample_tokens_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_sample_tokens": 5})
    run = new_run(mock.client(KEY))
    run.save(0)
    assert capabilities(run.client)["limits"]["max_sample_tokens"] == 5
    refused_without_effect(mock, run, "sample", sample_body(max_tokens=6), "max_sample_tokens")
    body = sample_body(num_samples=3, max_tokens=5)
    body["sampling"]["stop_token_ids"] = []  # no stop token: every row runs to max_tokens
    sequences = accepted(run, "sample", body)["sequences"]
    assert [len(s["tokens"]) for s in sequences] == [5, 5, 5]
    assert {s["stop_reason"] for s in sequences} == {"length"}


def test_max_context_prompt_plus_max_tokens_at_limit_and_one_over(mock, client):
    run = new_run(client)
    run.save(0)
    refused_without_effect(mock, run, "sample",
                           sample_body(max_tokens=5, prompt_len=MAX_CONTEXT - 4), "max_context")
    body = sample_body(max_tokens=5, prompt_len=MAX_CONTEXT - 5)
    assert len(accepted(run, "sample", body)["sequences"]) == 1


@pytest.mark.parametrize("primitive", ["forward", "logprobs"])
def test_max_context_single_datum_at_limit_and_one_over(mock, client, primitive):
    run = new_run(client)
    run.save(0)

    def body(n: int) -> dict[str, Any]:
        if primitive == "logprobs":
            return {"version": 0, "token_ids": [BOS] + [97] * (n - 1)}
        return {"loss_function": "cross_entropy", "loss_config": {},
                "data": [datum_of_length(n)]}

    refused_without_effect(mock, run, primitive, body(MAX_CONTEXT + 1), "max_context")
    result = accepted(run, primitive, body(MAX_CONTEXT))
    lengths = [len(result["logprobs"])] if primitive == "logprobs" \
        else [len(o["logprobs"]) for o in result["outputs"]]
    assert lengths == [MAX_CONTEXT]


# -- quotas (§4a: 409 quota_exceeded) ----------------------------------------------------------
def test_max_sessions_per_key_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_sessions": 2})
    a, b = mock.client(KEY), mock.client(OTHER_KEY)
    assert capabilities(a)["limits"]["max_sessions"] == 2
    first = [a.post(f"{API}/sessions", json={}) for _ in range(2)]
    assert [r.status_code for r in first] == [201, 201]
    before = session_count(mock)
    error = expect_error(a.post(f"{API}/sessions", json={}), 409, "quota_exceeded")
    assert error["details"].get("limit", "max_sessions") == "max_sessions"
    assert session_count(mock) == before
    # Per key: the other tenant still has its whole quota (SEC-2).
    assert [b.post(f"{API}/sessions", json={}).status_code for _ in range(2)] == [201, 201]
    expect_error(b.post(f"{API}/sessions", json={}), 409, "quota_exceeded")
    # The quota counts open sessions: closing one gives its slot back (a long-lived client
    # that closes what it opens never runs out).
    closed = a.post(f"{API}/sessions/{first[0].json()['session_id']}/close", json={})
    assert closed.status_code == 200, closed.text
    assert a.post(f"{API}/sessions", json={}).status_code == 201


def create_run(client: httpx.Client, session_id: str) -> httpx.Response:
    return client.post(f"{API}/sessions/{session_id}/runs", json={
        "base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 0}, "optimizer": "adamw"})


def test_max_runs_per_session_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_runs_per_session": 2})
    client = mock.client(KEY)
    assert capabilities(client)["limits"]["max_runs_per_session"] == 2
    session_id = client.post(f"{API}/sessions", json={}).json()["session_id"]
    assert [create_run(client, session_id).status_code for _ in range(2)] == [201, 201]
    runs_before = dict(mock.backend.runs)
    error = expect_error(create_run(client, session_id), 409, "quota_exceeded")
    assert error["details"].get("limit", "max_runs_per_session") == "max_runs_per_session"
    assert mock.backend.runs.keys() == runs_before.keys()
    # Per session: another session of the same key has its own quota.
    other = client.post(f"{API}/sessions", json={}).json()["session_id"]
    assert create_run(client, other).status_code == 201


def test_max_versions_per_run_at_limit_and_one_over_is_recorded(make_mock):
    """§4a: ``quota_exceeded`` at its turn is recorded as failed, consumes its seq (ORD-4) and
    changes no training state (ERR-3)."""
    mock = make_mock(limits={"max_versions_per_run": 2})
    run = new_run(mock.client(KEY))
    assert capabilities(run.client)["limits"]["max_versions_per_run"] == 2
    run.save(0)
    run.save(5)
    before = state_snapshot(mock.backend, run.run_id)
    seq = before["next_seq"]
    error = expect_error(run.post("save_weights_for_sampler", {"version": 6}, seq=seq), 409,
                         "quota_exceeded")
    after = state_snapshot(mock.backend, run.run_id)
    assert after["next_seq"] == seq + 1 and after["ops"] == before["ops"] + [seq]
    record = run.operation(seq).json()
    assert record["status"] == "failed" and record["error"] == error
    for key in ("next_seq", "ops"):
        after[key] = before[key]
    assert_same_state(before, after)
    assert [v["version"] for v in run.view()["versions"]] == [0, 5]


# -- TTL bounds (LIFE-2: ttl_seconds in [min_ttl_seconds, max_ttl_seconds], else 422) ----------
@pytest.mark.parametrize("ttl,status", [(2, 201), (10, 201), (1, 422), (11, 422)])
def test_ttl_bounds_at_limits_and_one_outside(make_mock, ttl, status):
    mock = make_mock(limits={"min_ttl_seconds": 2, "max_ttl_seconds": 10})
    client = mock.client(KEY)
    limits = capabilities(client)["limits"]
    assert (limits["min_ttl_seconds"], limits["max_ttl_seconds"]) == (2, 10)
    response = client.post(f"{API}/sessions", json={"ttl_seconds": ttl})
    if status == 201:
        assert response.status_code == 201, response.text
    else:
        expect_error(response, 422)
        assert session_count(mock) == 0
