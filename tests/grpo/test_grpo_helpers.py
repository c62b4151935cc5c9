"""The seed's helpers against independent formulas (pure Python ``statistics``, explicit loops),
with hypothesis; and one check against the mock that the datum shift is the contract's."""

from __future__ import annotations

import math
import statistics

import pytest
from conftest import API, BOS, KEY, MODEL
from hypothesis import assume, given
from hypothesis import strategies as st

from grpo.helpers import (
    STD_EPS,
    all_zero,
    forward_backward_payload,
    group_mean_advantages,
    is_uniform,
    leave_one_out_advantages,
    rl_datum,
)

rewards_st = st.lists(
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False),
    min_size=2, max_size=16,
)
tokens_st = st.lists(st.integers(min_value=0, max_value=257), min_size=1, max_size=12)


def close(a: list[float], b: list[float], scale: float = 1.0) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9 * scale)
                                    for x, y in zip(a, b, strict=False))


def reference_advantages(rewards: list[float], normalize_std: bool) -> list[float]:
    mean = statistics.fmean(rewards)
    centred = [r - mean for r in rewards]
    if not normalize_std:
        return centred
    return [c / max(statistics.pstdev(rewards), STD_EPS) for c in centred]


@given(rewards_st, st.booleans())
def test_group_mean_advantages_match_the_statistics_formula(rewards, normalize_std):
    assume(not is_uniform(rewards))
    scale = max(map(abs, rewards)) + 1.0
    expected = reference_advantages(rewards, normalize_std)
    assert close(group_mean_advantages(rewards, normalize_std=normalize_std), expected,
                 scale if not normalize_std else 1e3)


@given(rewards_st, st.booleans())
def test_advantages_have_zero_group_mean(rewards, normalize_std):
    advantages = group_mean_advantages(rewards, normalize_std=normalize_std)
    scale = max(map(abs, rewards)) + 1.0
    assert abs(math.fsum(advantages)) <= 1e-9 * len(rewards) * (1.0 if normalize_std else scale)


@given(rewards_st)
def test_normalised_advantages_have_unit_population_std(rewards):
    assume(statistics.pstdev(rewards) >= 1e-3)
    advantages = group_mean_advantages(rewards, normalize_std=True)
    assert math.isclose(statistics.pstdev(advantages), 1.0, rel_tol=1e-9)


@given(rewards_st, st.floats(min_value=-100, max_value=100), st.booleans())
def test_advantages_are_invariant_to_a_reward_shift(rewards, shift, normalize_std):
    assume(statistics.pstdev(rewards) >= 1e-2)
    shifted = [r + shift for r in rewards]
    scale = max(map(abs, rewards)) + abs(shift) + 1.0
    assert close(group_mean_advantages(shifted, normalize_std=normalize_std),
                 group_mean_advantages(rewards, normalize_std=normalize_std), scale * 1e3)


@given(st.data(), rewards_st, st.booleans())
def test_advantages_are_permutation_equivariant(data, rewards, normalize_std):
    order = data.draw(st.permutations(range(len(rewards))))
    permuted = group_mean_advantages([rewards[i] for i in order], normalize_std=normalize_std)
    original = group_mean_advantages(rewards, normalize_std=normalize_std)
    scale = max(map(abs, rewards)) + 1.0
    assert close(permuted, [original[i] for i in order], scale * 1e3)


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.integers(2, 16),
       st.booleans())
def test_uniform_group_gives_exact_zeros(value, size, normalize_std):
    advantages = group_mean_advantages([value] * size, normalize_std=normalize_std)
    assert advantages == [0.0] * size and all_zero(advantages)
    assert leave_one_out_advantages([value] * size) == [0.0] * size


def test_rewards_equal_up_to_float_rounding_count_as_uniform():
    rewards = [0.1 + 0.2, 0.3, 0.3]  # 0.30000000000000004 vs 0.3
    assert all_zero(group_mean_advantages(rewards, normalize_std=True))
    assert not all_zero(group_mean_advantages([1e-12, 2e-12]))  # small but real differences


@given(rewards_st)
def test_rloo_is_reward_minus_mean_of_the_others(rewards):
    assume(not is_uniform(rewards))
    size = len(rewards)
    explicit = [r - math.fsum(rewards[:i] + rewards[i + 1:]) / (size - 1)
                for i, r in enumerate(rewards)]
    scaled = [size / (size - 1) * (r - statistics.fmean(rewards)) for r in rewards]
    scale = max(map(abs, rewards)) + 1.0
    assert close(leave_one_out_advantages(rewards), explicit, scale)
    assert close(explicit, scaled, scale)


