"""Contract rules TRANSPORT-1, SEC-1/2 and DISC-1/2 over HTTP (in-process): request ids,
authentication, tenant isolation and the capabilities document.

Expected values come from the contract text (whitney-contract.md), not from the mock's code.
"""

from __future__ import annotations

import pytest
from conftest import (
    ADAMW,
    API,
    KEY,
    MODEL,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    state_snapshot,
    text_tokens,
)

ALL_PRIMITIVES = {"forward", "forward_backward", "optim_step", "save_weights_for_sampler",
                  "sample", "logprobs", "save_state", "load_state", "export_lora"}
ALL_LOSSES = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}
LIMIT_KEYS = {"max_body_bytes", "max_datums_per_request", "max_tokens_per_request",
              "max_num_samples", "max_sample_tokens", "order_wait_ms", "max_sessions",
              "max_runs_per_session", "max_versions_per_run", "min_ttl_seconds",
              "max_ttl_seconds"}


# -- TRANSPORT-1 ------------------------------------------------------------------------------
@pytest.mark.parametrize("method,path,kwargs,status", [
    ("GET", f"{API}/capabilities", {}, 200),
    ("POST", f"{API}/sessions", {"json": {}}, 201),
    ("GET", f"{API}/sessions/sess_nope", {}, 404),
    ("POST", f"{API}/sessions", {"content": b"{"}, 400),
    ("POST", f"{API}/sessions", {"json": {"ttl_seconds": "1"}}, 422),
    ("GET", f"{API}/no/such/path", {}, 404),
])
def test_transport_1_request_id_echoed_on_every_response(client, method, path, kwargs, status):
    response = client.request(method, path, headers={"X-Request-Id": "req-abc-123"}, **kwargs)
    assert response.status_code == status
    assert response.headers["X-Request-Id"] == "req-abc-123"


def test_transport_1_request_id_generated_when_absent_and_on_401(mock):
    anonymous = mock.client(key=None)
    first = anonymous.get(f"{API}/capabilities")
    second = anonymous.get(f"{API}/capabilities")
    expect_error(first, 401)
    assert first.headers["X-Request-Id"] and second.headers["X-Request-Id"]
    assert first.headers["X-Request-Id"] != second.headers["X-Request-Id"]


# -- SEC-1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer wrong-key", f"Basic {KEY}",
                                           f"Token {KEY}", KEY])
