"""``grpo.client``: seq assignment, replay-safe retries, typed errors, pipelining, exports.

Faults are injected client-side (``Tap``); the server's side of each story is read back over
the contract (ORD-5 operations, run views) rather than taken from the client.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import wait

import httpx
import pytest
from conftest import BOS, KEY, MODEL, OTHER_KEY
from test_grpo_support import Fault, tapped_client

from grpo.client import AdamW, WhitneyClient
from grpo.errors import (
    AuthenticationError,
    ConflictError,
    ConnectionFailed,
    IntegrityError,
    NotFoundError,
    ProtocolError,
    RateLimitError,
    ServerError,
    ValidationError,
)
from grpo.helpers import forward_backward_payload, rl_datum

ADAMW = AdamW(learning_rate=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
              grad_clip_norm=1.0)
PROMPT = [BOS, *b"cat"]


def sample_request(version: int, seed: int = 5) -> dict:
    return {"version": version, "prompt": {"token_ids": PROMPT}, "num_samples": 4,
            "sampling": {"max_tokens": 6, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                         "seed": seed}}


def new_run(client: WhitneyClient):
    session = client.create_session()
    return client.create_run(session["session_id"], base_model=MODEL, rank=4, alpha=8.0, seed=1)


def rl_payload(sample: dict) -> dict:
    advantages = [1.0, -1.0, 0.5, -0.5]
    data = [rl_datum(PROMPT, s["tokens"], s["logprobs"], a)
            for s, a in zip(sample["sequences"], advantages, strict=False)]
    return forward_backward_payload(data, "importance_sampling")


def test_seq_is_assigned_one_by_one_from_next_seq(mock):
    """ORD-1: the client numbers a run's primitives 1, 2, 3 ..., whatever the primitive."""
    client, tap = tapped_client(mock)
    run = new_run(client)
    run.save_weights_for_sampler(0)
    sample = run.sample(sample_request(0))
    run.forward_backward(rl_payload(sample))
    step = run.optim_step(ADAMW)
    sent = [c.body["seq"] for c in tap.calls
            if c.method == "POST" and c.path.startswith(run.path + "/")]
    assert sent == [1, 2, 3, 4]
    assert [run.operation(seq)["primitive"] for seq in sent] == [
        "save_weights_for_sampler", "sample", "forward_backward", "optim_step"]
    assert step["step"] == 1 and run.get()["next_seq"] == 5


def test_optim_step_sends_exactly_the_six_adamw_fields(mock):
    """OPT-1: no field left to a server default, none added."""
    client, tap = tapped_client(mock)
    run = new_run(client)
    run.save_weights_for_sampler(0)
    run.forward_backward(rl_payload(run.sample(sample_request(0))))
    run.optim_step(ADAMW)
    body = tap.calls[-1].body
    assert body == {"seq": 4, "adamw": {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999,
                                        "eps": 1e-8, "weight_decay": 0.0, "grad_clip_norm": 1.0}}
    with pytest.raises(TypeError):
        AdamW(learning_rate=0.01)  # type: ignore[call-arg]


def test_throttled_request_waits_retry_after_and_resends_the_same_bytes(mock):
    """ERR-2 429 + Retry-After: honoured, then the identical request (same seq) again."""
    sleeps: list[float] = []
    client, tap = tapped_client(mock, sleeps=sleeps)
    run = new_run(client)
    tap.faults.append(Fault("save_weights_for_sampler", kind="throttle", retry_after="2",
                            times=2))
    assert run.save_weights_for_sampler(0) == {"version": 0, "step": 0}
    attempts = [c for c in tap.calls if c.label == "save_weights_for_sampler"]
    assert len(attempts) == 3 and len({c.raw for c in attempts}) == 1
    assert sleeps == [2.0, 2.0]
    assert run.operation(1)["primitive"] == "save_weights_for_sampler"


def test_server_errors_are_retried_then_raised_typed(mock):
    client, tap = tapped_client(mock, max_attempts=3)
    run = new_run(client)
    tap.faults.append(Fault("save_weights_for_sampler", status=503, times=2))
    assert run.save_weights_for_sampler(0)["version"] == 0  # third attempt gets through
    tap.faults.append(Fault("save_weights_for_sampler", status=500, times=3))
    with pytest.raises(ServerError) as caught:
        run.save_weights_for_sampler(1)
    assert caught.value.status == 500 and caught.value.type == "injected_fault"
    # the seq of the failed request was never recorded: the next primitive reuses it (ORD-4)
    assert run.save_weights_for_sampler(1)["version"] == 1
    assert run.operation(2)["primitive"] == "save_weights_for_sampler"
    assert run.get()["next_seq"] == 3


