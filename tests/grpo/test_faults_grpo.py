"""The GRPO client and loop under every server-side fault kind of the mock's control plane.

``tests/grpo/test_grpo_loop.py`` injects faults on the client side (a tapping transport); here the
mock itself misbehaves, through the ``whitney_mock`` / ``whitney_server`` fixtures, including a
response dropped on a real socket. The reference for "recovered" is a fault-free run of the same
loop on a fresh mock with the same seed: retries must be invisible in what was trained (ORD-3:
a re-sent seq is a replay, never a second effect), and the trace must show each primitive once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from grpo.algorithms import get_algorithm
from grpo.client import RetryPolicy, WhitneyClient
from grpo.errors import ConflictError, ConnectionFailed, RateLimitError, ServerError, TrainingError
from grpo.loop import LoopConfig, TrainResult, train
from grpo.tasks import ByteTokenizer
from mock_server import Features, InProcessTransport, create_app
from mock_server.testing import MockWhitney
from mock_server.testing.mock import DEFAULT_API_KEY, IN_PROCESS_BASE_URL

TOKENIZER = ByteTokenizer()
PROMPTS = [TOKENIZER.encode(word) for word in ("cat", "dog", "sun")]
CONFIG = LoopConfig(cycles=2, group_size=4, prompts_per_cycle=2, max_tokens=6,
                    cancel_timeout_seconds=10)
RETRY = RetryPolicy(max_attempts=4)
CYCLE = ["save_weights_for_sampler", "sample", "sample", "forward_backward", "optim_step"]
EXPECTED_TRACE = CYCLE * CONFIG.cycles + ["save_state", "export_lora"]


def spread_reward(tokens: list[int], prompt_tokens: list[int]) -> float:
    """Distinct completions get distinct rewards, so no group is uniform."""
    return float(sum(tokens) + len(tokens))


def run_loop(whitney: MockWhitney, slept: list[float] | None = None) -> TrainResult:
    sleep: Callable[[float], None] = (slept.append if slept is not None
                                      else lambda seconds: None)
    client = WhitneyClient(whitney.client, retry=RETRY, sleep=sleep)
    return train(client, PROMPTS, spread_reward, get_algorithm("grpo"), CONFIG)


def fingerprint(result: TrainResult) -> dict[str, Any]:
    """What training produced: per-cycle losses and norms, and the exported adapter's bytes."""
    return {
        "metrics": [(m.step, m.loss, m.grad_norm, m.update_norm, m.reward_mean)
                    for m in result.metrics],
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in result.files.items()},
        "state": result.run["state"],
    }


@pytest.fixture(scope="module")
def clean() -> dict[str, Any]:
    with MockWhitney.in_process(seed=0) as whitney:
        result = run_loop(whitney)
        assert whitney.primitives(result.run_id) == EXPECTED_TRACE
        return fingerprint(result)


def assert_recovered(whitney: MockWhitney, result: TrainResult, clean: dict[str, Any]) -> None:
    assert fingerprint(result) == clean
    assert whitney.primitives(result.run_id) == EXPECTED_TRACE
    assert {entry["status"] for entry in whitney.trace(result.run_id)} == {"completed"}


def assert_same_training(whitney: MockWhitney, result: TrainResult,
                         clean: dict[str, Any]) -> None:
    """As :func:`assert_recovered`, the reported metrics within a few ulps: a retried creation
    changes what the process allocated before training, and numpy's reductions may then sum in
    another order (the trained weights, hence the exported bytes, are compared exactly)."""
    got = fingerprint(result)
    assert got["files"] == clean["files"] and got["state"] == clean["state"]
    assert got["metrics"] == [pytest.approx(row, rel=1e-12, abs=1e-12)
                              for row in clean["metrics"]]
    assert whitney.primitives(result.run_id) == EXPECTED_TRACE