def test_sec_1_missing_or_unknown_key_is_401(mock, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    anonymous = mock.client(key=None, headers=headers)
    expect_error(anonymous.get(f"{API}/capabilities"), 401)
    expect_error(anonymous.post(f"{API}/sessions", json={}), 401)
    assert mock.backend.sessions == {}


def test_sec_1_401_on_primitive_does_not_touch_the_run(mock, run):
    run.ok("forward_backward", {"loss_function": "cross_entropy", "loss_config": {},
                                "data": [ce_datum(text_tokens("hi"))]})
    before = state_snapshot(mock.backend, run.run_id)
    anonymous = mock.client(key="not-a-key")
    response = anonymous.post(run.url("optim_step"), json={"seq": 2, "adamw": ADAMW})
    expect_error(response, 401)
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


# -- SEC-2 ------------------------------------------------------------------------------------
def _foreign_and_unknown(owner_path: str, unknown_path: str, other_client, method="GET",
                         body=None):
    kwargs = {} if body is None else {"json": body}
    foreign = other_client.request(method, owner_path, **kwargs)
    unknown = other_client.request(method, unknown_path, **kwargs)
    foreign_error = expect_error(foreign, 404)
    unknown_error = expect_error(unknown, 404)
    assert foreign_error["type"] == unknown_error["type"]
    return foreign_error


def test_sec_2_foreign_session_reads_as_unknown_and_has_no_effect(mock, client, other_client,
                                                                  run):
    sid = run.session_id
    for method, tail, body in [("GET", "", None), ("POST", "/heartbeat", {}),
                               ("POST", "/close", {}),
                               ("POST", "/runs", {"base_model": MODEL,
                                                  "lora": {"rank": 2, "alpha": 4.0},
                                                  "optimizer": "adamw"})]:
        _foreign_and_unknown(f"{API}/sessions/{sid}{tail}", f"{API}/sessions/sess_unknown{tail}",
                             other_client, method, body)
    view = client.get(f"{API}/sessions/{sid}").json()
    assert view["state"] == "open"
    assert run.view()["state"] == "active"
    assert list(mock.backend.runs) == [run.run_id]


def test_sec_2_foreign_run_reads_as_unknown_and_has_no_effect(mock, client, other_client, run):
    run.forward_backward([ce_datum(text_tokens("abc"))])
    run.save(0)
    before = state_snapshot(mock.backend, run.run_id)
    rid = run.run_id
    cases = [("GET", "", None), ("POST", "/finish", {}), ("POST", "/cancel", {}),
             ("GET", "/operations/1", None),
             ("POST", "/optim_step", {"seq": 3, "adamw": ADAMW}),
             ("POST", "/save_weights_for_sampler", {"seq": 3, "version": 1}),
             ("POST", "/logprobs", {"seq": 3, "version": 0, "token_ids": [256, 97]}),
             # a replay of a recorded seq must not leak the recorded answer either
             ("POST", "/save_weights_for_sampler", {"seq": 2, "version": 0})]
    for method, tail, body in cases:
        _foreign_and_unknown(f"{API}/runs/{rid}{tail}", f"{API}/runs/run_unknown{tail}",
                             other_client, method, body)
    assert_same_state(before, state_snapshot(mock.backend, rid))
    assert run.view()["state"] == "active"


def test_sec_2_foreign_export_and_checkpoint_read_as_unknown(mock, client, other_client, run):
    run.forward_backward([ce_datum(text_tokens("abc"))])
    export = run.ok("export_lora")
    checkpoint = run.ok("save_state", {"name": "c"})
    path = f"exports/{export['export_id']}/adapter_config.json"
    assert client.get(run.url(path)).status_code == 200
    _foreign_and_unknown(run.url(path), f"{API}/runs/run_unknown/{path}", other_client)

    # the other tenant's own run cannot read the export or load the checkpoint by id
    theirs = new_run(other_client)
    _foreign_and_unknown(theirs.url(path), theirs.url("exports/exp_unknown/adapter_config.json"),
                         other_client)
    before = state_snapshot(mock.backend, theirs.run_id)
    foreign = theirs.post("load_state", {"checkpoint_id": checkpoint["checkpoint_id"],
                                         "with_optimizer": True})
    unknown = theirs.post("load_state", {"checkpoint_id": "ckpt_unknown", "with_optimizer": True})
    assert expect_error(foreign, 404)["type"] == expect_error(unknown, 404)["type"] \
        == "checkpoint_not_found"
    after = state_snapshot(mock.backend, theirs.run_id)
    # ORD-4: both failed at their turn and consumed a seq; nothing else moved (ERR-3)
    assert after["next_seq"] == before["next_seq"] + 2
    after["next_seq"], after["ops"] = before["next_seq"], before["ops"]
    assert_same_state(before, after)


# -- DISC-1 / DISC-2 --------------------------------------------------------------------------
def test_disc_1_capabilities_document(client):
    caps = client.get(f"{API}/capabilities").json()
    assert caps["contract_version"] == "1.1"
    assert set(caps["primitives"]) == ALL_PRIMITIVES
    assert caps["optimizers"] == ["adamw"]
    for _name, spec in caps["loss_functions"].items():
        assert set(spec) >= {"inputs", "config"}
        assert set(spec["inputs"]) == {"required", "optional"}
        for _key, bounds in spec["config"].items():
            assert set(bounds) >= {"default", "min", "max"}
            assert bounds["min"] <= bounds["default"] <= bounds["max"]
    losses = caps["loss_functions"]
    assert losses["cross_entropy"]["inputs"]["required"] == ["target_tokens"]
    assert losses["cross_entropy"]["inputs"]["optional"] == ["weights"]
    for rl in ("importance_sampling", "ppo", "cispo", "dro"):
        assert set(losses[rl]["inputs"]["required"]) == {"target_tokens", "logprobs",
                                                         "advantages"}
        assert losses[rl]["inputs"]["optional"] == ["mask"]
    for clipped in ("ppo", "cispo"):
        assert losses[clipped]["config"]["clip_low_threshold"]["default"] == 0.8
        assert losses[clipped]["config"]["clip_high_threshold"]["default"] == 1.2
    assert losses["dro"]["config"]["beta"]["default"] == 0.05
    (model,) = [m for m in caps["base_models"] if m["id"] == MODEL]
    assert set(model) >= {"id", "vocab_size", "max_context", "eos_token_id", "max_lora_rank"}
    assert model["vocab_size"] == 258 and model["eos_token_id"] == 257
    assert set(caps["limits"]) >= LIMIT_KEYS
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in caps["limits"].values())
    assert caps["limits"]["order_wait_ms"] == 300  # the value the test app was built with
    assert isinstance(caps["features"]["deterministic_sampling"], bool)
    assert isinstance(caps["features"]["session_ttl"], bool)
    assert isinstance(caps["features"]["logprob_tolerance"], (int, float))
    # contract 1.1's optional features: the mock declares them all
    for feature in ("idempotent_create", "session_listing", "seq_error_details",
                    "exports_after_close"):
        assert caps["features"][feature] is True


def test_disc_1_capabilities_require_auth(mock):
    expect_error(mock.client(key=None).get(f"{API}/capabilities"), 401)


def test_disc_2_capabilities_list_every_loss_the_mock_implements(client, run):
    """Every advertised loss works, and the mock advertises all five (contract §4a)."""
    losses = client.get(f"{API}/capabilities").json()["loss_functions"]
    assert set(losses) == ALL_LOSSES
    tokens = text_tokens("hello")
    for name, spec in losses.items():
        inputs = {"target_tokens": tokens[1:]}
        if "logprobs" in spec["inputs"]["required"]:
            inputs |= {"logprobs": [-2.0] * 5, "advantages": [0.5] * 5}
        body = {"loss_function": name, "loss_config": {},
                "data": [{"model_input": {"token_ids": tokens[:-1]}, "loss_inputs": inputs}]}
        result = run.ok("forward", body)
        assert result["metrics"]["tokens"] == 5
    bogus = run.post("forward", {"loss_function": "grpo", "loss_config": {},
                                 "data": [ce_datum(tokens)]})
    expect_error(bogus, 422, "unsupported_loss_function")
