"""LOSS-1..5 and GRAD-1 at every vocabulary size: loss values against the contract formulas
and gradients against central finite differences, for every loss and every LoRA matrix
(A and B of mixer and lm_head, whose B is (K, r))."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import CASES, perturbed_lora
from loss_reference import reference_loss, with_param

from mock_server.engine.specs import Lora

LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
CONFIGS = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25},
    "cispo": {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25},
    "dro": {"beta": 0.3},
}


def ratio_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ratios r = exp(p - q) below, inside and above [0.75, 1.25], away from the kinks."""
    bands = np.array([(0.4, 0.7), (0.8, 1.2), (1.3, 2.2)])[rng.integers(0, 3, n)]
    return rng.uniform(bands[:, 0], bands[:, 1])


def make_batch(case, lora: Lora, loss: str, seed: int, lengths=(6, 11, 1)):
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, case.vocab, n) for n in lengths]
    targets = [rng.integers(0, case.vocab, n) for n in lengths]
    # Aim some targets at EOS / BOS (singleton buckets) and at the ends of the range.
    targets[1][:4] = [case.spec.eos_token_id, case.spec.special_token_ids[-1], 0,
                      case.vocab - 1]
    p_now = case.model.forward(lora, tokens, targets)
    inputs = []
    for tgt, p in zip(targets, p_now, strict=False):
        n = len(tgt)
        if loss == "cross_entropy":
            inputs.append({"target_tokens": tgt.astype(np.float64),
                           "weights": rng.choice([0.0, 0.5, 1.0, 2.0], n)})
        else:
            inputs.append({"target_tokens": tgt, "logprobs": p - np.log(ratio_values(rng, n)),
                           "advantages": rng.standard_normal(n),
                           "mask": rng.choice([0.0, 1.0, 0.5], n, p=[0.2, 0.6, 0.2])})
    return tokens, inputs


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_match_central_finite_differences(case, loss):
    model = case.model
    lora = perturbed_lora(model, seed=LOSSES.index(loss))
    config = CONFIGS[loss]
    tokens, inputs = make_batch(case, lora, loss, seed=31 + LOSSES.index(loss))
    targets = [np.asarray(d["target_tokens"]).astype(np.int64) for d in inputs]
    result = model.loss_and_grad(lora, tokens, inputs, loss, config, need_grad=True)
    p_list = model.forward(lora, tokens, targets)
    assert result.loss == pytest.approx(reference_loss(loss, p_list, inputs, config),
                                        rel=1e-12, abs=1e-12)
    for got, want in zip(result.logprobs, p_list, strict=False):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    frozen = None
    if loss == "cispo":
        frozen = [np.clip(np.exp(p - d["logprobs"]), 0.75, 1.25)
                  for p, d in zip(p_list, inputs, strict=False)]

    def objective(candidate: Lora) -> float:
        return reference_loss(loss, model.forward(candidate, tokens, targets), inputs, config,
                              frozen)

    assert result.grads is not None and set(result.grads) == set(lora.params)
    rng = np.random.default_rng(7)
    h = 1e-5
    for key, base in lora.params.items():
        grad = result.grads[key]
        assert grad.shape == base.shape and np.abs(grad).max() > 0, key
        directions = []
        for _ in range(4):
            direction = np.zeros_like(base)
            direction[tuple(rng.integers(0, s) for s in base.shape)] = 1.0
            directions.append(direction)
        directions.append(rng.standard_normal(base.shape))
        for direction in directions:
            numeric = (objective(with_param(lora, key, base + h * direction))
                       - objective(with_param(lora, key, base - h * direction))) / (2 * h)
            analytic = float(np.sum(grad * direction))
            assert abs(numeric - analytic) <= 1e-6 + 1e-6 * abs(analytic), (key, numeric,
                                                                             analytic)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_grad1_forward_backward_is_additive_over_datums(case):
    model = case.model
    lora = perturbed_lora(model, seed=4)
    tokens, inputs = make_batch(case, lora, "ppo", seed=23, lengths=(9, 5, 14, 7))
    whole = model.loss_and_grad(lora, tokens, inputs, "ppo", {}, need_grad=True)
    first = model.loss_and_grad(lora, tokens[:2], inputs[:2], "ppo", {}, need_grad=True)
    second = model.loss_and_grad(lora, tokens[2:], inputs[2:], "ppo", {}, need_grad=True)
    assert whole.loss == pytest.approx(first.loss + second.loss, rel=1e-12, abs=1e-12)
    assert whole.grads and first.grads and second.grads
    for key in lora.params:
        np.testing.assert_allclose(whole.grads[key], first.grads[key] + second.grads[key],
                                   rtol=1e-10, atol=1e-12)