def test_lost_response_is_replayed_not_executed_twice(mock):
    """ORD-3: optim_step executed, its response dropped; the retry with the same seq and body
    gets the recorded response and the run takes one step, not two."""
    client, tap = tapped_client(mock)
    run = new_run(client)
    run.save_weights_for_sampler(0)
    run.forward_backward(rl_payload(run.sample(sample_request(0))))
    tap.faults.append(Fault("optim_step", kind="drop_after"))
    result = run.optim_step(ADAMW)
    attempts = [c for c in tap.calls if c.label == "optim_step"]
    assert len(attempts) == 2 and attempts[0].raw == attempts[1].raw
    assert attempts[0].status == 200  # the first one did execute
    assert result["step"] == 1
    view = run.get()
    assert view["step"] == 1 and view["next_seq"] == 5
    assert run.operation(4)["result"] == result


def test_dropped_connection_before_sending_is_retried_even_for_create_session(mock):
    client, tap = tapped_client(mock)
    tap.faults.append(Fault("create_session", kind="drop_before"))
    assert client.create_session()["state"] == "open"
    assert tap.labels() == ["create_session", "create_session"]


def test_requests_without_replay_protection_are_not_retried_after_they_may_have_run(mock):
    """``POST /sessions`` has no seq: after a lost response or a 5xx it may have taken
    effect, so the client reports instead of creating a second session."""
    client, tap = tapped_client(mock)
    tap.faults.append(Fault("create_session", kind="drop_after"))
    with pytest.raises(ConnectionFailed):
        client.create_session()
    tap.faults.append(Fault("create_session", status=502))
    with pytest.raises(ServerError):
        client.create_session()
    assert tap.labels() == ["create_session", "create_session"]


def test_connection_failures_after_all_attempts_raise_connection_failed(mock):
    client, tap = tapped_client(mock, max_attempts=3)
    run = new_run(client)
    tap.faults.append(Fault("save_weights_for_sampler", kind="drop_after", times=3))
    with pytest.raises(ConnectionFailed):
        run.save_weights_for_sampler(0)
    # the first attempt executed; every retry was a replay: still exactly one version
    assert [v["version"] for v in run.get()["versions"]] == [0]


def test_rate_limit_that_never_lifts_raises_rate_limit_error(mock):
    client, tap = tapped_client(mock, max_attempts=2)
    tap.faults.append(Fault("capabilities", kind="throttle", times=5))
    with pytest.raises(RateLimitError) as caught:
        client.capabilities()
    assert caught.value.status == 429


def test_errors_carry_the_envelope_type(mock):
    """ERR-1: the server's ``error.type`` is on the exception, whatever the status."""
    client, _ = tapped_client(mock)
    run = new_run(client)
    with pytest.raises(ConflictError) as conflict:
        run.optim_step(ADAMW)  # OPT-4: nothing accumulated
    assert conflict.value.type == "no_gradients" and conflict.value.status == 409
    with pytest.raises(ValidationError) as invalid:
        bad = sample_request(0)
        bad["sampling"]["temperature"] = 0.0
        run.sample(bad)
    assert invalid.value.status == 422 and invalid.value.type
    with pytest.raises(NotFoundError) as missing:
        client.get_run("run_does_not_exist")
    assert missing.value.status == 404
    other, _ = tapped_client(mock, key=OTHER_KEY)
    with pytest.raises(NotFoundError) as foreign:  # SEC-2: same as nonexistent
        other.get_run(run.run_id)
    assert foreign.value.type == missing.value.type
    stranger, _ = tapped_client(mock, key="no-such-key")
    with pytest.raises(AuthenticationError):
        stranger.capabilities()