# -- recovered transparently --------------------------------------------------------------------
def test_transient_503_before_execution_is_retried(whitney_mock, clean) -> None:
    whitney_mock.inject_fault("error", "forward_backward", status=503, count=2)
    assert_recovered(whitney_mock, run_loop(whitney_mock), clean)
    assert whitney_mock.faults()[0]["fired"] == 2


def test_500_after_execution_is_answered_by_replay(whitney_mock, clean) -> None:
    whitney_mock.inject_fault("error", "optim_step", status=500, after_execute=True, count=2)
    assert_recovered(whitney_mock, run_loop(whitney_mock), clean)


def test_throttle_waits_retry_after(whitney_mock, clean) -> None:
    whitney_mock.inject_fault("throttle", "sample", count=2, retry_after=3)
    slept: list[float] = []
    assert_recovered(whitney_mock, run_loop(whitney_mock, slept), clean)
    assert slept == [3.0, 3.0]


def test_latency_changes_nothing_but_time(whitney_mock, clean) -> None:
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)

    whitney_mock.app.state.mock_faults.sleep = record
    whitney_mock.inject_fault("latency", "forward_backward", delay_ms=800, count=None)
    assert_recovered(whitney_mock, run_loop(whitney_mock), clean)
    assert delays == [0.8] * CONFIG.cycles


@pytest.mark.parametrize("primitive", ["save_weights_for_sampler", "sample", "forward_backward",
                                       "optim_step", "save_state", "export_lora"])
def test_lost_response_is_replayed_not_executed_twice(whitney_mock, clean, primitive) -> None:
    whitney_mock.inject_fault("drop", primitive, count=2)
    assert_recovered(whitney_mock, run_loop(whitney_mock), clean)
    assert whitney_mock.faults()[0]["fired"] == 2


def test_lost_response_on_a_real_socket(whitney_server, clean) -> None:
    whitney_server.inject_fault("drop", "optim_step")
    whitney_server.inject_fault("drop", "forward_backward", skip=1)
    client = WhitneyClient.connect(whitney_server.base_url, whitney_server.api_key, retry=RETRY)
    with client:
        result = train(client, PROMPTS, spread_reward, get_algorithm("grpo"), CONFIG)
    assert_recovered(whitney_server, result, clean)
    assert [f["fired"] for f in whitney_server.faults()] == [1, 1]


# -- given up on, and cleaned up (seed: Cleanup) -----------------------------------------------
@pytest.mark.parametrize("kind,options,error_class", [
    ("error", {"status": 503}, ServerError),
    ("throttle", {"retry_after": 0}, RateLimitError),
    ("drop", {}, ConnectionFailed),
])
def test_a_fault_that_never_lifts_is_cleaned_up(whitney_mock, kind, options,
                                                error_class) -> None:
    whitney_mock.inject_fault(kind, "optim_step", count=None, **options)
    with pytest.raises(TrainingError) as caught:
        run_loop(whitney_mock)
    error = caught.value
    assert isinstance(error.__cause__, error_class)
    assert (error.phase, error.cycle) == ("optim_step", 0)
    assert whitney_mock.faults()[0]["fired"] == RETRY.max_attempts
    run = whitney_mock.client.get(f"/v1/training/runs/{error.run_id}").json()
    assert run["state"] == "cancelled" == error.cleanup["run_state"]
    assert error.cleanup["session_state"] == "closed"
    executed = whitney_mock.primitives(error.run_id)
    assert executed == CYCLE[:-1] + (["optim_step"] if kind == "drop" else [])


