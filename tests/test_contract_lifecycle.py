"""Contract rules TRANSPORT-1, SEC-1/2, DISC-1/2 and LIFE-1..8 over HTTP (in-process).

Expected values come from the contract text (whitney-contract.md), not from the mock's code.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

from mock_server import Features

from conftest import (
    ADAMW, API, KEY, MODEL, RunHandle, ce_datum, expect_error, new_run,
    state_snapshot, assert_same_state, text_tokens, wait_held,
)

ALL_PRIMITIVES = {"forward", "forward_backward", "optim_step", "save_weights_for_sampler",
                  "sample", "logprobs", "save_state", "load_state", "export_lora"}
ALL_LOSSES = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}
LIMIT_KEYS = {"max_body_bytes", "max_datums_per_request", "max_tokens_per_request",
              "max_num_samples", "max_sample_tokens", "order_wait_ms", "max_sessions",
              "max_runs_per_session", "max_versions_per_run", "min_ttl_seconds",
              "max_ttl_seconds"}


def parse_rfc3339_utc(text: str) -> datetime:
    """LIFE-1: RFC 3339 UTC ('Z' or '+00:00')."""
    assert text.endswith("Z") or text.endswith("+00:00"), text
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.utcoffset() == timezone.utc.utcoffset(None)
    return parsed


def wait_terminal(handle: RunHandle, timeout: float = 5.0) -> dict:
    """Poll GET /runs/{rid} until terminal (LIFE-7's client loop); bounded, not a timing check."""
    deadline = time.monotonic() + timeout
    while True:
        view = handle.view()
        if view["state"] in {"finished", "cancelled", "failed"}:
            return view
        assert time.monotonic() < deadline, f"run still {view['state']}"
        time.sleep(0.01)


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
    assert caps["contract_version"] == "1.0"
    assert set(caps["primitives"]) == ALL_PRIMITIVES
    assert caps["optimizers"] == ["adamw"]
    for name, spec in caps["loss_functions"].items():
        assert set(spec) >= {"inputs", "config"}
        assert set(spec["inputs"]) == {"required", "optional"}
        for key, bounds in spec["config"].items():
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


# -- LIFE-1 -----------------------------------------------------------------------------------
def test_life_1_create_and_get_session(client):
    response = client.post(f"{API}/sessions", json={"metadata": {"owner": "alice", "job": "x"}})
    assert response.status_code == 201
    view = response.json()
    assert set(view) == {"session_id", "state", "created_at", "expires_at", "metadata"}
    assert view["state"] == "open" and view["expires_at"] is None
    assert view["metadata"] == {"owner": "alice", "job": "x"}
    parse_rfc3339_utc(view["created_at"])
    assert client.get(f"{API}/sessions/{view['session_id']}").json() == view


# -- LIFE-2 -----------------------------------------------------------------------------------
def test_life_2_ttl_and_heartbeat_move_expires_at(make_mock, fake_clock):
    client = make_mock(clock=fake_clock).client()
    view = client.post(f"{API}/sessions", json={"ttl_seconds": 30}).json()
    created = parse_rfc3339_utc(view["created_at"])
    assert (parse_rfc3339_utc(view["expires_at"]) - created).total_seconds() == pytest.approx(30)
    fake_clock.advance(20)
    beat = client.post(f"{API}/sessions/{view['session_id']}/heartbeat", json={})
    assert beat.status_code == 200
    expires = parse_rfc3339_utc(beat.json()["expires_at"])
    assert (expires - created).total_seconds() == pytest.approx(50)
    assert client.get(f"{API}/sessions/{view['session_id']}").json()["expires_at"] \
        == beat.json()["expires_at"]


@pytest.mark.parametrize("ttl", [0, -1, 86_401, 1.5, "10", True])
def test_life_2_ttl_out_of_range_or_not_an_integer_is_422(mock, client, ttl):
    expect_error(client.post(f"{API}/sessions", json={"ttl_seconds": ttl}), 422)
    assert mock.backend.sessions == {}


def test_life_2_minimum_ttl_of_one_second_is_accepted(client):
    assert client.post(f"{API}/sessions", json={"ttl_seconds": 1}).status_code == 201


def test_life_2_heartbeat_without_ttl_keeps_expires_at_null(client):
    sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
    beat = client.post(f"{API}/sessions/{sid}/heartbeat", json={})
    assert beat.status_code == 200 and beat.json()["expires_at"] is None


def test_life_2_ttl_refused_when_feature_off(make_mock):
    client = make_mock(features=Features(session_ttl=False)).client()
    assert client.get(f"{API}/capabilities").json()["features"]["session_ttl"] is False
    expect_error(client.post(f"{API}/sessions", json={"ttl_seconds": 10}), 422)


# -- LIFE-3 -----------------------------------------------------------------------------------
def test_life_3_close_is_refused_while_a_run_is_active_then_allowed(mock, client, run):
    run.forward_backward([ce_datum(text_tokens("abc"))])
    before = state_snapshot(mock.backend, run.run_id)
    refused = client.post(f"{API}/sessions/{run.session_id}/close", json={})
    expect_error(refused, 409, "runs_not_terminal")
    assert client.get(f"{API}/sessions/{run.session_id}").json()["state"] == "open"
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))
    run.optim_step()  # the run still works

    assert client.post(run.url("finish"), json={}).json()["state"] == "finished"
    closed = client.post(f"{API}/sessions/{run.session_id}/close", json={})
    assert closed.status_code == 200 and closed.json()["state"] == "closed"
    again = client.post(f"{API}/sessions/{run.session_id}/close", json={})
    assert again.status_code == 200 and again.json() == closed.json()