def test_seq_is_resynchronised_after_refused_and_after_recorded_failures(mock):
    """ORD-4: a 422 before its turn consumes no seq, a 409 ``no_gradients`` at its turn does;
    after either the client asks the server for ``next_seq`` and carries on without a gap."""
    client, tap = tapped_client(mock)
    run = new_run(client)
    with pytest.raises(ConflictError):
        run.optim_step(ADAMW)  # seq 1, recorded as failed
    assert run.save_weights_for_sampler(0)["version"] == 0  # seq 2
    bad = sample_request(0)
    bad["sampling"]["top_p"] = 0.0
    with pytest.raises(ValidationError):
        run.sample(bad)  # seq 3, refused, not recorded
    run.sample(sample_request(0))  # seq 3 again
    assert run.operation(1)["status"] == "failed"
    assert [run.operation(s)["primitive"] for s in (2, 3)] == ["save_weights_for_sampler",
                                                               "sample"]
    seqs = [c.body["seq"] for c in tap.calls
            if c.method == "POST" and c.path.startswith(run.path + "/")]
    assert seqs == [1, 2, 3, 3]


def test_pipelined_optim_step_is_held_until_its_forward_backward_ran(mock):
    """ORD-2: forward_backward seq N and optim_step seq N+1 sent concurrently, the optim step
    arriving first; the result equals the same two calls made one after the other."""
    sequential, _ = tapped_client(mock)
    run_a = new_run(sequential)
    run_a.save_weights_for_sampler(0)
    payload = rl_payload(run_a.sample(sample_request(0)))
    expected_fb = run_a.forward_backward(payload)
    expected = run_a.optim_step(ADAMW)

    client, tap = tapped_client(mock)
    tap.delay["forward_backward"] = 0.2  # forces the arrival order; nothing is timed
    run_b = new_run(client)
    run_b.save_weights_for_sampler(0)
    assert run_b.sample(sample_request(0)) == run_a.sample(sample_request(0))  # VER-4
    fb = run_b.submit("forward_backward", payload)
    step = run_b.submit("optim_step", {"adamw": ADAMW.to_json()})
    wait([fb, step], timeout=30)
    assert step.result() == expected and fb.result() == expected_fb
    arrivals = [c.label for c in tap.calls if c.label in ("forward_backward", "optim_step")]
    assert arrivals == ["optim_step", "forward_backward"]
    assert [run_b.operation(s)["primitive"] for s in (3, 4)] == ["forward_backward",
                                                                 "optim_step"]


def test_export_files_are_checked_against_size_and_sha256(mock):
    client, tap = tapped_client(mock)
    run = new_run(client)
    export = run.export_lora()
    for file in export["files"]:
        content = run.download_export(export["export_id"], file)
        assert hashlib.sha256(content).hexdigest() == file["sha256"]
    tap.rewrite["download"] = lambda body: {"tampered": True}
    json_file = next(f for f in export["files"] if f["name"].endswith(".json"))
    with pytest.raises(IntegrityError):
        run.download_export(export["export_id"], json_file)


def test_error_without_envelope_is_a_protocol_error():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500 if request.method == "POST" else 400, text="oops")

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x")
    client = WhitneyClient(http, sleep=lambda s: None)
    with pytest.raises(ProtocolError) as caught:
        client.capabilities()
    assert caught.value.status == 400


def test_seq_in_the_body_and_keyless_base_url_are_refused(mock, monkeypatch):
    client, _ = tapped_client(mock)
    run = new_run(client)
    with pytest.raises(ValueError, match="seq"):
        run.call("save_weights_for_sampler", {"seq": 9, "version": 0})
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    with pytest.raises(ValueError, match="API key"):
        WhitneyClient.connect("http://example.invalid")


def test_connect_without_a_url_uses_the_embedded_mock(monkeypatch):
    monkeypatch.delenv("WHITNEY_BASE_URL", raising=False)
    with WhitneyClient.connect() as client:
        capabilities = client.capabilities()
        assert MODEL in [model["id"] for model in capabilities["base_models"]]
        assert client.create_session()["state"] == "open"


def test_connect_reads_the_environment(monkeypatch):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    monkeypatch.setenv("WHITNEY_BASE_URL", "http://whitney.example/")
    monkeypatch.setenv("WHITNEY_API_KEY", "k-123")
    client = WhitneyClient.connect(transport=httpx.MockTransport(handler))  # no network
    client.capabilities()
    assert str(seen[0].url) == "http://whitney.example/v1/training/capabilities"
    assert seen[0].headers["Authorization"] == "Bearer k-123" and KEY != "k-123"
