"""LOSS-1..5 and GRAD-1: loss values against the contract formulas, gradients against central
finite differences, for every loss and every LoRA matrix (A and B of mixer and lm_head)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loss_reference import reference_loss, with_param

from mock_server.engine.losses import LOSS_SPECS
from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_ID, VOCAB_SIZE, Lora, NonFiniteLossError

MODEL = get_base_model(BASE_MODEL_ID)
LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
CONFIGS = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25},
    "cispo": {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25},
    "dro": {"beta": 0.3},
}
LO, HI = 0.75, 1.25


def perturbed_lora(seed: int, rank: int = 3, alpha: float = 6.0) -> Lora:
    lora = MODEL.init_lora(rank, alpha, seed)
    rng = np.random.default_rng(seed + 1)
    return Lora(params={k: (a + 0.3 * rng.standard_normal(a.shape) if ".lora_B." in k else a)
                        for k, a in lora.params.items()}, rank=rank, alpha=alpha)


def ratio_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Target ratios r = exp(p - q) below, inside and above [LO, HI], away from the kinks."""
    bands = [(0.4, 0.7), (0.8, 1.2), (1.3, 2.2)]
    which = rng.integers(0, 3, n)
    lows = np.array([b[0] for b in bands])[which]
    highs = np.array([b[1] for b in bands])[which]
    return rng.uniform(lows, highs)


def make_batch(lora: Lora, loss: str, seed: int, lengths=(6, 11, 1), mask_mode="random"):
    """Random datums whose ``logprobs`` q sit at chosen ratios from the current p."""
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, VOCAB_SIZE, n) for n in lengths]
    targets = [rng.integers(0, VOCAB_SIZE, n) for n in lengths]
    p_now = MODEL.forward(lora, tokens, targets)
    inputs = []
    for tgt, p in zip(targets, p_now, strict=False):
        n = len(tgt)
        if loss == "cross_entropy":
            datum = {"target_tokens": tgt.astype(np.float64)}
            if mask_mode == "few_zeros":
                datum["weights"] = (np.arange(n) % 8 != 3) * rng.uniform(0.5, 2.0, n)
            elif mask_mode != "none":
                datum["weights"] = rng.choice([0.0, 0.5, 1.0, 2.0], n)
        else:
            datum = {"target_tokens": tgt, "logprobs": p - np.log(ratio_values(rng, n)),
                     "advantages": rng.standard_normal(n)}
            if mask_mode == "random":
                datum["mask"] = rng.choice([0.0, 1.0, 0.5], n, p=[0.4, 0.4, 0.2])
            elif mask_mode == "few_zeros":  # mostly live rows, a few with dL/dp == 0
                datum["mask"] = (np.arange(n) % 8 != 3).astype(np.float64)
            elif mask_mode == "ones":
                datum["mask"] = np.ones(n)
        inputs.append(datum)
    return tokens, inputs


def surrogate(loss, lora, tokens, inputs, config, frozen_ratio=None):
    """The differentiated objective as a function of the weights, through ``forward``.

    For CISPO the clipped ratio is a stop-gradient, so it is frozen at the base point.
    """
    targets = [np.asarray(d["target_tokens"]).astype(int) for d in inputs]
    p_list = MODEL.forward(lora, tokens, targets)
    return reference_loss(loss, p_list, inputs, config,
                          frozen_ratio if loss == "cispo" else None)


def frozen_cispo_ratio(lora, tokens, inputs, config):
    targets = [np.asarray(d["target_tokens"]).astype(int) for d in inputs]
    p_list = MODEL.forward(lora, tokens, targets)
    lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
    return [np.clip(np.exp(p - d["logprobs"]), lo, hi)
            for p, d in zip(p_list, inputs, strict=False)]


