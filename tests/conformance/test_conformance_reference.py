"""The math the conformance suite relies on, against independent references.

- LOSS-1..5 values: hand-computed cases; ∂loss/∂p: central finite differences (cispo's
  stop-gradient excepted: its derivative is the formula, not the value's slope).
- The black-box gradient probe (checks_loss): on a toy log-softmax model, the parameter
  gradient of each loss equals that of cross_entropy weighted by -∂loss/∂p (finite
  differences of both, nothing shared with the suite but the weights).
- The AdamW observables (checks_optim): a torch-style AdamW written here from the torch
  documentation shows each property the checks assert, and variants without bias correction
  or with L2-coupled decay break them (so the checks discriminate).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance.reference import dloss_dp, loss_value

P = [-1.2, -0.4, -2.5, -0.9]


def _inputs(ratios: list[float], advantages: list[float], mask: list[float] | None = None):
    q = [p - math.log(r) for p, r in zip(P, ratios, strict=False)]
    inputs = {"logprobs": q, "advantages": advantages}
    if mask is not None:
        inputs["mask"] = mask
    return inputs


def test_loss_values_by_hand() -> None:
    ce, _ = loss_value("cross_entropy", [P], [{"weights": [1, 0.5, 0, 2]}], {})
    assert ce == pytest.approx(1.2 + 0.2 + 0 + 1.8)
    inputs = _inputs([1.5, 0.5, 0.5, 1.0], [1.0, -1.0, 1.0, 2.0], [1, 1, 1, 0])
    is_loss, _ = loss_value("importance_sampling", [P], [inputs], {})
    assert is_loss == pytest.approx(-(1.5 - 0.5 + 0.5))
    # ppo: min(r·A, clip(r, 0.8, 1.2)·A): 1.2 (clipped), -0.8 (clipped), 0.5 (unclipped).
    ppo, _ = loss_value("ppo", [P], [inputs], {})
    assert ppo == pytest.approx(-(1.2 - 0.8 + 0.5))
    cispo, _ = loss_value("cispo", [P], [inputs], {})
    assert cispo == pytest.approx(-(1.2 * P[0] * 1 + 0.8 * P[1] * -1 + 0.8 * P[2] * 1))
    dro, _ = loss_value("dro", [P], [inputs], {"beta": 0.5})
    expected = -sum(m * (p * a - 0.25 * math.log(r) ** 2) for p, a, r, m in
                    zip(P, [1.0, -1.0, 1.0, 2.0], [1.5, 0.5, 0.5, 1.0], [1, 1, 1, 0], strict=False))
    assert dro == pytest.approx(expected)


def test_losses_sum_over_datums() -> None:
    one, _ = loss_value("cross_entropy", [P], [{}], {})
    two, _ = loss_value("cross_entropy", [P, P], [{}, {}], {})
    assert two == pytest.approx(2 * one)


@pytest.mark.parametrize("loss, config", [
    ("cross_entropy", {}), ("importance_sampling", {}), ("ppo", {}),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}), ("dro", {"beta": 0.3}),
])
def test_dloss_dp_matches_finite_differences(loss: str, config: dict) -> None:
    # Ratios away from the clip bounds (no kinks within the finite-difference step).
    inputs = {"weights": [1, 0.5, 2, 0]} if loss == "cross_entropy" else \
        _inputs([1.5, 0.5, 1.05, 0.95], [1.0, -1.0, -2.0, 0.5], [1, 1, 0.5, 1])
    grads = dloss_dp(loss, P, inputs, config)
    h = 1e-6
    for i in range(len(P)):
        up, down = list(P), list(P)
        up[i] += h
        down[i] -= h
        slope = (loss_value(loss, [up], [inputs], config)[0]
                 - loss_value(loss, [down], [inputs], config)[0]) / (2 * h)
        assert grads[i] == pytest.approx(slope, rel=1e-5, abs=1e-7)


def test_cispo_gradient_stops_at_the_ratio() -> None:
    inputs = _inputs([1.5, 0.5, 1.05, 0.95], [1.0, -1.0, -2.0, 0.5])
    assert dloss_dp("cispo", P, inputs, {}) == pytest.approx(
        [-1.2 * 1.0, -0.8 * -1.0, -1.05 * -2.0, -0.95 * 0.5])


# -- the gradient probe on a toy model ----------------------------------------------------
V, D = 5, 3
X_T_D = np.array([[1.0, 0.2, -0.5], [0.3, -1.0, 0.7], [-0.6, 0.4, 0.9], [0.5, 0.5, -0.2]])
TARGETS_T = np.array([1, 4, 0, 2])


def _logprobs(theta_V_D: np.ndarray) -> np.ndarray:
    logits_T_V = X_T_D @ theta_V_D.T
    logits_T_V = logits_T_V - logits_T_V.max(axis=1, keepdims=True)
    log_z_T = np.log(np.exp(logits_T_V).sum(axis=1))
    return logits_T_V[np.arange(len(TARGETS_T)), TARGETS_T] - log_z_T


def _fd_grad(f, theta: np.ndarray, h: float = 1e-6) -> np.ndarray:  # noqa: ANN001
    grad = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        up, down = theta.copy(), theta.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (f(up) - f(down)) / (2 * h)
    return grad


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "dro"])
def test_loss_gradient_equals_weighted_cross_entropy_gradient(loss: str) -> None:
    theta0 = np.random.default_rng(3).normal(size=(V, D))
    p0 = _logprobs(theta0).tolist()
    ratios, advantages = [1.5, 0.5, 1.05, 0.95], [1.0, -1.0, -2.0, 0.5]
    inputs = {"logprobs": [p - math.log(r) for p, r in zip(p0, ratios, strict=False)],
              "advantages": advantages}
    weights = [-c for c in dloss_dp(loss, p0, inputs, {})]
    loss_grad = _fd_grad(lambda t: loss_value(loss, [_logprobs(t).tolist()], [inputs], {})[0],
                         theta0)
    ce_grad = _fd_grad(lambda t: loss_value("cross_entropy", [_logprobs(t).tolist()],
                                            [{"weights": weights}], {})[0], theta0)
    assert np.allclose(loss_grad, ce_grad, rtol=1e-5, atol=1e-8)


# -- AdamW observables ----------------------------------------------------------------------
def adamw(theta, grads, *, lr, beta1, beta2, eps, wd, clip=0.0, state=None,  # noqa: ANN001
          bias_correction=True, coupled_decay=False):  # noqa: ANN201
    """torch.optim.AdamW as documented, plus clip_grad_norm_; returns (theta, state, norm)."""
    m, v, t = state or (np.zeros_like(theta), np.zeros_like(theta), 0)
    norm = float(np.linalg.norm(grads))
    g = grads * min(1.0, clip / (norm + 1e-6)) if clip > 0 else grads
    if coupled_decay:
        g = g + wd * theta
    else:
        theta = theta * (1 - lr * wd)
    t += 1
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1 ** t) if bias_correction else m
    v_hat = v / (1 - beta2 ** t) if bias_correction else v
    return theta - lr * m_hat / (np.sqrt(v_hat) + eps), (m, v, t), norm


THETA = np.random.default_rng(5).normal(size=200)
GRAD = np.random.default_rng(6).normal(size=200) * np.linspace(0.01, 1.0, 200)
G = float(np.linalg.norm(GRAD))


def _update_norm(grads=GRAD, theta=THETA, **hp) -> float:  # noqa: ANN001
    new, _, _ = adamw(theta, grads, **hp)
    return float(np.linalg.norm(new - theta))


def test_first_step_ignores_betas_only_with_bias_correction() -> None:
    base = dict(lr=1e-2, eps=1e-8, wd=0.0)
    a = _update_norm(beta1=0.9, beta2=0.999, **base)
    assert _update_norm(beta1=0.5, beta2=0.9, **base) == pytest.approx(a, rel=1e-9)
    assert _update_norm(beta1=0.0, beta2=0.0, **base) == pytest.approx(a, rel=1e-9)
    broken = _update_norm(beta1=0.5, beta2=0.9, bias_correction=False, **base)
    assert broken != pytest.approx(a, rel=1e-3)


def test_sgd_regime_momentum_and_clipping() -> None:
    eps = 1e4 * G
    lr = 0.01 * eps / G
    hp = dict(lr=lr, beta1=0.5, beta2=0.999, eps=eps, wd=0.0)
    theta1, state, norm = adamw(THETA, GRAD, **hp)
    first = float(np.linalg.norm(theta1 - THETA))
    assert norm == pytest.approx(G)
    assert first == pytest.approx(lr * G / eps, rel=1e-3)
    theta2, _, _ = adamw(theta1, np.zeros_like(GRAD), state=state, **hp)
    assert float(np.linalg.norm(theta2 - theta1)) == pytest.approx(first * 0.5 / 1.5, rel=2e-3)
    clipped = _update_norm(clip=G / 4, **hp)
    assert clipped == pytest.approx(lr * (G / 4) / eps, rel=2e-3)
    assert _update_norm(clip=4 * G, **hp) == pytest.approx(first, rel=1e-9)


def test_decoupled_decay_is_linear_in_wd_with_zero_gradient() -> None:
    zero = np.zeros_like(GRAD)
    hp = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
    a, b = _update_norm(zero, wd=0.1, **hp), _update_norm(zero, wd=0.2, **hp)
    assert a == pytest.approx(0.01 * 0.1 * np.linalg.norm(THETA))
    assert b == pytest.approx(2 * a, rel=1e-9)
    coupled_a = _update_norm(zero, wd=0.1, coupled_decay=True, **hp)
    coupled_b = _update_norm(zero, wd=0.2, coupled_decay=True, **hp)
    assert coupled_b != pytest.approx(2 * coupled_a, rel=1e-2)


def test_eps_outside_the_root_is_scale_invariant() -> None:
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, wd=0.0)
    eps = 1e-3 * G
    assert _update_norm(4 * GRAD, eps=4 * eps, **hp) == pytest.approx(
        _update_norm(GRAD, eps=eps, **hp), rel=1e-9)
