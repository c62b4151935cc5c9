"""The mock's control plane (contract §5): trace, every fault kind, reset, validation.

References are independent of the code under test: the list of requests each test sent (which
of them ORD-4 says are recorded), the ORD-5 operation records, a second fresh mock built with
the same seed, and ``random.Random(seed)`` draws for seeded faults.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import httpx
import pytest
from conftest import (
    ADAMW,
    API,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    state_snapshot,
    text_tokens,
    wait_held,
)

from mock_server import InProcessTransport, create_app
from mock_server.testing import MockControlError, MockWhitney

FB = {"loss_function": "cross_entropy", "loss_config": {},
      "data": [ce_datum(text_tokens("control plane"))]}
OPT = {"adamw": ADAMW}


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["response"] = fn()
        except Exception as exc:  # handed to the test thread
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


# -- off by default, auth ---------------------------------------------------------------------
def test_control_plane_is_off_unless_enabled() -> None:
    app = create_app()
    with httpx.Client(transport=InProcessTransport(app), base_url="http://mock",
                      headers={"Authorization": "Bearer whitney-mock-key"}) as client:
        expect_error(client.get("/_mock/trace"), 404)
        expect_error(client.post("/_mock/faults", json={"kind": "drop", "primitive": "sample"}),
                     404)
        expect_error(client.post("/_mock/reset", json={}), 404)


@pytest.mark.parametrize("method,path", [("GET", "/_mock/trace"), ("GET", "/_mock/faults"),
                                         ("POST", "/_mock/faults"), ("DELETE", "/_mock/faults"),
                                         ("POST", "/_mock/reset")])
def test_sec_1_control_plane_needs_a_known_key(whitney_mock, method, path) -> None:
    run = new_run(whitney_mock.client)
    for headers in ({}, {"Authorization": "Bearer not-a-key"}):
        with httpx.Client(transport=whitney_mock.transport, base_url=whitney_mock.base_url,
                          headers=headers) as anonymous:
            expect_error(anonymous.request(method, path, json={}), 401)
    assert run.run_id in whitney_mock.backend.runs  # not reset


# -- trace ------------------------------------------------------------------------------------
def test_ord_4_trace_lists_recorded_operations_in_seq_order(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    other = new_run(whitney_mock.client)
    expected = []
    run.ok("save_weights_for_sampler", {"version": 0})
    expected.append((1, "save_weights_for_sampler", "completed"))
    expect_error(run.post("optim_step", OPT), 409, "no_gradients")  # at its turn: recorded
    expected.append((2, "optim_step", "failed"))
    expect_error(run.post("optim_step", {"adamw": {}}, seq=3), 422)  # before its turn: not
    run.ok("forward_backward", FB)
    expected.append((3, "forward_backward", "completed"))
    run.ok("optim_step", OPT)
    expected.append((4, "optim_step", "completed"))
    assert run.post("forward_backward", FB, seq=3).headers["whitney-replayed"] == "true"
    other.ok("save_weights_for_sampler", {"version": 5})

    trace = whitney_mock.trace(run.run_id)  # the run's list
    assert [(e["seq"], e["primitive"], e["status"]) for e in trace] == expected
    for seq, primitive, status in expected:  # agrees with the ORD-5 records
        record = run.operation(seq).json()
        assert (record["primitive"], record["status"]) == (primitive, status)
    assert whitney_mock.primitives(other.run_id) == ["save_weights_for_sampler"]
    assert set(whitney_mock.trace()) == {run.run_id, other.run_id}
    with pytest.raises(MockControlError) as excinfo:
        whitney_mock.trace("run_unknown")
    assert excinfo.value.status == 404


# -- error ------------------------------------------------------------------------------------
def test_error_fault_answers_before_execution_and_consumes_no_seq(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    run.ok("forward_backward", FB)
    fault = whitney_mock.inject_fault("error", "optim_step", status=503)
    before = state_snapshot(whitney_mock.backend, run.run_id)
    response = run.post("optim_step", OPT, headers={"X-Request-Id": "req-123"})
    error = expect_error(response, 503, "service_unavailable")
    assert error["details"]["fault_id"] == fault["fault_id"]
    assert response.headers["x-request-id"] == "req-123"  # TRANSPORT-1
    assert_same_state(before, state_snapshot(whitney_mock.backend, run.run_id))  # ERR-3
    retry = run.post("optim_step", OPT, seq=2)
    assert retry.status_code == 200 and "whitney-replayed" not in retry.headers
    assert whitney_mock.primitives(run.run_id) == ["forward_backward", "optim_step"]
    assert whitney_mock.faults()[0] == {**fault, "seen": 1, "fired": 1, "remaining": 0,
                                             "active": False}


def test_error_fault_after_execute_is_recovered_by_replay(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    run.ok("forward_backward", FB)
    whitney_mock.inject_fault("error", "optim_step", status=500, after_execute=True)
    expect_error(run.post("optim_step", OPT), 500, "internal_error")
    assert run.view()["next_seq"] == 3 and run.view()["step"] == 1  # executed, recorded
    retry = run.post("optim_step", OPT, seq=2)
    assert retry.headers["whitney-replayed"] == "true"  # ORD-3
    assert retry.json() == run.operation(2).json()["result"]


def test_error_fault_carries_the_envelope_it_is_given(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("error", "forward_backward", status=409, error={
        "type": "seq_gap", "message": "simulated gap", "details": {"expected_seq": 9}})
    response = run.post("forward_backward", FB)
    assert response.json() == {"error": {"type": "seq_gap", "message": "simulated gap",
                                         "details": {"expected_seq": 9}}}
    assert response.status_code == 409


def test_skip_count_and_run_filter_select_the_calls(whitney_mock) -> None:
    run, other = new_run(whitney_mock.client), new_run(whitney_mock.client)
    whitney_mock.inject_fault("error", "get_run", run_id=run.run_id, skip=1, count=2)
    statuses = [whitney_mock.client.get(run.url()).status_code for _ in range(4)]
    assert statuses == [200, 503, 503, 200]
    assert [whitney_mock.client.get(other.url()).status_code for _ in range(3)] == [200] * 3


@pytest.mark.parametrize("seed", [None, 42])
def test_probability_draws_replay_from_the_seed(seed) -> None:
    mock_seed, p, calls = 9, 0.4, 40
    patterns = []
    for _ in range(2):  # two fresh mocks: identical outcomes
        with MockWhitney.in_process(seed=mock_seed) as whitney:
            whitney.inject_fault("error", "capabilities", count=None, probability=p, seed=seed)
            patterns.append([whitney.client.get(f"{API}/capabilities").status_code == 503
                             for _ in range(calls)])
            assert whitney.faults()[0]["fired"] == sum(patterns[-1])
    rng = random.Random(mock_seed if seed is None else seed)
    assert patterns[0] == patterns[1] == [rng.random() < p for _ in range(calls)]


# -- throttle ---------------------------------------------------------------------------------
def test_err_2_throttle_is_429_with_retry_after_and_not_recorded(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("throttle", "forward_backward", count=2, retry_after=7)
    for _ in range(2):
        response = run.post("forward_backward", FB, seq=1)
        expect_error(response, 429, "rate_limited")
        assert response.headers["retry-after"] == "7"
    assert run.view()["next_seq"] == 1
    assert run.post("forward_backward", FB, seq=1).status_code == 200


# -- latency ----------------------------------------------------------------------------------
def test_latency_faults_add_up_and_delay_without_changing_the_answer(whitney_mock) -> None:
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    whitney_mock.app.state.mock_faults.sleep = record
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("latency", "forward_backward", delay_ms=100)
    whitney_mock.inject_fault("latency", "forward_backward", delay_ms=150, count=None)
    run.ok("forward_backward", FB)
    run.ok("forward_backward", FB)
    run.ok("optim_step", OPT)
    assert slept == [0.25, 0.15]


def test_ord_2_a_delayed_seq_holds_the_next_one(whitney_mock) -> None:
    """forward_backward seq 1 is delayed; optim_step seq 2 arrives first and is held until seq 1
    executed, so it finds gradients (else 409 no_gradients)."""
    release = threading.Event()

    async def gate(seconds: float) -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)

    whitney_mock.app.state.mock_faults.sleep = gate
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("latency", "forward_backward", delay_ms=1000)
    first, out1 = in_thread(lambda: run.post("forward_backward", FB, seq=1))
    second, out2 = in_thread(lambda: run.post("optim_step", OPT, seq=2))
    wait_held(whitney_mock.backend, run.run_id, 2)
    release.set()
    first.join(30)
    second.join(30)
    assert out1["response"].status_code == 200 and out2["response"].status_code == 200
    assert whitney_mock.primitives(run.run_id) == ["forward_backward", "optim_step"]


# -- drop -------------------------------------------------------------------------------------
def test_drop_after_execute_loses_the_response_and_replays_it(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("drop", "save_weights_for_sampler")
    with pytest.raises(httpx.RemoteProtocolError):
        run.post("save_weights_for_sampler", {"version": 3})
    assert run.view()["next_seq"] == 2  # it executed
    retry = run.post("save_weights_for_sampler", {"version": 3}, seq=1)
    assert retry.headers["whitney-replayed"] == "true"
    assert retry.json() == run.operation(1).json()["result"] == {"version": 3, "step": 0}


def test_drop_before_execute_records_nothing(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("drop", "save_weights_for_sampler", after_execute=False)
    with pytest.raises(httpx.RemoteProtocolError):
        run.post("save_weights_for_sampler", {"version": 3})
    assert run.view()["next_seq"] == 1
    retry = run.post("save_weights_for_sampler", {"version": 3}, seq=1)
    assert retry.status_code == 200 and "whitney-replayed" not in retry.headers


def test_drop_over_uvicorn_closes_the_connection(whitney_server) -> None:
    import logging

    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        run = new_run(whitney_server.client)
        whitney_server.inject_fault("drop", "save_weights_for_sampler")
        with pytest.raises(httpx.RemoteProtocolError):
            run.post("save_weights_for_sampler", {"version": 1})
        retry = run.post("save_weights_for_sampler", {"version": 1}, seq=1)
        assert retry.headers["whitney-replayed"] == "true"
        assert whitney_server.primitives(run.run_id) == ["save_weights_for_sampler"]
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    drops = [r for r in seen if "injected fault" in r.getMessage()]
    assert len(drops) == 1 and drops[0].levelname == "WARNING" and drops[0].exc_info is None


def test_drop_on_create_session_leaves_the_session_behind(whitney_mock) -> None:
    whitney_mock.inject_fault("drop", "create_session")
    with pytest.raises(httpx.RemoteProtocolError):
        whitney_mock.client.post(f"{API}/sessions", json={})
    assert len(whitney_mock.backend.sessions) == 1  # why clients must not blindly re-send it


# -- fail_run ---------------------------------------------------------------------------------
def test_life_8_fail_run_now(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    run.ok("forward_backward", FB)
    fault = whitney_mock.fail_run(run.run_id, reason="disk on fire")
    assert (fault["fired"], fault["active"]) == (1, False)
    assert run.view()["state"] == "failed"
    expect_error(run.post("optim_step", OPT), 409, "run_not_active")
    assert whitney_mock.client.post(run.url("cancel"), json={}).json()["state"] == "failed"
    assert whitney_mock.primitives(run.run_id) == ["forward_backward"]


def test_fail_run_when_the_next_matching_call_arrives(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("fail_run", "optim_step", run_id=run.run_id)
    run.ok("forward_backward", FB)
    assert run.view()["state"] == "active"
    expect_error(run.post("optim_step", OPT), 409, "run_not_active")
    assert run.view()["state"] == "failed"
    assert whitney_mock.primitives(run.run_id) == ["forward_backward"]


def test_fail_run_fails_requests_held_for_ordering(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    thread, out = in_thread(lambda: run.post("optim_step", OPT, seq=2))
    wait_held(whitney_mock.backend, run.run_id, 2)
    whitney_mock.fail_run(run.run_id)
    thread.join(30)
    expect_error(out["response"], 409, "run_not_active")


# -- validation, clear, reset -----------------------------------------------------------------
@pytest.mark.parametrize("body,status", [
    ({"kind": "error"}, 422),  # no primitive
    ({"kind": "boom", "primitive": "sample"}, 422),
    ({"kind": "error", "primitive": "not_a_primitive"}, 422),
    ({"kind": "error", "primitive": "sample", "status": 200}, 422),
    ({"kind": "error", "primitive": "sample", "status": 429}, 422),
    ({"kind": "error", "primitive": "sample", "count": 0}, 422),
    ({"kind": "error", "primitive": "sample", "probability": 0}, 422),
    ({"kind": "error", "primitive": "sample", "probability": 1.5}, 422),
    ({"kind": "error", "primitive": "sample", "delay_ms": 5}, 422),  # ERR-4
    ({"kind": "latency", "primitive": "sample"}, 422),  # delay_ms required
    ({"kind": "throttle", "primitive": "sample", "retry_after": "1"}, 422),  # strict types
    ({"kind": "drop", "primitive": "sample", "seed": -1}, 422),
    ({"kind": "fail_run"}, 422),
    ({"kind": "fail_run", "run_id": "run_unknown"}, 404),
    ([], 422),
    (b"{not json", 400),
])
def test_err_1_bad_fault_bodies_are_refused_without_effect(whitney_mock, body, status) -> None:
    run = new_run(whitney_mock.client)
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    expect_error(whitney_mock.client.post("/_mock/faults", **kwargs), status)
    assert whitney_mock.faults() == []
    assert run.view()["state"] == "active"


def test_clear_faults_keeps_state(whitney_mock) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("error", "forward_backward", count=None)
    whitney_mock.inject_fault("throttle", "optim_step")
    assert whitney_mock.clear_faults() == 2
    assert whitney_mock.faults() == []
    run.ok("forward_backward", FB)
    assert run.view()["next_seq"] == 2


def _ids(client: httpx.Client) -> tuple[str, str]:
    run = new_run(client)
    return run.session_id, run.run_id


def test_reset_forgets_everything_and_reseeds_ids(whitney_mock) -> None:
    first = _ids(whitney_mock.client)
    whitney_mock.inject_fault("error", "create_session", skip=5)
    held_run = new_run(whitney_mock.client)
    thread, out = in_thread(lambda: held_run.post("optim_step", OPT, seq=2))
    wait_held(whitney_mock.backend, held_run.run_id, 2)
    whitney_mock.reset()
    thread.join(30)
    expect_error(out["response"], 409, "run_cancelled")
    assert whitney_mock.trace() == {} and whitney_mock.faults() == []
    assert whitney_mock.backend.sessions == {}
    assert _ids(whitney_mock.client) == first  # same seed, same ids as a fresh mock
    with MockWhitney.in_process(seed=0) as fresh:
        assert _ids(fresh.client) == first


def test_reset_overrides_configuration_until_the_next_reset(whitney_mock) -> None:
    caps = f"{API}/capabilities"
    result = whitney_mock.reset(seed=4, limits={"max_num_samples": 3}, api_keys=["k-a", "k-b"],
                                cancel_delay_ms=0)
    assert result["seed"] == 4 and result["api_key_count"] == 2
    assert result["limits"]["max_num_samples"] == 3
    assert whitney_mock.client.get(caps).json()["limits"]["max_num_samples"] == 3
    assert whitney_mock.api_key == "k-a"
    stale = whitney_mock.client.get(caps, headers={"Authorization": "Bearer whitney-mock-key"})
    expect_error(stale, 401)
    with MockWhitney.in_process(seed=4) as fresh:
        assert _ids(whitney_mock.client) == _ids(fresh.client)
    whitney_mock.reset()
    assert whitney_mock.api_key == "whitney-mock-key"
    assert whitney_mock.client.get(caps).json()["limits"]["max_num_samples"] == 64


@pytest.mark.parametrize("body", [{"limits": {"max_bogus": 1}}, {"limits": {"max_sessions": "2"}},
                                  {"api_keys": []}, {"seed": -1}, {"colour": "red"}])
def test_bad_reset_bodies_change_nothing(whitney_mock, body) -> None:
    run = new_run(whitney_mock.client)
    expect_error(whitney_mock.client.post("/_mock/reset", json=body,
                                          headers=whitney_mock.control_headers), 422)
    assert run.view()["state"] == "active"


def test_borrowed_transport_survives_clients_closing_it(whitney_mock) -> None:
    with httpx.Client(transport=whitney_mock.transport, base_url=whitney_mock.base_url,
                      headers=whitney_mock.headers) as own:
        assert own.get(f"{API}/capabilities").status_code == 200
    assert whitney_mock.client.get(f"{API}/capabilities").status_code == 200