def test_a_run_failed_by_the_server_mid_loop_is_cleaned_up(whitney_mock) -> None:
    """LIFE-8: the run turns ``failed`` when cycle 1 samples; the loop stops with the cycle,
    cancel leaves the terminal state alone, and the session is closed."""
    client = WhitneyClient(whitney_mock.client, retry=RETRY, sleep=lambda s: None)
    created: list[str] = []
    original = client.create_run

    def create_run(*args: Any, **kwargs: Any) -> Any:  # arm the fault once the run exists
        run = original(*args, **kwargs)
        created.append(run.run_id)
        whitney_mock.inject_fault("fail_run", "sample", run_id=run.run_id,
                                  skip=CONFIG.prompts_per_cycle)  # cycle 0 samples pass
        return run

    client.create_run = create_run  # type: ignore[method-assign]
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, spread_reward, get_algorithm("grpo"), CONFIG)
    error = caught.value
    assert isinstance(error.__cause__, ConflictError)
    assert error.__cause__.type == "run_not_active"
    assert (error.phase, error.cycle, error.run_id) == ("sample", 1, created[0])
    assert error.cleanup == {"run_state": "failed", "session_state": "closed", "errors": []}
    assert whitney_mock.primitives(error.run_id) == CYCLE + ["save_weights_for_sampler"]


@pytest.mark.parametrize("creation", ["create_session", "create_run"])
def test_a_lost_creation_is_re_sent_with_its_key_and_created_once(whitney_mock, clean,
                                                                  creation) -> None:
    """LIFE-9 (the mock declares idempotent_create): the client sends one Idempotency-Key per
    creation and retries a lost response like a primitive's; the retry is answered with the
    first answer (replayed), so the loop trains exactly as without the fault, on one session
    with one run."""
    whitney_mock.inject_fault("drop", creation, count=2)
    result = run_loop(whitney_mock)
    assert_same_training(whitney_mock, result, clean)
    assert whitney_mock.faults()[0]["fired"] == 2
    assert list(whitney_mock.backend.sessions) == [result.session_id]
    assert whitney_mock.backend.sessions[result.session_id].run_ids == [result.run_id]


def test_a_lost_run_creation_on_a_real_socket(whitney_server, clean) -> None:
    whitney_server.inject_fault("drop", "create_run")
    client = WhitneyClient.connect(whitney_server.base_url, whitney_server.api_key, retry=RETRY)
    with client:
        result = train(client, PROMPTS, spread_reward, get_algorithm("grpo"), CONFIG)
    assert_same_training(whitney_server, result, clean)
    assert whitney_server.backend.sessions[result.session_id].run_ids == [result.run_id]


def test_a_creation_lost_for_good_is_learned_back_and_cleaned_up(whitney_mock) -> None:
    """Every attempt's response lost: the loop gives up (ConnectionFailed), then learns the run
    it created with the same Idempotency-Key once the faults lift, cancels it and closes the
    session: nothing leaks (the case the contract 1.0 client could not clean up)."""
    whitney_mock.inject_fault("drop", "create_run", count=RETRY.max_attempts)
    with pytest.raises(TrainingError) as caught:
        run_loop(whitney_mock)
    error = caught.value
    assert isinstance(error.__cause__, ConnectionFailed) and error.phase == "create_run"
    assert error.cleanup == {"run_state": "cancelled", "session_state": "closed", "errors": []}
    (session,) = whitney_mock.backend.sessions.values()
    assert session.run_ids == [error.run_id] and session.state == "closed"


def test_without_idempotent_create_a_lost_create_session_is_not_re_sent() -> None:
    """A server that does not declare LIFE-9: ``POST /sessions`` has no replay protection, so
    after a lost response the client must not create a second session; the loop stops before
    any run exists (the documented 1.0 limitation)."""
    app = create_app(api_keys=(DEFAULT_API_KEY,), control_plane=True,
                     features=Features(idempotent_create=False))
    with MockWhitney(app, base_url=IN_PROCESS_BASE_URL, transport=InProcessTransport(app),
                     api_keys=(DEFAULT_API_KEY,)) as whitney:
        whitney.inject_fault("drop", "create_session")
        with pytest.raises(TrainingError) as caught:
            run_loop(whitney)
        assert isinstance(caught.value.__cause__, ConnectionFailed)
        assert caught.value.phase == "create_session"
        assert len(whitney.backend.sessions) == 1
        assert whitney.trace() == {}
