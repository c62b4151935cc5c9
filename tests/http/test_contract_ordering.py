"""Contract rules ORD-1..5 over HTTP (in-process): one sequence per run, held requests,
gap timeouts, replays, seq accounting and the operation log.

The reference for "executed in order" is a twin run (same LoRA seed) driven strictly
sequentially: a pipelined run must end bit-for-bit where the sequential one does.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
from conftest import (
    ADAMW,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    params_of,
    state_snapshot,
    text_tokens,
    wait_held,
)

FB = {"loss_function": "cross_entropy", "loss_config": {},
      "data": [ce_datum(text_tokens("pipelined requests"))]}
FB2 = {"loss_function": "cross_entropy", "loss_config": {},
       "data": [ce_datum(text_tokens("second batch"))]}
OPT = {"adamw": ADAMW}


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(response=fn()))
    thread.start()
    return thread, out


def assert_same_params(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


# -- ORD-1 ------------------------------------------------------------------------------------
def test_ord_1_one_sequence_shared_by_all_primitives(run):
    assert run.view()["next_seq"] == 1
    run.ok("forward", FB)
    run.ok("forward_backward", FB)
    run.ok("save_weights_for_sampler", {"version": 0})
    run.ok("logprobs", {"version": 0, "token_ids": text_tokens("ab")})
    run.ok("optim_step", OPT)
    view = run.view()
    assert view["next_seq"] == 6 and view["step"] == 1
    primitives = [run.operation(s).json()["primitive"] for s in range(1, 6)]
    assert primitives == ["forward", "forward_backward", "save_weights_for_sampler", "logprobs",
                          "optim_step"]


# -- ORD-2 ------------------------------------------------------------------------------------
def test_ord_2_pipelined_out_of_order_from_two_threads(make_mock):
    """optim_step seq 2 is sent first from one thread, forward_backward seq 1 from another:
    both succeed and the effects are those of seq 1 then seq 2 (else 409 no_gradients)."""
    mock = make_mock(order_wait_ms=10_000)
    client = mock.client()
    pipelined, sequential = new_run(client, lora_seed=5), new_run(client, lora_seed=5)

    second, second_out = in_thread(lambda: pipelined.post("optim_step", OPT, seq=2))
    wait_held(mock.backend, pipelined.run_id, 2)
    assert pipelined.view()["next_seq"] == 1  # held, not executed
    first, first_out = in_thread(lambda: pipelined.post("forward_backward", FB, seq=1))
    first.join(10)
    second.join(10)
    assert first_out["response"].status_code == 200, first_out["response"].text
    assert second_out["response"].status_code == 200, second_out["response"].text

    ops = [pipelined.operation(s).json() for s in (1, 2)]
    assert [(o["seq"], o["primitive"], o["status"]) for o in ops] == [
        (1, "forward_backward", "completed"), (2, "optim_step", "completed")]
    assert pipelined.view()["step"] == 1 and pipelined.view()["next_seq"] == 3

    expected_fb = sequential.ok("forward_backward", FB)
    expected_opt = sequential.ok("optim_step", OPT)
    assert first_out["response"].json() == expected_fb
    assert second_out["response"].json() == expected_opt
    assert_same_params(params_of(mock.backend, pipelined.run_id),
                       params_of(mock.backend, sequential.run_id))


def test_ord_2_deep_pipeline_submitted_in_reverse_executes_in_seq_order(make_mock):
    mock = make_mock(order_wait_ms=10_000)
    client = mock.client()
    pipelined, sequential = new_run(client, lora_seed=9), new_run(client, lora_seed=9)
    plan = [("forward_backward", FB), ("optim_step", OPT),
            ("save_weights_for_sampler", {"version": 0}), ("forward_backward", FB2),
            ("optim_step", OPT), ("save_weights_for_sampler", {"version": 1})]
    threads = []
    for seq in range(len(plan), 1, -1):  # 6, 5, ..., 2: each held before the next is sent
        primitive, body = plan[seq - 1]
        threads.append(in_thread(lambda p=primitive, b=body, s=seq: pipelined.post(p, b, seq=s)))
        wait_held(mock.backend, pipelined.run_id, seq)
    pipelined.ok(plan[0][0], plan[0][1], seq=1)
    for thread, _ in threads:
        thread.join(10)
    assert all(out["response"].status_code == 200 for _, out in threads)

    expected = [sequential.ok(p, b) for p, b in plan]
    recorded = [pipelined.operation(s).json() for s in range(1, len(plan) + 1)]
    assert [o["primitive"] for o in recorded] == [p for p, _ in plan]
    assert [o["result"] for o in recorded] == expected
    # save at seq 3 saw step 1, save at seq 6 saw step 2: optim_steps ran before them
    assert [v["step"] for v in pipelined.view()["versions"]] == [1, 2]
    assert_same_params(params_of(mock.backend, pipelined.run_id),
                       params_of(mock.backend, sequential.run_id))


def test_ord_2_gap_timeout_is_409_seq_gap_and_records_nothing(mock, run):
    run.ok("forward_backward", FB)  # seq 1
    before = state_snapshot(mock.backend, run.run_id)
    response = run.post("optim_step", OPT, seq=3)
    error = expect_error(response, 409, "seq_gap")
    assert error["details"]["expected_seq"] == 2
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))
    assert mock.backend.runs[run.run_id].held == {}
    expect_error(run.operation(3), 404)
    assert run.view()["next_seq"] == 2
    # the gap never executes later: filling it leaves seq 3 free for another body
    run.ok("save_weights_for_sampler", {"version": 0}, seq=2)
    assert run.ok("logprobs", {"version": 0, "token_ids": [256, 97]}, seq=3)["version"] == 0
    assert run.view()["step"] == 0


def test_ord_2_gap_reports_progress_made_while_held(mock, run):
    """seq 3 held while seq 1 executes; seq 2 never comes: 409 with expected_seq 2."""
    held, out = in_thread(lambda: run.post("optim_step", OPT, seq=3))
    wait_held(mock.backend, run.run_id, 3)
    run.ok("forward_backward", FB, seq=1)
    held.join(10)
    error = expect_error(out["response"], 409, "seq_gap")
    assert error["details"]["expected_seq"] == 2
    assert run.view()["next_seq"] == 2 and run.view()["step"] == 0


# -- ORD-3 ------------------------------------------------------------------------------------
def test_ord_3_replayed_optim_step_does_not_step_twice(mock, run):
    run.ok("forward_backward", FB)
    original = run.post("optim_step", OPT, seq=2)
    assert original.status_code == 200
    assert original.headers.get("Whitney-Replayed") in (None, "false")
    before = state_snapshot(mock.backend, run.run_id)

    replay = run.post("optim_step", OPT, seq=2)
    assert replay.status_code == original.status_code
    assert replay.json() == original.json()
    assert replay.headers["Whitney-Replayed"] == "true"
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))
    assert run.view()["step"] == 1


def test_ord_3_replayed_forward_backward_does_not_accumulate_twice(mock, run):
    run.ok("forward_backward", FB)
    grads_once = {k: g.copy() for k, g in mock.backend.runs[run.run_id].grads.items()}
    replay = run.post("forward_backward", FB, seq=1)
    assert replay.headers["Whitney-Replayed"] == "true"
    grads_now = mock.backend.runs[run.run_id].grads
    assert_same_params(grads_once, grads_now)


def test_ord_3_json_equal_body_replays_regardless_of_key_order_and_whitespace(mock, run):
    run.ok("forward_backward", FB)
    original = run.ok("optim_step", OPT)
    adamw = dict(reversed(list(ADAMW.items())))
    raw = json.dumps({"adamw": adamw, "seq": 2}, indent=3).encode()
    replay = run.client.post(run.url("optim_step"), content=raw,
                             headers={"Content-Type": "application/json"})
    assert replay.status_code == 200 and replay.json() == original
    assert replay.headers["Whitney-Replayed"] == "true"
    assert run.view()["step"] == 1


def test_ord_3_numbers_compare_by_value_contract_1_1(mock, run):
    """Contract 1.1: a retry re-serialised by another library (0 as 0.0, 1e-3 as 0.001, keys in
    another order) is the same JSON value: replayed, no second effect. A different value is
    still 409 seq_conflict."""
    run.ok("forward_backward", FB)
    as_int = {**ADAMW, "weight_decay": 0, "learning_rate": 1e-3}
    raw = json.dumps({"seq": 2, "adamw": as_int}).encode()
    assert b'"weight_decay": 0,' in raw or b'"weight_decay": 0}' in raw
    first = run.client.post(run.url("optim_step"), content=raw)
    assert first.status_code == 200
    before = state_snapshot(mock.backend, run.run_id)
    as_float = json.dumps({"adamw": dict(reversed({**as_int, "weight_decay": 0.0}.items())),
                           "seq": 2.0}).replace("0.001", "1.0e-3").encode()
    assert b"1.0e-3" in as_float and b'"weight_decay": 0.0' in as_float
    replay = run.client.post(run.url("optim_step"), content=as_float)
    assert replay.status_code == 200 and replay.headers.get("whitney-replayed") == "true"
    assert replay.content == first.content
    other = json.dumps({"seq": 2, "adamw": {**as_int, "weight_decay": 1e-12}}).encode()
    expect_error(run.client.post(run.url("optim_step"), content=other), 409, "seq_conflict")
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


def test_ord_3_same_seq_different_body_or_primitive_is_seq_conflict(mock, run):
    run.ok("forward_backward", FB)
    run.ok("optim_step", OPT)
    before = state_snapshot(mock.backend, run.run_id)
    different = run.post("optim_step", {"adamw": {**ADAMW, "learning_rate": 0.5}}, seq=2)
    expect_error(different, 409, "seq_conflict")
    other_primitive = run.post("forward_backward", FB, seq=2)
    expect_error(other_primitive, 409, "seq_conflict")
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))
    assert run.operation(2).json()["result"]["step"] == 1


def test_ord_3_failed_operation_replays_its_error(mock, run):
    original = run.post("optim_step", OPT)  # seq 1: nothing accumulated
    expect_error(original, 409, "no_gradients")
    replay = run.post("optim_step", OPT, seq=1)
    assert replay.status_code == 409 and replay.json() == original.json()
    assert replay.headers["Whitney-Replayed"] == "true"
    assert run.view()["next_seq"] == 2


def test_ord_3_replay_answered_on_terminal_run(client, run):
    run.ok("forward_backward", FB)
    original = run.ok("optim_step", OPT)
    assert client.post(run.url("finish"), json={}).json()["state"] == "finished"
    replay = run.post("optim_step", OPT, seq=2)
    assert replay.status_code == 200 and replay.json() == original
    assert replay.headers["Whitney-Replayed"] == "true"
    expect_error(run.post("optim_step", OPT, seq=3), 409, "run_not_active")


def test_ord_3_duplicate_of_a_held_request_gets_the_same_answer_once(make_mock):
    """Architecture decision: a retry of a seq still held waits for the same outcome."""
    mock = make_mock(order_wait_ms=10_000)
    handle = new_run(mock.client())
    handle.ok("forward_backward", FB, seq=1)
    first, first_out = in_thread(lambda: handle.post("optim_step", OPT, seq=3))
    wait_held(mock.backend, handle.run_id, 3)
    retry, retry_out = in_thread(lambda: handle.post("optim_step", OPT, seq=3))
    conflict = handle.post("optim_step", {"adamw": {**ADAMW, "learning_rate": 0.3}}, seq=3)
    expect_error(conflict, 409, "seq_conflict")
    handle.ok("save_weights_for_sampler", {"version": 0}, seq=2)
    first.join(10)
    retry.join(10)
    a, b = first_out["response"], retry_out["response"]
    assert a.status_code == b.status_code == 200
    assert a.json() == b.json() and a.json()["step"] == 1
    assert a.headers.get("Whitney-Replayed") is None
    assert b.headers["Whitney-Replayed"] == "true"
    assert handle.view()["step"] == 1 and handle.view()["next_seq"] == 4


# -- ORD-4 ------------------------------------------------------------------------------------
def test_ord_4_failures_at_turn_consume_seq_and_change_nothing(make_mock):
    mock = make_mock(limits={"max_versions_per_run": 1})
    handle = new_run(mock.client())
    handle.ok("forward_backward", FB)                                    # 1
    handle.ok("save_weights_for_sampler", {"version": 3})                # 2
    before = state_snapshot(mock.backend, handle.run_id)
    failures = [
        ("save_weights_for_sampler", {"version": 3}, 409, "version_conflict"),       # 3
        ("save_weights_for_sampler", {"version": 2}, 409, "version_conflict"),       # 4
        ("save_weights_for_sampler", {"version": 4}, 409, "quota_exceeded"),         # 5
        ("sample", {"version": 9, "prompt": {"token_ids": [256]}, "num_samples": 1,
                    "sampling": {"max_tokens": 2, "temperature": 1.0, "top_k": 0,
                                 "top_p": 1.0}}, 404, "version_not_found"),          # 6
        ("logprobs", {"version": 0, "token_ids": [256, 97]}, 404, "version_not_found"),  # 7
        ("load_state", {"checkpoint_id": "ckpt_nope", "with_optimizer": False},
         404, "checkpoint_not_found"),                                               # 8
    ]
    for offset, (primitive, body, status, error_type) in enumerate(failures):
        seq = 3 + offset
        error = expect_error(handle.post(primitive, body, seq=seq), status, error_type)
        op = handle.operation(seq).json()
        assert op == {"seq": seq, "primitive": primitive, "status": "failed", "error": error}
    after = state_snapshot(mock.backend, handle.run_id)
    assert after["next_seq"] == before["next_seq"] + len(failures)
    after["next_seq"], after["ops"] = before["next_seq"], before["ops"]
    assert_same_state(before, after)
    # no_gradients, once the buffer has been emptied by a step
    handle.ok("optim_step", OPT, seq=9)
    expect_error(handle.post("optim_step", OPT, seq=10), 409, "no_gradients")
    assert handle.view()["next_seq"] == 11 and handle.view()["step"] == 1


def test_ord_4_requests_refused_before_their_turn_do_not_consume_seq(make_mock):
    mock = make_mock(limits={"max_body_bytes": 4096})
    client = mock.client()
    handle = new_run(client)
    handle.ok("forward_backward", FB)  # seq 1
    before = state_snapshot(mock.backend, handle.run_id)
    url = handle.url("optim_step")
    refused = [
        (client.post(url, content=b'{"seq": 2, "adamw": '), 400, "malformed_json"),
        (mock.client(key="bad").post(url, json={"seq": 2, **OPT}), 401, None),
        (client.post(url, json={"seq": 2, "adamw": {**ADAMW, "learning_rate": -1}}), 422, None),
        (client.post(url, json={"seq": 2, "adamw": ADAMW, "pad": "x" * 5000}), 413,
         "body_too_large"),
        (client.post(url, json={"seq": 3, **OPT}), 409, "seq_gap"),  # order_wait_ms 300
    ]
    for response, status, error_type in refused:
        expect_error(response, status, error_type)
    expect_error(handle.operation(2), 404)
    assert_same_state(before, state_snapshot(mock.backend, handle.run_id))
    assert handle.ok("optim_step", OPT, seq=2)["step"] == 1


def test_ord_4_requests_refused_on_a_cancelled_run_do_not_consume_seq(make_mock, fake_clock):
    """A request held when the run is cancelled fails 409 run_cancelled; a new one on a
    cancelling or cancelled run 409 run_not_active; none is recorded."""
    mock = make_mock(clock=fake_clock, order_wait_ms=10_000)
    handle = new_run(mock.client())
    handle.ok("forward_backward", FB)
    held, out = in_thread(lambda: handle.post("optim_step", OPT, seq=3))
    wait_held(mock.backend, handle.run_id, 3)
    handle.client.post(handle.url("cancel"), json={})
    held.join(10)
    expect_error(out["response"], 409, "run_cancelled")
    expect_error(handle.post("optim_step", OPT, seq=2), 409, "run_not_active")
    fake_clock.advance(1)
    assert handle.view()["state"] == "cancelled"
    expect_error(handle.post("optim_step", OPT, seq=2), 409, "run_not_active")
    assert handle.view()["next_seq"] == 2
    for seq in (2, 3):
        expect_error(handle.operation(seq), 404)


# -- ORD-5 ------------------------------------------------------------------------------------
def test_ord_5_operation_records(run):
    fb = run.ok("forward_backward", FB)
    run.ok("save_weights_for_sampler", {"version": 0})
    conflict = run.post("save_weights_for_sampler", {"version": 0}, seq=3)
    error = expect_error(conflict, 409, "version_conflict")

    assert run.operation(1).json() == {"seq": 1, "primitive": "forward_backward",
                                       "status": "completed", "result": fb}
    assert run.operation(2).json()["result"] == {"version": 0, "step": 0}
    assert run.operation(3).json() == {"seq": 3, "primitive": "save_weights_for_sampler",
                                       "status": "failed", "error": error}
    for unrecorded in (0, 4, 2**63 - 1):
        expect_error(run.operation(unrecorded), 404)
    expect_error(run.client.get(run.url("operations/-1")), 404)
    expect_error(run.client.get(run.url("operations/abc")), 404)


def test_ord_5_operation_seq_beyond_int64_is_404(run):
    expect_error(run.operation(10**30), 404)