def test_helpers_refuse_bad_rewards():
    for bad in ([], [1.0, float("nan")], [[1.0]]):
        with pytest.raises(ValueError):
            group_mean_advantages(bad)
    with pytest.raises(ValueError):
        leave_one_out_advantages([1.0])


@given(tokens_st, tokens_st, st.floats(min_value=-10, max_value=10), st.data())
def test_rl_datum_shift_lengths_and_masks(prompt, completion, advantage, data):
    logprobs = data.draw(st.lists(st.floats(min_value=-20, max_value=0),
                                  min_size=len(completion), max_size=len(completion)))
    datum = rl_datum(prompt, completion, logprobs, advantage)
    full = prompt + completion
    token_ids = datum["model_input"]["token_ids"]
    inputs = datum["loss_inputs"]
    length = len(full) - 1
    assert len(token_ids) == length and all(len(v) == length for v in inputs.values())
    assert set(inputs) == {"target_tokens", "logprobs", "advantages", "mask"}
    for i in range(length):  # position i predicts target_tokens[i] from token_ids[:i+1]
        assert token_ids[i] == full[i] and inputs["target_tokens"][i] == full[i + 1]
        predicts_completion = i + 1 >= len(prompt)
        assert inputs["mask"][i] == (1.0 if predicts_completion else 0.0)
        assert inputs["advantages"][i] == (advantage if predicts_completion else 0.0)
        j = i + 1 - len(prompt)
        assert inputs["logprobs"][i] == (logprobs[j] if predicts_completion else 0.0)


def test_rl_datum_refuses_what_cannot_be_a_datum():
    with pytest.raises(ValueError, match="prompt"):
        rl_datum([], [1], [-1.0], 1.0)
    with pytest.raises(ValueError, match="empty"):
        rl_datum([BOS], [], [], 1.0)
    with pytest.raises(ValueError, match="logprobs"):
        rl_datum([BOS], [1, 2], [-1.0], 1.0)
    with pytest.raises(ValueError, match="finite"):
        rl_datum([BOS], [1], [-1.0], float("inf"))


def test_forward_backward_payload_shape():
    datum = rl_datum([BOS, 104], [105], [-1.0], 0.5)
    payload = forward_backward_payload([datum], "ppo", {"clip_low_threshold": 0.7})
    assert payload == {"loss_function": "ppo", "loss_config": {"clip_low_threshold": 0.7},
                       "data": [datum]}
    assert forward_backward_payload([datum], "importance_sampling")["loss_config"] == {}
    with pytest.raises(ValueError):
        forward_backward_payload([], "importance_sampling")


def test_rl_datum_aligns_with_the_servers_positions(mock):
    """VER-3: right after a version is saved, ``forward`` gives the sampler's logprobs back at
    exactly the completion positions of the datum (an off-by-one shift would not match), and
    LOSS-2 at r = 1 is -Σ m·A = -A·len(completion)."""
    http = mock.client(KEY)
    session = http.post(f"{API}/sessions", json={}).json()["session_id"]
    run = http.post(f"{API}/sessions/{session}/runs", json={
        "base_model": MODEL, "lora": {"rank": 4, "alpha": 8.0, "seed": 3},
        "optimizer": "adamw"}).json()["run_id"]
    tolerance = http.get(f"{API}/capabilities").json()["features"]["logprob_tolerance"]
    assert http.post(f"{API}/runs/{run}/save_weights_for_sampler",
                     json={"seq": 1, "version": 0}).status_code == 200
    prompt = [BOS, *b"sea"]
    sample = http.post(f"{API}/runs/{run}/sample", json={
        "seq": 2, "version": 0, "prompt": {"token_ids": prompt}, "num_samples": 3,
        "sampling": {"max_tokens": 6, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                     "seed": 11}}).json()
    advantages = [0.5, -1.5, 1.0]
    data = [rl_datum(prompt, s["tokens"], s["logprobs"], a)
            for s, a in zip(sample["sequences"], advantages, strict=False)]
    response = http.post(f"{API}/runs/{run}/forward", json={
        "seq": 3, **forward_backward_payload(data, "importance_sampling")})
    assert response.status_code == 200, response.text
    result = response.json()
    for datum, output in zip(data, result["outputs"], strict=False):
        for p, q, m in zip(output["logprobs"], datum["loss_inputs"]["logprobs"],
                           datum["loss_inputs"]["mask"], strict=False):
            if m:
                assert abs(p - q) <= tolerance
    expected_loss = -sum(a * len(s["tokens"])
                         for s, a in zip(sample["sequences"], advantages, strict=False))
    assert math.isclose(result["loss"], expected_loss, rel_tol=1e-6, abs_tol=1e-6)