@pytest.mark.parametrize("mask_mode", ["random", "few_zeros", "ones", "none"])
@pytest.mark.parametrize("loss", LOSSES)
def test_gradient_matches_central_finite_differences(loss, mask_mode):
    lora = perturbed_lora(seed=LOSSES.index(loss))
    config = CONFIGS[loss]
    tokens, inputs = make_batch(lora, loss, seed=17 + LOSSES.index(loss), mask_mode=mask_mode)
    result = MODEL.loss_and_grad(lora, tokens, inputs, loss, config, need_grad=True)
    assert set(result.grads) == set(lora.params)
    frozen = frozen_cispo_ratio(lora, tokens, inputs, config) if loss == "cispo" else None
    rng = np.random.default_rng(99)
    h = 1e-5
    for key, base in lora.params.items():
        grad = result.grads[key]
        assert grad.shape == base.shape and grad.dtype == np.float64
        assert np.abs(grad).max() > 0, key  # non-trivial for every matrix (B is non-zero)
        entries = [tuple(rng.integers(0, s) for s in base.shape) for _ in range(8)]
        directions = [np.zeros_like(base) for _ in entries]
        for direction, idx in zip(directions, entries, strict=False):
            direction[idx] = 1.0
        directions.append(rng.standard_normal(base.shape))
        for direction in directions:
            f_plus = surrogate(loss, with_param(lora, key, base + h * direction), tokens, inputs,
                               config, frozen)
            f_minus = surrogate(loss, with_param(lora, key, base - h * direction), tokens,
                                inputs, config, frozen)
            numeric = (f_plus - f_minus) / (2 * h)
            analytic = float(np.sum(grad * direction))
            assert abs(numeric - analytic) <= 1e-6 + 1e-6 * abs(analytic), (key, numeric,
                                                                             analytic)


def test_ppo_batch_exercises_both_branches():
    """Guard for the test above: ratios fall inside and outside the clip range, both signs of A."""
    lora = perturbed_lora(seed=LOSSES.index("ppo"))
    tokens, inputs = make_batch(lora, "ppo", seed=17 + LOSSES.index("ppo"), lengths=(40,))
    p = MODEL.forward(lora, tokens, [d["target_tokens"] for d in inputs])[0]
    r = np.exp(p - inputs[0]["logprobs"])
    adv = inputs[0]["advantages"]
    clipped_branch = r * adv > np.clip(r, LO, HI) * adv
    assert clipped_branch.any() and (~clipped_branch & ((r < LO) | (r > HI))).any()
    assert ((r > LO) & (r < HI)).any()


@settings(max_examples=20, deadline=None)
@given(loss=st.sampled_from(LOSSES), seed=st.integers(0, 10_000),
       lengths=st.lists(st.integers(0, 30), min_size=1, max_size=4),
       mask_mode=st.sampled_from(["random", "ones", "none"]))
def test_loss_and_logprobs_match_contract_formulas(loss, seed, lengths, mask_mode):
    lora = perturbed_lora(seed=seed % 7)
    config = CONFIGS[loss]
    tokens, inputs = make_batch(lora, loss, seed=seed, lengths=lengths, mask_mode=mask_mode)
    result = MODEL.loss_and_grad(lora, tokens, inputs, loss, config, need_grad=False)
    assert result.grads is None
    p_list = MODEL.forward(lora, tokens, [d["target_tokens"] for d in inputs])
    for got, want in zip(result.logprobs, p_list, strict=False):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    want_loss = reference_loss(loss, p_list, inputs, config)
    assert result.loss == pytest.approx(want_loss, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("loss", ["ppo", "cispo", "dro"])
def test_config_defaults_are_the_contract_defaults(loss):
    lora = perturbed_lora(seed=2)
    tokens, inputs = make_batch(lora, loss, seed=5)
    got = MODEL.loss_and_grad(lora, tokens, inputs, loss, {}, need_grad=False).loss
    p_list = MODEL.forward(lora, tokens, [d["target_tokens"] for d in inputs])
    defaults = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "beta": 0.05}
    assert got == pytest.approx(reference_loss(loss, p_list, inputs, defaults), rel=1e-12)
    for key, bounds in LOSS_SPECS[loss]["config"].items():
        assert bounds["default"] == defaults[key]


@pytest.mark.parametrize("loss", LOSSES)
def test_grad1_gradients_are_additive_over_datums(loss):
    """GRAD-1: grads(data1 ∪ data2) == grads(data1) + grads(data2)."""
    lora = perturbed_lora(seed=4)
    tokens, inputs = make_batch(lora, loss, seed=23, lengths=(9, 3, 14, 7, 5))
    config = CONFIGS[loss]
    whole = MODEL.loss_and_grad(lora, tokens, inputs, loss, config, need_grad=True)
    first = MODEL.loss_and_grad(lora, tokens[:2], inputs[:2], loss, config, need_grad=True)
    second = MODEL.loss_and_grad(lora, tokens[2:], inputs[2:], loss, config, need_grad=True)
    assert whole.loss == pytest.approx(first.loss + second.loss, rel=1e-12, abs=1e-12)
    for key in lora.params:
        np.testing.assert_allclose(whole.grads[key], first.grads[key] + second.grads[key],
                                   rtol=1e-10, atol=1e-12)