def test_life_3_closed_session_accepts_no_new_run_nor_heartbeat(mock, client):
    sid = client.post(f"{API}/sessions", json={"ttl_seconds": 60}).json()["session_id"]
    client.post(f"{API}/sessions/{sid}/close", json={})
    runs_before = set(mock.backend.runs)
    refused = client.post(f"{API}/sessions/{sid}/runs", json={
        "base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0}, "optimizer": "adamw"})
    expect_error(refused, 409, "session_not_open")
    assert set(mock.backend.runs) == runs_before
    expect_error(client.post(f"{API}/sessions/{sid}/heartbeat", json={}), 409, "session_not_open")


def test_life_3_close_refused_while_run_is_cancelling(make_mock, fake_clock):
    client = make_mock(clock=fake_clock).client()
    handle = new_run(client)
    assert client.post(handle.url("cancel"), json={}).status_code == 202
    expect_error(client.post(f"{API}/sessions/{handle.session_id}/close", json={}), 409,
                 "runs_not_terminal")
    fake_clock.advance(1)
    assert client.post(f"{API}/sessions/{handle.session_id}/close", json={}).status_code == 200


# -- LIFE-4 -----------------------------------------------------------------------------------
def test_life_4_session_expires_without_heartbeat_and_cancels_its_runs(make_mock, fake_clock):
    client = make_mock(clock=fake_clock).client()
    handle = new_run(client, ttl_seconds=10)
    sid = handle.session_id
    for _ in range(3):  # heartbeats keep it alive well past the first expires_at
        fake_clock.advance(8)
        assert client.post(f"{API}/sessions/{sid}/heartbeat", json={}).status_code == 200
    assert client.get(f"{API}/sessions/{sid}").json()["state"] == "open"
    assert handle.view()["state"] == "active"
    handle.forward_backward([ce_datum(text_tokens("still alive"))])

    fake_clock.advance(10)  # expires_at passes without a heartbeat
    assert client.get(f"{API}/sessions/{sid}").json()["state"] == "expired"
    assert handle.view()["state"] == "cancelled"
    expect_error(handle.post("optim_step", {"adamw": ADAMW}), 409, "run_not_active")
    expect_error(client.post(f"{API}/sessions/{sid}/heartbeat", json={}), 409, "session_not_open")
    expect_error(client.post(f"{API}/sessions/{sid}/runs", json={
        "base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0}, "optimizer": "adamw"}),
        409, "session_not_open")
    closed = client.post(f"{API}/sessions/{sid}/close", json={})
    assert closed.status_code == 200 and closed.json()["state"] == "expired"


def test_life_4_expiry_fails_requests_held_for_ordering(make_mock, fake_clock):
    mock = make_mock(clock=fake_clock, order_wait_ms=10_000)
    client = mock.client()
    handle = new_run(client, ttl_seconds=5)
    results = {}
    held = threading.Thread(target=lambda: results.update(
        r=handle.post("optim_step", {"adamw": ADAMW}, seq=2)))
    held.start()
    wait_held(mock.backend, handle.run_id, 2)
    fake_clock.advance(6)
    assert client.get(f"{API}/sessions/{handle.session_id}").json()["state"] == "expired"
    held.join(timeout=10)
    expect_error(results["r"], 409, "run_cancelled")
    assert handle.view()["state"] == "cancelled"
    assert handle.operation(2).status_code == 404


def test_life_4_real_clock_ttl_of_one_second(client):
    """LIFE-4 with the real clock: a 1 s TTL reads expired within 1 s after expires_at."""
    handle = new_run(client, ttl_seconds=1)
    view = client.get(f"{API}/sessions/{handle.session_id}").json()
    expires = parse_rfc3339_utc(view["expires_at"]).timestamp()
    time.sleep(max(0.0, expires - time.time()) + 0.05)
    assert client.get(f"{API}/sessions/{handle.session_id}").json()["state"] == "expired"
    assert handle.view()["state"] == "cancelled"


# -- LIFE-5 -----------------------------------------------------------------------------------
def test_life_5_create_run_view(client):
    sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
    response = client.post(f"{API}/sessions/{sid}/runs", json={
        "base_model": MODEL, "lora": {"rank": 8, "alpha": 16, "seed": 3}, "optimizer": "adamw"})
    assert response.status_code == 201
    view = response.json()
    assert set(view) >= {"run_id", "session_id", "state", "next_seq", "step", "versions",
                         "created_at"}
    assert view["session_id"] == sid and view["state"] == "active"
    assert view["next_seq"] == 1 and view["step"] == 0 and view["versions"] == []
    parse_rfc3339_utc(view["created_at"])
    assert client.get(f"{API}/runs/{view['run_id']}").json() == view


@pytest.mark.parametrize("body,error_type", [
    ({"base_model": "gpt-17", "lora": {"rank": 4, "alpha": 8}, "optimizer": "adamw"},
     "unknown_base_model"),
    ({"base_model": MODEL, "lora": {"rank": 65, "alpha": 8}, "optimizer": "adamw"}, None),
    ({"base_model": MODEL, "lora": {"rank": 0, "alpha": 8}, "optimizer": "adamw"}, None),
    ({"base_model": MODEL, "lora": {"rank": 4, "alpha": 0}, "optimizer": "adamw"}, None),
    ({"base_model": MODEL, "lora": {"rank": 4, "alpha": 8}, "optimizer": "sgd"}, None),
    ({"base_model": MODEL, "lora": {"rank": 4, "alpha": 8}}, None),
    ({"base_model": MODEL, "lora": {"rank": 4.0, "alpha": 8}, "optimizer": "adamw"}, None),
    ({"base_model": MODEL, "lora": {"rank": 4, "alpha": 8, "dropout": 0.1},
      "optimizer": "adamw"}, "unknown_field"),
])
def test_life_5_bad_run_bodies_are_422(mock, client, body, error_type):
    sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
    expect_error(client.post(f"{API}/sessions/{sid}/runs", json=body), 422, error_type)
    assert mock.backend.runs == {}


def test_life_5_rank_up_to_max_lora_rank_is_accepted(client):
    caps = client.get(f"{API}/capabilities").json()
    max_rank = caps["base_models"][0]["max_lora_rank"]
    sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
    response = client.post(f"{API}/sessions/{sid}/runs", json={
        "base_model": MODEL, "lora": {"rank": max_rank, "alpha": 1.0}, "optimizer": "adamw"})
    assert response.status_code == 201


def test_life_5_quotas_sessions_and_runs(make_mock):
    client = make_mock(limits={"max_sessions": 2, "max_runs_per_session": 1}).client()
    sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
    client.post(f"{API}/sessions", json={})
    expect_error(client.post(f"{API}/sessions", json={}), 409, "quota_exceeded")
    run_body = {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4}, "optimizer": "adamw"}
    assert client.post(f"{API}/sessions/{sid}/runs", json=run_body).status_code == 201
    expect_error(client.post(f"{API}/sessions/{sid}/runs", json=run_body), 409,
                 "quota_exceeded")


# -- LIFE-6 -----------------------------------------------------------------------------------
def test_life_6_finish_after_completed_primitives(client, run):
    run.forward_backward([ce_datum(text_tokens("abc"))])
    run.optim_step()
    response = client.post(run.url("finish"), json={})
    assert response.status_code == 200
    view = response.json()
    assert view["state"] == "finished" and view["step"] == 1 and view["next_seq"] == 3
    assert run.operation(2).json()["status"] == "completed"


def test_life_6_finish_fails_requests_held_behind_a_gap(make_mock):
    mock = make_mock(order_wait_ms=10_000)
    handle = new_run(mock.client())
    results = {}
    worker = threading.Thread(target=lambda: results.update(
        r=handle.post("save_weights_for_sampler", {"version": 0}, seq=2)))
    worker.start()
    wait_held(mock.backend, handle.run_id, 2)
    assert handle.client.post(handle.url("finish"), json={}).json()["state"] == "finished"
    worker.join(timeout=10)
    expect_error(results["r"], 409, "run_not_active")
    view = handle.view()
    assert view["next_seq"] == 1 and view["versions"] == []


# -- LIFE-7 -----------------------------------------------------------------------------------
def test_life_7_cancel_then_poll_until_cancelled(mock, client, run):
    """Seed: "cancel the run, poll until terminal, then close the session"."""
    response = client.post(run.url("cancel"), json={})
    assert response.status_code == 202 and response.json()["state"] == "cancelling"
    assert wait_terminal(run)["state"] == "cancelled"
    assert client.post(f"{API}/sessions/{run.session_id}/close", json={}).json()["state"] \
        == "closed"


def test_life_7_cancel_fails_held_request_before_reading_cancelled(make_mock, fake_clock):
    mock = make_mock(order_wait_ms=10_000, clock=fake_clock)
    client = mock.client()
    handle = new_run(client)
    handle.forward_backward([ce_datum(text_tokens("abc"))])
    before = state_snapshot(mock.backend, handle.run_id)
    results = {}
    worker = threading.Thread(target=lambda: results.update(
        r=handle.post("optim_step", {"adamw": ADAMW}, seq=3)))
    worker.start()
    wait_held(mock.backend, handle.run_id, 3)

    cancel = client.post(handle.url("cancel"), json={})
    assert cancel.status_code == 202 and cancel.json()["state"] == "cancelling"
    worker.join(timeout=10)
    expect_error(results["r"], 409, "run_cancelled")
    # still cancelling (fake clock has not moved): a new primitive meets a run that is not
    # active (LIFE-8), finish is refused, cancel answers 202 again
    assert handle.view()["state"] == "cancelling"
    expect_error(handle.post("optim_step", {"adamw": ADAMW}, seq=2), 409, "run_not_active")
    expect_error(client.post(handle.url("finish"), json={}), 409, "run_not_active")
    again = client.post(handle.url("cancel"), json={})
    assert again.status_code == 202 and again.json()["state"] == "cancelling"

    fake_clock.advance(0.051)  # cancel_delay_ms = 50
    assert handle.view()["state"] == "cancelled"
    after = state_snapshot(mock.backend, handle.run_id)
    assert after["state"] == "cancelled"
    after["state"] = before["state"]
    assert_same_state(before, after)


# -- LIFE-8 -----------------------------------------------------------------------------------
def test_life_8_terminal_states_never_change(make_mock, fake_clock):
    client = make_mock(clock=fake_clock).client()
    finished, cancelled = new_run(client), new_run(client)
    client.post(finished.url("finish"), json={})
    client.post(cancelled.url("cancel"), json={})
    fake_clock.advance(1)
    for handle, state in ((finished, "finished"), (cancelled, "cancelled")):
        view = handle.view()
        assert view["state"] == state
        for action in ("finish", "cancel"):
            response = client.post(handle.url(action), json={})
            assert response.status_code == 200 and response.json() == view
        expect_error(handle.post("forward", {"loss_function": "cross_entropy", "loss_config": {},
                                             "data": [ce_datum(text_tokens("ab"))]}),
                     409, "run_not_active")
        assert handle.view() == view


def test_life_8_failed_run_is_terminal(make_mock):
    """A run the server failed (control plane fail_run) stays failed and can be closed."""
    mock = make_mock(control_plane=True)
    client = mock.client()
    handle = new_run(client)
    handle.forward_backward([ce_datum(text_tokens("abc"))])
    added = client.post("/_mock/faults", json={"kind": "fail_run", "run_id": handle.run_id})
    assert added.status_code == 201, added.text
    view = handle.view()
    assert view["state"] == "failed" and view["next_seq"] == 2
    for action in ("finish", "cancel"):
        response = client.post(handle.url(action), json={})
        assert response.status_code == 200 and response.json() == view
    expect_error(handle.post("optim_step", {"adamw": ADAMW}), 409, "run_not_active")
    assert handle.view() == view
    closed = client.post(f"{API}/sessions/{handle.session_id}/close", json={})
    assert closed.status_code == 200 and closed.json()["state"] == "closed"
