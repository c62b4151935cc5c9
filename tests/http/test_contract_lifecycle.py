"""Contract rules LIFE-1..8 over HTTP (in-process). TRANSPORT-1, SEC-1/2 and DISC-1/2 are in
test_contract_access.py.

Expected values come from the contract text (whitney-contract.md), not from the mock's code.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from conftest import (
    ADAMW,
    API,
    MODEL,
    RunHandle,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    state_snapshot,
    text_tokens,
    wait_held,
)

from mock_server import Features


def parse_rfc3339_utc(text: str) -> datetime:
    """LIFE-1: RFC 3339 UTC ('Z' or '+00:00')."""
    assert text.endswith("Z") or text.endswith("+00:00"), text
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.utcoffset() == UTC.utcoffset(None)
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


# -- LIFE-1 -----------------------------------------------------------------------------------
def test_life_1_create_and_get_session(client):
    response = client.post(f"{API}/sessions", json={"metadata": {"owner": "alice", "job": "x"}})
    assert response.status_code == 201
    view = response.json()
    # "runs": contract 1.1, LIFE-10 (optional: session_listing), which the mock declares
    assert set(view) == {"session_id", "state", "created_at", "expires_at", "metadata", "runs"}
    assert view["state"] == "open" and view["expires_at"] is None and view["runs"] == []
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
    ({"base_model": MODEL, "lora": {"rank": 4.5, "alpha": 8}, "optimizer": "adamw"},
     None),  # contract 1.1: 4.0 is the integer 4; a fraction stays 422
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
