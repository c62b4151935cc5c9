"""``build_loss`` variants against independent formulas; the KL penalty's alignment and its
value on the mock (zero at the reference version itself, VER-3)."""

from __future__ import annotations

import math
import statistics

import pytest
from conftest import BOS
from test_grpo_support import tapped_client

from grpo.algorithms import ALGORITHMS, LossContext, UniformRewardError, get_algorithm
from grpo.loop import LoopConfig, train
from grpo.tasks import ByteTokenizer

PROMPT = [BOS, *b"sun"]
COMPLETIONS = [[97, 98, 257], [99], [100, 101], [102, 103, 104, 257]]
REWARDS = {tuple(c): r for c, r in zip(COMPLETIONS, [0.25, 1.0, 0.0, 0.5], strict=False)}
SAMPLE = {"version": 3, "step": 3, "sequences": [
    {"tokens": c, "logprobs": [-0.5 - 0.1 * i for i in range(len(c))], "stop_reason": "stop"}
    for c in COMPLETIONS]}
REQUEST = {"version": 3, "prompt": {"token_ids": PROMPT}, "num_samples": 4, "sampling": {}}


def ctx(reward_of=REWARDS, run=None) -> LossContext:
    return LossContext(reward=lambda tokens: reward_of[tuple(tokens)], run=run)


def centred(rewards):
    return [r - statistics.fmean(rewards) for r in rewards]


def normalised(rewards):
    return [c / statistics.pstdev(rewards) for c in centred(rewards)]


def leave_one_out(rewards):
    return [r - (sum(rewards) - r) / (len(rewards) - 1) for r in rewards]


EXPECTED = {  # name: (advantage formula, loss function, loss config)
    "grpo": (normalised, "importance_sampling", {}),
    "dr_grpo": (centred, "importance_sampling", {}),
    "rloo": (leave_one_out, "importance_sampling", {}),
    "ppo": (normalised, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": (normalised, "cispo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "dro": (centred, "dro", {"beta": 0.05}),
}


def test_every_algorithm_is_covered():
    assert set(EXPECTED) == set(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_build_loss_payload_matches_the_formula(name):
    formula, loss_function, loss_config = EXPECTED[name]
    algorithm = get_algorithm(name)
    payload = algorithm.build_loss(SAMPLE, 3, REQUEST, ctx())
    assert (payload["loss_function"], payload["loss_config"]) == (loss_function, loss_config)
    assert (algorithm.loss_function, algorithm.loss_config) == (loss_function, loss_config)
    expected_G = formula([REWARDS[tuple(c)] for c in COMPLETIONS])
    for datum, completion, sequence, advantage in zip(
        payload["data"], COMPLETIONS, SAMPLE["sequences"], expected_G, strict=False
    ):
        inputs = datum["loss_inputs"]
        prompt_positions = len(PROMPT) - 1
        assert datum["model_input"]["token_ids"] == (PROMPT + completion)[:-1]
        assert inputs["advantages"][:prompt_positions] == [0.0] * prompt_positions
        for value in inputs["advantages"][prompt_positions:]:
            assert math.isclose(value, advantage, rel_tol=1e-12, abs_tol=1e-12)
        assert inputs["logprobs"][prompt_positions:] == sequence["logprobs"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_uniform_group_raises_the_seeds_value_error(name):
    with pytest.raises(ValueError, match="cycle 7: reward is uniform across the group, "
                                         "no gradient signal") as caught:
        get_algorithm(name).build_loss(SAMPLE, 7, REQUEST, ctx({tuple(c): 0.3
                                                                for c in COMPLETIONS}))
    assert isinstance(caught.value, UniformRewardError)


class ScoringRun:
    """Stands in for ``Run.logprobs``: an independent, position-dependent reference model."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def reference(previous: int, token: int) -> float:
        return -0.01 * token - 0.001 * previous

    def logprobs(self, version, token_ids):
        self.calls.append((version, list(token_ids)))
        return {"version": version, "step": 0, "logprobs": [None] + [
            self.reference(token_ids[i - 1], token_ids[i]) for i in range(1, len(token_ids))]}


def test_kl_penalty_is_folded_per_completion_token():
    """A_t <- A_t - β·(q_t - ref_t) where ref_t scores the token predicted at position t."""
    run = ScoringRun()
    plain = get_algorithm("dr_grpo").build_loss(SAMPLE, 3, REQUEST, ctx())
    penalised = get_algorithm("dr_grpo", kl_coef=0.5, reference_version=2).build_loss(
        SAMPLE, 3, REQUEST, ctx(run=run))
    assert [version for version, _ in run.calls] == [2] * len(COMPLETIONS)
    assert [tokens for _, tokens in run.calls] == [PROMPT + c for c in COMPLETIONS]
    for before, after, completion, sequence in zip(
        plain["data"], penalised["data"], COMPLETIONS, SAMPLE["sequences"], strict=False
    ):
        full = PROMPT + completion
        for t in range(len(full) - 1):
            a0 = before["loss_inputs"]["advantages"][t]
            a1 = after["loss_inputs"]["advantages"][t]
            if t < len(PROMPT) - 1:
                assert a1 == a0 == 0.0
            else:
                q = sequence["logprobs"][t - (len(PROMPT) - 1)]
                ref = ScoringRun.reference(full[t], full[t + 1])
                assert math.isclose(a1, a0 - 0.5 * (q - ref), rel_tol=1e-12, abs_tol=1e-12)
    assert get_algorithm("grpo", kl_coef=0.1).primitives == ("logprobs",)
    with pytest.raises(ValueError):
        get_algorithm("grpo", kl_coef=-1.0)
    with pytest.raises(ValueError, match="unknown algorithm"):
        get_algorithm("reinforce++")


def test_kl_penalty_on_the_mock_vanishes_at_the_reference_version(mock):
    """Cycle 0 samples version 0, the reference itself: the sampler's logprobs equal the
    reference's within ``logprob_tolerance`` (VER-3), so the penalty changes nothing there."""
    tokenizer = ByteTokenizer()
    prompts = [tokenizer.encode("cat"), tokenizer.encode("sea")]
    config = LoopConfig(cycles=2, group_size=3, prompts_per_cycle=2, max_tokens=5)
    kl_coef = 0.2
    client, tap = tapped_client(mock)
    reward = lambda tokens, prompt: float(sum(tokens))  # noqa: E731 - distinct per completion
    train(client, prompts, reward, get_algorithm("dr_grpo", kl_coef=kl_coef), config)
    logprob_calls = [c.body for c in tap.calls if c.label == "logprobs"]
    assert len(logprob_calls) == 2 * 2 * 3 and {b["version"] for b in logprob_calls} == {0}
    tolerance = client.capabilities()["features"]["logprob_tolerance"]
    first_cycle = next(c.body for c in tap.calls if c.label == "forward_backward")["data"]
    for g in range(0, len(first_cycle), config.group_size):
        group = first_cycle[g:g + config.group_size]
        completions = [[t for t, m in zip(d["loss_inputs"]["target_tokens"],
                                          d["loss_inputs"]["mask"], strict=True) if m]
                       for d in group]
        rewards = [float(sum(c)) for c in completions]
        for datum, expected in zip(group, centred(rewards), strict=False):
            inputs = datum["loss_inputs"]
            for advantage, m in zip(inputs["advantages"], inputs["mask"], strict=False):
                if m:
                    assert abs(advantage - expected) <= kl_coef * 2 * tolerance
