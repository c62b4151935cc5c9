"""Contract rules ERR-1..4 over HTTP: bad input gets the envelope with the right status and
type, and the run is exactly as before (next_seq, step, weights, gradient buffer, moments,
versions), bit for bit.

Bodies are written as raw bytes where the point is the JSON text itself (NaN, 1e999, 1.0).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import (
    ADAMW,
    API,
    MODEL,
    assert_same_state,
    ce_datum,
    expect_error,
    live_server,
    new_run,
    state_snapshot,
    text_tokens,
)

NEXT = 5  # the primed run below has executed seqs 1..4
ADAMW_JSON = json.dumps(ADAMW)
SAMPLING = {"max_tokens": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
TOKENS = text_tokens("hey")
FB = {"loss_function": "cross_entropy", "loss_config": {}, "data": [ce_datum(TOKENS)]}


@pytest.fixture
def primed(mock, client):
    """A run with a step taken, a version saved and a gradient pending: all ERR-3 state."""
    handle = new_run(client)
    handle.ok("forward_backward", FB)
    handle.ok("optim_step", {"adamw": ADAMW})
    handle.ok("save_weights_for_sampler", {"version": 0})
    handle.ok("forward_backward", FB)
    assert mock.backend.runs[handle.run_id].grads is not None
    return handle


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


def sample_body(**changes: Any) -> dict[str, Any]:
    sampling = with_(SAMPLING, **changes.pop("sampling", {}))
    return with_({"seq": NEXT, "version": 0, "prompt": {"token_ids": TOKENS}, "num_samples": 2,
                  "sampling": sampling}, **changes)


def opt_body(**adamw: Any) -> dict[str, Any]:
    return {"seq": NEXT, "adamw": with_(ADAMW, **adamw)}


def fb_body(**changes: Any) -> dict[str, Any]:
    return with_({"seq": NEXT, **FB}, **changes)


def datum(token_ids: list[Any], targets: list[Any]) -> dict[str, Any]:
    return {"model_input": {"token_ids": token_ids}, "loss_inputs": {"target_tokens": targets}}


RAW_CASES: list[tuple[str, str, bytes, int, str | None]] = [
    # id, primitive, raw body, status, error.type
    ("truncated", "optim_step", b'{"seq": 5, "adamw": ', 400, "malformed_json"),
    ("not-json", "optim_step", b"seq=5", 400, "malformed_json"),
    ("trailing-garbage", "optim_step", b'{"seq": 5}x', 400, "malformed_json"),
    ("single-quotes", "optim_step", b"{'seq': 5}", 400, "malformed_json"),
    ("nan", "optim_step",
     b'{"seq": 5, "adamw": ' + ADAMW_JSON.replace("0.01,", "NaN,", 1).encode() + b"}",
     400, "malformed_json"),
    ("infinity", "optim_step",
     b'{"seq": 5, "adamw": ' + ADAMW_JSON.replace("0.01,", "Infinity,", 1).encode() + b"}",
     400, "malformed_json"),
    ("minus-infinity", "forward_backward",
     json.dumps(fb_body()).replace('"seq": 5', '"seq": 5, "x": -Infinity').encode(),
     400, "malformed_json"),
    ("invalid-utf8", "save_state", b'{"seq": 5, "name": "\xff\xfe"}', 400, "malformed_json"),
    ("invalid-utf8-outside-strings", "optim_step", b'{"seq": 5\xc3}', 400, "malformed_json"),
    ("1e999", "optim_step",
     b'{"seq": 5, "adamw": ' + ADAMW_JSON.replace("0.01,", "1e999,", 1).encode() + b"}",
     422, None),
    ("-1e999-in-loss-input", "forward_backward",
     json.dumps({"seq": 5, "loss_function": "cross_entropy", "loss_config": {}, "data": [{
         "model_input": {"token_ids": [256, 104]},
         "loss_inputs": {"target_tokens": [104, 105], "weights": [1.0, -7.5]}}]})
     .replace("-7.5", "-1e999").encode(), 422, None),
    ("seq-30-digits", "optim_step",
     b'{"seq": 123456789012345678901234567890, "adamw": ' + ADAMW_JSON.encode() + b"}",
     422, None),
    # contract 1.1: 5.0 and 5e0 are the integer 5 (tests/http/test_integers_by_value.py)
    ("seq-float-5.5", "optim_step", b'{"seq": 5.5, "adamw": ' + ADAMW_JSON.encode() + b"}",
     422, None),
    ("seq-exponent-fraction", "optim_step",
     b'{"seq": 55e-1, "adamw": ' + ADAMW_JSON.encode() + b"}", 422, None),
    ("array-body", "optim_step", b"[5]", 422, None),
    ("null-body", "optim_step", b"null", 422, None),
    ("empty-body", "optim_step", b"", 422, None),
]


@pytest.mark.parametrize("primitive,raw,status,error_type",
                         [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES])
def test_err_2_raw_bodies(mock, primed, primitive, raw, status, error_type):
    """ERR-2 statuses (400 malformed_json / 422) for raw JSON text; ERR-3 no state change."""
    before = state_snapshot(mock.backend, primed.run_id)
    response = primed.client.post(primed.url(primitive), content=raw,
                                  headers={"Content-Type": "application/json"})
    expect_error(response, status, error_type)
    assert_same_state(before, state_snapshot(mock.backend, primed.run_id))


BODY_CASES: list[tuple[str, str, dict[str, Any], str | None]] = [
    # id, primitive, body, error.type (all 422)
    ("seq-string", "optim_step", with_(opt_body(), seq="5"), None),
    ("seq-true", "optim_step", with_(opt_body(), seq=True), None),
    ("seq-negative", "optim_step", with_(opt_body(), seq=-1), None),
    ("seq-zero", "optim_step", with_(opt_body(), seq=0), None),
    ("seq-null", "optim_step", with_(opt_body(), seq=None), None),
    ("seq-beyond-int64", "optim_step", with_(opt_body(), seq=2**63), None),
    ("seq-missing", "optim_step", {"adamw": ADAMW}, None),
    ("lr-true", "optim_step", opt_body(learning_rate=True), None),
    ("lr-string", "optim_step", opt_body(learning_rate="0.01"), None),
    ("lr-negative", "optim_step", opt_body(learning_rate=-0.1), None),
    ("beta1-one", "optim_step", opt_body(beta1=1.0), None),
    ("beta2-negative", "optim_step", opt_body(beta2=-0.1), None),
    ("eps-zero", "optim_step", opt_body(eps=0.0), None),
    ("wd-negative", "optim_step", opt_body(weight_decay=-1.0), None),
    ("clip-negative", "optim_step", opt_body(grad_clip_norm=-1.0), None),
    ("adamw-list", "optim_step", {"seq": NEXT, "adamw": [ADAMW]}, None),
    ("token-ids-string", "forward_backward",
     fb_body(data=[datum("abc", [1, 2, 3])]), None),  # type: ignore[arg-type]
    ("token-id-true", "forward_backward", fb_body(data=[datum([256, True], [104, 105])]), None),
    ("token-id-fraction", "forward_backward", fb_body(data=[datum([256, 104.5], [104, 105])]),
     None),
    ("token-id-oov", "forward_backward", fb_body(data=[datum([256, 258], [104, 105])]), None),
    ("token-id-negative", "forward_backward", fb_body(data=[datum([256, -1], [104, 105])]), None),
    ("target-oov", "forward_backward", fb_body(data=[datum([256, 104], [104, 300])]), None),
    ("target-true", "forward_backward", fb_body(data=[datum([256, 104], [104, True])]), None),
    ("length-mismatch", "forward_backward", fb_body(data=[datum([256, 104, 105], [104, 105])]),
     None),
    ("empty-token-ids", "forward_backward", fb_body(data=[datum([], [])]), None),
    ("data-object", "forward_backward", fb_body(data={"0": datum([256], [104])}), None),
    ("loss-config-list", "forward_backward", fb_body(loss_config=[]), None),
    ("loss-config-bool", "forward_backward",
     fb_body(loss_function="dro", loss_config={"beta": True}), None),
    ("prompt-oov", "sample", sample_body(prompt={"token_ids": [256, 999]}), None),
    ("prompt-empty", "sample", sample_body(prompt={"token_ids": []}), None),
    ("num-samples-true", "sample", sample_body(num_samples=True), None),
    ("num-samples-zero", "sample", sample_body(num_samples=0), None),
    ("version-negative", "sample", sample_body(version=-1), None),
    ("version-fraction", "sample", sample_body(version=0.5), None),
    ("temperature-zero", "sample", sample_body(sampling={"temperature": 0}), None),
    ("temperature-101", "sample", sample_body(sampling={"temperature": 101}), None),
    ("top-k-negative", "sample", sample_body(sampling={"top_k": -1}), None),
    ("top-k-above-vocab", "sample", sample_body(sampling={"top_k": 259}), None),
    ("top-k-true", "sample", sample_body(sampling={"top_k": True}), None),
    ("top-p-zero", "sample", sample_body(sampling={"top_p": 0.0}), None),
    ("top-p-above-one", "sample", sample_body(sampling={"top_p": 1.5}), None),
    ("max-tokens-zero", "sample", sample_body(sampling={"max_tokens": 0}), None),
    ("stop-token-oov", "sample", sample_body(sampling={"stop_token_ids": [300]}), None),
    ("num-samples-over-limit", "sample", sample_body(num_samples=65), "limit_exceeded"),
    ("max-tokens-over-limit", "sample", sample_body(sampling={"max_tokens": 1025}),
     "limit_exceeded"),
    ("prompt-plus-max-tokens-over-context", "sample",
     sample_body(prompt={"token_ids": [97] * 1500}, sampling={"max_tokens": 1000}),
     "limit_exceeded"),
    ("datums-over-limit", "forward_backward", fb_body(data=[ce_datum(TOKENS)] * 257),
     "limit_exceeded"),
    ("logprobs-oov", "logprobs", {"seq": NEXT, "version": 0, "token_ids": [256, 258]}, None),
    ("with-optimizer-string", "load_state",
     {"seq": NEXT, "checkpoint_id": "ckpt_x", "with_optimizer": "true"}, None),
    ("with-optimizer-int", "load_state",
     {"seq": NEXT, "checkpoint_id": "ckpt_x", "with_optimizer": 1}, None),
    ("name-empty", "save_state", {"seq": NEXT, "name": ""}, None),
    ("name-number", "save_state", {"seq": NEXT, "name": 7}, None),
    # ERR-4: nothing silently ignored
    ("err4-grad-clip-typo", "optim_step",
     {"seq": NEXT, "adamw": {**{k: v for k, v in ADAMW.items() if k != "grad_clip_norm"},
                             "grad_clip": 1.0}}, "unknown_field"),
    ("err4-extra-adamw-field", "optim_step", opt_body(amsgrad=False), "unknown_field"),
    ("err4-top-level", "optim_step", with_(opt_body(), dry_run=True), "unknown_field"),
    ("err4-sampling", "sample", sample_body(sampling={"temp": 0.5}), "unknown_field"),
    ("err4-datum", "forward_backward",
     fb_body(data=[{**ce_datum(TOKENS), "weight": 1.0}]), "unknown_field"),
    ("err4-model-input", "forward_backward",
     fb_body(data=[{**ce_datum(TOKENS), "model_input": {"token_ids": TOKENS[:-1],
                                                         "attention_mask": [1] * 3}}]),
     "unknown_field"),
    ("err4-export", "export_lora", {"seq": NEXT, "format": "peft"}, "unknown_field"),
]


@pytest.mark.parametrize("primitive,body,error_type", [c[1:] for c in BODY_CASES],
                         ids=[c[0] for c in BODY_CASES])
def test_err_2_err_4_invalid_bodies_are_422_without_effect(mock, primed, primitive, body,
                                                           error_type):
    """ERR-2 422 (types, bools, ranges, limits), ERR-4 unknown_field, ERR-3 no state change."""
    before = state_snapshot(mock.backend, primed.run_id)
    expect_error(primed.client.post(primed.url(primitive), json=body), 422, error_type)
    assert_same_state(before, state_snapshot(mock.backend, primed.run_id))


@pytest.mark.parametrize("primitive,body", [
    ("optim_step", opt_body(learning_rate=0, beta1=0, beta2=0, weight_decay=0, grad_clip_norm=0,
                            eps=1e-300)),
    ("sample", sample_body(sampling={"temperature": 100, "top_k": 258, "top_p": 1.0,
                                     "max_tokens": 1024, "stop_token_ids": []},
                           prompt={"token_ids": [97] * 1024}, num_samples=1)),
    ("sample", sample_body(sampling={"temperature": 1e-3, "top_k": 1, "top_p": 1e-9})),
    ("logprobs", {"seq": NEXT, "version": 0, "token_ids": [257]}),
    ("forward_backward", fb_body(loss_function="ppo", loss_config={
        "clip_low_threshold": 0.0, "clip_high_threshold": 10.0}, data=[{
            "model_input": {"token_ids": [256]},
            "loss_inputs": {"target_tokens": [97.0], "logprobs": [-1], "advantages": [0]}}])),
], ids=["adamw-bounds", "sample-upper-bounds", "sample-lower-bounds", "logprobs-one-token",
        "ppo-clip-bounds"])
def test_err_2_values_on_the_edges_of_their_ranges_are_accepted(primed, primitive, body):
    """The ranges of contract §4a are inclusive where it says so (top_k = vocab_size, ...)."""
    response = primed.client.post(primed.url(primitive), json=body)
    assert response.status_code == 200, response.text
    if primitive == "logprobs":
        assert response.json()["logprobs"] == [None]


@pytest.mark.parametrize("path,body", [
    ("sessions", {"ttl_seconds": 60, "metdata": {}}),
    ("sessions/{sid}/heartbeat", {"now": 1}),
    ("sessions/{sid}/close", {"force": True}),
    ("runs/{rid}/finish", {"reason": "done"}),
    ("runs/{rid}/cancel", {"reason": "oops"}),
])
def test_err_4_unknown_field_on_lifecycle_endpoints(mock, primed, path, body):
    before = state_snapshot(mock.backend, primed.run_id)
    url = f"{API}/" + path.format(sid=primed.session_id, rid=primed.run_id)
    expect_error(primed.client.post(url, json=body), 422, "unknown_field")
    assert_same_state(before, state_snapshot(mock.backend, primed.run_id))
    assert primed.client.get(f"{API}/sessions/{primed.session_id}").json()["state"] == "open"
    assert len(mock.backend.sessions) == 1


def test_err_2_body_too_large_is_413_in_the_envelope(make_mock):
    mock = make_mock(limits={"max_body_bytes": 4096})
    handle = new_run(mock.client())
    handle.ok("forward_backward", FB)
    before = state_snapshot(mock.backend, handle.run_id)
    big = fb_body(seq=2, data=[ce_datum(text_tokens("x" * 1500))])
    assert len(json.dumps(big)) > 4096
    error = expect_error(handle.client.post(handle.url("forward_backward"), json=big), 413,
                         "body_too_large")
    assert isinstance(error["details"], dict)
    expect_error(handle.client.post(f"{API}/sessions", json={"metadata": {"k": "v" * 5000}}),
                 413, "body_too_large")
    assert_same_state(before, state_snapshot(mock.backend, handle.run_id))
    assert len(mock.backend.sessions) == 1
    assert handle.ok("forward_backward", fb_body(seq=2))["metrics"]["tokens"] == 3


def test_err_2_body_too_large_streamed_without_content_length(make_mock):
    """Over real HTTP with chunked transfer: refused while reading, still the envelope."""
    mock = make_mock(limits={"max_body_bytes": 4096})
    with live_server(mock.app) as base_url:
        import httpx

        with httpx.Client(base_url=base_url, timeout=30,
                          headers={"Authorization": "Bearer test-key-1"}) as client:
            handle = new_run(client)
            before = state_snapshot(mock.backend, handle.run_id)
            payload = json.dumps(fb_body(seq=1, data=[ce_datum(text_tokens("y" * 3000))]))

            def chunks():
                for start in range(0, len(payload), 1000):
                    yield payload[start:start + 1000].encode()

            response = client.post(handle.url("forward_backward"), content=chunks())
            assert "content-length" not in {k.lower() for k in response.request.headers}
            expect_error(response, 413, "body_too_large")
            assert_same_state(before, state_snapshot(mock.backend, handle.run_id))


def test_err_1_framework_errors_use_the_envelope(client, run):
    expect_error(client.get(f"{API}/nope"), 404)
    expect_error(client.post(run.url("teleport"), json={"seq": 1}), 404)
    expect_error(client.get(run.url("optim_step")), 405)
    expect_error(client.delete(f"{API}/sessions/{run.session_id}"), 405)


def test_err_2_throttled_is_429_with_retry_after_and_not_recorded(make_mock):
    """ERR-2 429 + Retry-After (via the mock's control plane); ORD-4: refused before its turn."""
    mock = make_mock(control_plane=True)
    client = mock.client()
    handle = new_run(client)
    handle.ok("forward_backward", FB)
    added = client.post("/_mock/faults", json={"kind": "throttle", "primitive": "optim_step",
                                              "run_id": handle.run_id, "retry_after": 2,
                                              "count": 1})
    assert added.status_code == 201, added.text
    before = state_snapshot(mock.backend, handle.run_id)
    throttled = handle.post("optim_step", {"adamw": ADAMW}, seq=2)
    expect_error(throttled, 429)
    assert throttled.headers["Retry-After"] == "2"
    assert_same_state(before, state_snapshot(mock.backend, handle.run_id))
    assert handle.ok("optim_step", {"adamw": ADAMW}, seq=2)["step"] == 1


def test_err_3_state_failures_at_turn_change_no_training_state(mock, primed):
    """409/404 at the turn: recorded (ORD-4) but weights, buffer, moments, versions unchanged."""
    before = state_snapshot(mock.backend, primed.run_id)
    expect_error(primed.post("save_weights_for_sampler", {"version": 0}, seq=NEXT), 409,
                 "version_conflict")
    expect_error(primed.post("logprobs", {"version": 4, "token_ids": TOKENS}, seq=NEXT + 1), 404,
                 "version_not_found")
    expect_error(primed.post("load_state", {"checkpoint_id": "ckpt_missing",
                                            "with_optimizer": True}, seq=NEXT + 2), 404,
                 "checkpoint_not_found")
    after = state_snapshot(mock.backend, primed.run_id)
    assert after["next_seq"] == NEXT + 3
    after["next_seq"], after["ops"] = before["next_seq"], before["ops"]
    assert_same_state(before, after)


def test_err_2_lone_surrogate_string_is_a_4xx_without_effect(mock, client):
    response = client.post(f"{API}/sessions", content=b'{"metadata": {"k": "\\ud800"}}')
    assert response.status_code in (400, 422)
    expect_error(response, response.status_code)
    assert mock.backend.sessions == {}


def test_err_2_unknown_session_run_and_model(client):
    expect_error(client.post(f"{API}/sessions/sess_x/runs", json={
        "base_model": MODEL, "lora": {"rank": 2, "alpha": 4}, "optimizer": "adamw"}), 404)
    expect_error(client.post(f"{API}/runs/run_x/optim_step", json=opt_body()), 404)
    expect_error(client.post(f"{API}/runs/run_x/optim_step", content=b"{nope"), 404)