def test_fully_masked_datums_give_zero_loss_and_gradient():
    lora = perturbed_lora(seed=1)
    tokens, inputs = make_batch(lora, "importance_sampling", seed=3)
    for d in inputs:
        d["mask"] = np.zeros(len(d["target_tokens"]))
    result = MODEL.loss_and_grad(lora, tokens, inputs, "importance_sampling", {}, True)
    assert result.loss == 0.0
    assert all(not g.any() for g in result.grads.values())


def test_masked_overflowing_ratio_contributes_zero_and_unmasked_raises():
    lora = perturbed_lora(seed=1)
    tokens = [np.array([1, 2, 3])]
    base = {"target_tokens": np.array([4, 5, 6]), "logprobs": np.array([-1.0, -2000.0, -1.0]),
            "advantages": np.array([1.0, 1.0, -1.0])}
    ok = MODEL.loss_and_grad(lora, tokens, [{**base, "mask": np.array([1.0, 0.0, 1.0])}],
                             "importance_sampling", {}, True)
    assert np.isfinite(ok.loss) and all(np.isfinite(g).all() for g in ok.grads.values())
    with pytest.raises(NonFiniteLossError):
        MODEL.loss_and_grad(lora, tokens, [base], "importance_sampling", {}, True)


def test_empty_batch_and_empty_datum():
    lora = perturbed_lora(seed=1)
    empty = MODEL.loss_and_grad(lora, [], [], "cross_entropy", {}, True)
    assert empty.loss == 0.0 and empty.logprobs == []
    assert all(not g.any() for g in empty.grads.values())
    one = MODEL.loss_and_grad(lora, [np.zeros(0, dtype=int)], [{"target_tokens": np.zeros(0)}],
                              "cross_entropy", {}, False)
    assert one.loss == 0.0 and one.logprobs[0].shape == (0,)


@pytest.mark.parametrize("loss, inputs, config", [
    ("nope", {"target_tokens": [1]}, {}),
    ("cross_entropy", {}, {}),
    ("cross_entropy", {"target_tokens": [1], "mask": [1.0]}, {}),
    ("cross_entropy", {"target_tokens": [1, 2]}, {}),
    ("cross_entropy", {"target_tokens": [1]}, {"beta": 0.1}),
    ("ppo", {"target_tokens": [1], "logprobs": [-1.0], "advantages": [1.0]},
     {"clip_low_threshold": 1.5}),
    ("dro", {"target_tokens": [1], "logprobs": [-1.0]}, {}),
])
def test_invalid_loss_requests_raise_value_error(loss, inputs, config):
    lora = perturbed_lora(seed=1)
    with pytest.raises(ValueError):
        MODEL.loss_and_grad(lora, [np.array([7])], [inputs], loss, config, True)


@pytest.mark.parametrize("loss", ["importance_sampling", "cross_entropy"])
def test_grad1_large_batch_equals_sum_of_single_datum_calls(loss):
    """A batch far larger than one internal row chunk, with masked prompt-like prefixes, sums
    exactly like datums sent one at a time (each of which the FD tests above verify)."""
    lora = perturbed_lora(seed=6)
    lengths = (700, 900, 1000, 3)
    tokens, inputs = make_batch(lora, loss, seed=31, lengths=lengths)
    for d in inputs:  # the first 40% of each datum is "prompt": zero mask / weight
        key = "weights" if loss == "cross_entropy" else "mask"
        d[key][: int(0.4 * len(d[key]))] = 0.0
    whole = MODEL.loss_and_grad(lora, tokens, inputs, loss, CONFIGS[loss], need_grad=True)
    parts = [MODEL.loss_and_grad(lora, [t], [d], loss, CONFIGS[loss], need_grad=True)
             for t, d in zip(tokens, inputs, strict=False)]
    assert whole.loss == pytest.approx(sum(p.loss for p in parts), rel=1e-11)
    for got, part in zip(whole.logprobs, parts, strict=False):
        np.testing.assert_allclose(got, part.logprobs[0], rtol=0, atol=1e-12)
    for key in lora.params:
        np.testing.assert_allclose(whole.grads[key], sum(p.grads[key] for p in parts),
                                   rtol=1e-10, atol=1e-10)
