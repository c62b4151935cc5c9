"""ORD-6 (contract 1.1, optional feature ``seq_error_details``): every primitive error says
where the run's sequence stands: ``details.next_seq`` (the seq to send next) and
``details.seq_consumed`` (whether this request's seq was recorded).

The reference is ORD-4 applied by hand: a counter of the seqs this test has had recorded, moved
only by answers the contract says are recorded (200 and the failures found at a primitive's
turn); refusals before the turn leave it alone. ``GET /runs/{rid}`` confirms it each time.
"""

from __future__ import annotations

import threading

import pytest
from conftest import ADAMW, API, KEY, ce_datum, expect_error, new_run, text_tokens, wait_held

from mock_server import Features

FB = {"loss_function": "cross_entropy", "loss_config": {},
      "data": [ce_datum(text_tokens("seq details"))]}


def check(run, response, status: int, etype: str, *, consumed: bool, next_seq: int) -> dict:
    error = expect_error(response, status, etype)
    assert error["details"]["next_seq"] == next_seq, error
    assert error["details"]["seq_consumed"] is consumed, error
    assert run.view()["next_seq"] == next_seq  # what the error said is what the run says
    return error


def test_refusals_before_the_turn_say_not_consumed(make_mock) -> None:
    mock = make_mock(limits={"max_body_bytes": 4096}, order_wait_ms=50)
    client = mock.client(KEY)
    run = new_run(client)
    run.ok("forward_backward", FB, seq=1)
    expected = 2  # what ORD-4 says next_seq is now
    cases = [
        (run.post("optim_step", {"adamw": {}}, seq=2), 422, "validation_error"),
        (client.post(run.url("optim_step"), content=b'{"seq": 2,'), 400, "malformed_json"),
        (client.post(run.url("optim_step"), content=b'{"seq": 2, "pad": "' + b"x" * 5000 +
                     b'"}'), 413, "body_too_large"),
        (run.post("optim_step", {"adamw": ADAMW, "grad_clip": 1.0}, seq=2), 422,
         "unknown_field"),
        (run.post("forward_backward", {**FB, "loss_function": "cross_entropy",
                                       "data": [ce_datum([256, 999])]}, seq=2), 422, None),
        (run.post("forward_backward", {**FB, "loss_config": {"beta": 1.0}}, seq=1), 409,
         "seq_conflict"),
        (run.post("optim_step", {"adamw": ADAMW}, seq=5), 409, "seq_gap"),
    ]
    for response, status, etype in cases:
        error = check(run, response, status, etype, consumed=False, next_seq=expected)
        if etype == "seq_gap":
            assert error["details"]["expected_seq"] == expected
    assert run.view()["next_seq"] == expected


@pytest.mark.parametrize("primitive,body,status,etype", [
    ("optim_step", {"adamw": ADAMW}, 409, "no_gradients"),
    ("sample", {"version": 9, "prompt": {"token_ids": [256]}, "num_samples": 1,
                "sampling": {"max_tokens": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0}},
     404, "version_not_found"),
    ("logprobs", {"version": 9, "token_ids": [256, 97]}, 404, "version_not_found"),
    ("load_state", {"checkpoint_id": "ckpt_nope", "with_optimizer": True}, 404,
     "checkpoint_not_found"),
    ("save_weights_for_sampler", {"version": 0}, 409, "version_conflict"),
])
def test_failures_at_the_turn_say_consumed(client, primitive, body, status, etype) -> None:
    run = new_run(client)
    run.ok("save_weights_for_sampler", {"version": 3}, seq=1)
    response = run.post(primitive, body, seq=2)
    error = check(run, response, status, etype, consumed=True, next_seq=3)
    # ORD-5: the record holds the same error; ORD-3: a replay answers the same bytes
    assert run.operation(2).json()["error"] == error
    replay = run.post(primitive, body, seq=2)
    assert replay.headers["whitney-replayed"] == "true" and replay.content == response.content
    run.ok("forward", FB, seq=3)  # the seq after it is indeed the next one
    # the recorded answer keeps the next_seq of its time, even after the run moved on
    assert run.post(primitive, body, seq=2).json()["error"]["details"]["next_seq"] == 3


def test_terminal_and_held_requests(make_mock) -> None:
    mock = make_mock(order_wait_ms=10_000, cancel_delay_ms=0)
    client = mock.client(KEY)
    run = new_run(client)
    run.ok("forward", FB, seq=1)
    out: dict = {}
    held = threading.Thread(target=lambda: out.update(r=run.post("optim_step", {"adamw": ADAMW},
                                                                 seq=3)))
    held.start()
    wait_held(mock.backend, run.run_id, 3)
    client.post(run.url("cancel"), json={})
    held.join(30)
    check(run, out["r"], 409, "run_cancelled", consumed=False, next_seq=2)
    check(run, run.post("forward", FB, seq=2), 409, "run_not_active", consumed=False,
          next_seq=2)


def test_unknown_or_foreign_runs_say_nothing_about_a_sequence(mock, client, other_client) \
        -> None:
    run = new_run(client)
    for who, url in ((client, f"{API}/runs/run_unknown/forward"),
                     (other_client, run.url("forward"))):
        error = expect_error(who.post(url, json={"seq": 1, **FB}), 404, "not_found")
        assert "next_seq" not in error["details"] and "seq_consumed" not in error["details"]


def test_without_the_feature_errors_carry_no_seq_state(make_mock) -> None:
    mock = make_mock(features=Features(seq_error_details=False))
    run = new_run(mock.client(KEY))
    for response in (run.post("optim_step", {"adamw": {}}, seq=1),
                     run.post("optim_step", {"adamw": ADAMW}, seq=1)):
        details = response.json()["error"]["details"]
        assert "next_seq" not in details and "seq_consumed" not in details
