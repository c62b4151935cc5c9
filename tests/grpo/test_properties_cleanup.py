"""Seed Cleanup as a property: a fault at a random primitive of a random cycle of the GRPO loop.

Hypothesis picks the number of cycles, the cycle, the primitive and which of its calls in that
cycle fails (or ``save_state`` / ``export_lora`` after the cycles), and how: a 5xx or a 429 that
never lifts (the client retries, then gives up), a 5xx after the server executed the call, a
4xx the client must not retry, a response dropped before or after execution, or the run failed
by the server. Optionally the cleanup itself meets transient faults (a 503 or a lost response
on cancel, poll or close, fewer times than the client retries). Faults come from the mock's
control plane (``mock_server.testing.MockWhitney``), so the client is untouched.

Whatever the fault, ``train`` must end with the run terminal, the session closed and the
original error raised (``TrainingError`` naming the cycle and phase, the original as
``__cause__``), and nothing left open in the mock: no open session, no run that is not terminal,
and the failed primitive executed at most once (ORD-3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from grpo.algorithms import get_algorithm
from grpo.client import RetryPolicy, WhitneyClient
from grpo.errors import (
    ConflictError,
    ConnectionFailed,
    RateLimitError,
    ServerError,
    TrainingError,
    ValidationError,
)
from grpo.loop import LoopConfig, train
from grpo.tasks import ByteTokenizer
from mock_server.testing import MockWhitney

TOKENIZER = ByteTokenizer()
PROMPTS = [TOKENIZER.encode(word) for word in ("cat", "dog", "sun")]
PROMPTS_PER_CYCLE = 2
RETRY = RetryPolicy(max_attempts=3)
TERMINAL = {"finished", "cancelled", "failed"}
#: Calls of each primitive per cycle in this loop (one merged forward_backward, one update).
PER_CYCLE = {"save_weights_for_sampler": 1, "sample": PROMPTS_PER_CYCLE, "forward_backward": 1,
             "optim_step": 1}
AFTER_CYCLES = ("save_state", "export_lora")
CYCLE = ["save_weights_for_sampler", *["sample"] * PROMPTS_PER_CYCLE, "forward_backward",
         "optim_step"]


def spread_reward(tokens: list[int], prompt_tokens: list[int]) -> float:
    """Distinct completions get distinct rewards, so no group is uniform."""
    return float(sum(tokens) + len(tokens))


@dataclass(frozen=True)
class Kind:
    """A fault kind: what the control plane is told, and what the loop must raise."""

    name: str
    fault: dict[str, Any]
    error: type[Exception]
    executes: bool  # the failed call reached the backend and was recorded


KINDS = [
    Kind("503 forever", {"kind": "error", "status": 503, "count": None}, ServerError, False),
    Kind("500 after execution", {"kind": "error", "status": 500, "after_execute": True,
                                 "count": None}, ServerError, True),
    Kind("409", {"kind": "error", "status": 409, "error": {"type": "injected_conflict"}},
         ConflictError, False),
    Kind("422", {"kind": "error", "status": 422, "error": {"type": "injected_invalid"}},
         ValidationError, False),
    Kind("429 forever", {"kind": "throttle", "retry_after": 0, "count": None}, RateLimitError,
         False),
    Kind("dropped before execution", {"kind": "drop", "after_execute": False, "count": None},
         ConnectionFailed, False),
    Kind("dropped after execution", {"kind": "drop", "count": None}, ConnectionFailed, True),
    Kind("run failed by the server", {"kind": "fail_run"}, ConflictError, False),
]


@st.composite
def fault_sites(draw: Any) -> tuple[int, str, int | None, int]:
    """(cycles, primitive, cycle or None after the cycles, skip: matching calls let through)."""
    cycles = draw(st.integers(2, 3))
    primitive = draw(st.sampled_from([*PER_CYCLE, *AFTER_CYCLES]))
    if primitive in AFTER_CYCLES:
        return cycles, primitive, None, 0
    cycle = draw(st.integers(0, cycles - 1))
    nth = draw(st.integers(0, PER_CYCLE[primitive] - 1))
    return cycles, primitive, cycle, cycle * PER_CYCLE[primitive] + nth


CLEANUP_NOISE = st.none() | st.tuples(
    st.sampled_from(["cancel_run", "get_run", "close_session"]),
    st.sampled_from([{"kind": "error", "status": 503}, {"kind": "drop"}]),
    st.integers(1, RETRY.max_attempts - 1))


@settings(max_examples=examples(40, 600))
@given(site=fault_sites(), kind=st.sampled_from(KINDS), noise=CLEANUP_NOISE,
       cancel_delay_ms=st.sampled_from([0, 20]))
def test_a_fault_anywhere_in_the_loop_is_cleaned_up_and_reported(site, kind, noise,
                                                                  cancel_delay_ms):
    cycles, primitive, cycle, skip = site
    event(f"fault: {kind.name}")
    event(f"at: {primitive}")
    config = LoopConfig(cycles=cycles, group_size=4, prompts_per_cycle=PROMPTS_PER_CYCLE,
                        max_tokens=6, cancel_timeout_seconds=10)
    with MockWhitney.in_process(seed=0, cancel_delay_ms=cancel_delay_ms) as whitney:
        client = WhitneyClient(whitney.client, retry=RETRY, sleep=lambda seconds: None)
        create_run = client.create_run

        def arm_faults(*args: Any, **kwargs: Any) -> Any:  # once the run id is known
            run = create_run(*args, **kwargs)
            options = {"run_id": run.run_id, **kind.fault}
            whitney.inject_fault(options.pop("kind"), primitive, skip=skip, **options)
            if noise is not None:
                endpoint, fault, count = noise
                fault = dict(fault)
                whitney.inject_fault(fault.pop("kind"), endpoint, run_id=None
                                     if endpoint == "close_session" else run.run_id,
                                     count=count, **fault)
            return run

        client.create_run = arm_faults  # type: ignore[method-assign]
        try:
            train(client, PROMPTS, spread_reward, get_algorithm("grpo"), config)
        except TrainingError as caught:
            error = caught
        else:
            raise AssertionError(f"{kind.name} at {primitive} did not stop the loop")

        # the original error, where it happened
        assert isinstance(error.__cause__, kind.error), repr(error.__cause__)
        if kind.name == "run failed by the server":
            assert error.__cause__.type == "run_not_active"
        elif isinstance(error.__cause__, ConflictError | ValidationError):
            assert error.__cause__.type == kind.fault["error"]["type"]
        assert (error.phase, error.cycle) == (primitive, cycle)
        # cleaned up: run terminal, session closed, nothing left open in the mock
        expected_state = "failed" if kind.name == "run failed by the server" else "cancelled"
        assert error.cleanup == {"run_state": expected_state, "session_state": "closed",
                                 "errors": []}
        backend = whitney.backend
        assert [s.session_id for s in backend.sessions.values() if s.state == "open"] == []
        assert {r.state for r in backend.runs.values()} == {expected_state}
        # ORD-3: every call before the fault executed once, the failed one at most once
        full = [*(p for _ in range(cycles) for p in CYCLE), *AFTER_CYCLES]
        at = [i for i, p in enumerate(full) if p == primitive][skip]
        assert whitney.primitives(error.run_id) == full[:at] + [primitive] * kind.executes
