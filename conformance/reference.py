"""Independent reference math: the contract's loss formulas and their per-position gradients.

Written from the contract text (LOSS-1..5), not from any server code. p = current logprob of
the target (returned by ``forward``), q = input ``logprobs``, A = ``advantages``,
r = exp(p - q), m = ``mask`` (default 1), w = ``weights`` (default 1), sg = stop-gradient.
Losses are sums over positions and datums, never means.

``dloss_dp`` gives ∂loss/∂p per position. The parameter gradient of any of these losses is
Σ_i ∂loss/∂p_i · ∇θ p_i, so two losses with the same ∂loss/∂p on the same tokens have the
same parameter gradient. The suite uses that to check gradients black-box: a loss must move
the weights exactly as ``cross_entropy`` with ``weights = -∂loss/∂p`` does (see
``checks/losses.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_CONFIG", "loss_value", "dloss_dp", "clip"]

DEFAULT_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
}


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _column(inputs: dict[str, Sequence[float]], name: str, n: int, default: float) -> list[float]:
    values = inputs.get(name)
    return [float(v) for v in values] if values is not None else [default] * n


def _terms(loss: str, p: Sequence[float], inputs: dict[str, Any], config: dict[str, float]
           ) -> tuple[list[float], list[float]]:
    """(loss term, ∂term/∂p) per position for one datum."""
    n = len(p)
    cfg = {**DEFAULT_CONFIG[loss], **config}
    if loss == "cross_entropy":
        w = _column(inputs, "weights", n, 1.0)
        return [-wi * pi for wi, pi in zip(w, p, strict=False)], [-wi for wi in w]
    q = _column(inputs, "logprobs", n, 0.0)
    a = _column(inputs, "advantages", n, 0.0)
    m = _column(inputs, "mask", n, 1.0)
    terms, grads = [], []
    for pi, qi, ai, mi in zip(p, q, a, m, strict=False):
        r = math.exp(pi - qi)
        if loss == "importance_sampling":
            terms.append(-mi * r * ai)
            grads.append(-mi * r * ai)
        elif loss == "ppo":
            lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
            unclipped, clipped = r * ai, clip(r, lo, hi) * ai
            terms.append(-mi * min(unclipped, clipped))
            # Inside [lo, hi] both branches are r·A with the same derivative; outside, the
            # minimum is either the unclipped branch (derivative r·A) or a constant.
            grads.append(-mi * r * ai if unclipped <= clipped else 0.0)
        elif loss == "cispo":
            lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
            weight = clip(r, lo, hi)
            terms.append(-mi * weight * pi * ai)
            grads.append(-mi * weight * ai)
        elif loss == "dro":
            beta = cfg["beta"]
            terms.append(-mi * (pi * ai - beta / 2.0 * (pi - qi) ** 2))
            grads.append(-mi * (ai - beta * (pi - qi)))
        else:
            raise ValueError(f"no reference formula for loss {loss!r}")
    return terms, grads


def loss_value(loss: str, p_per_datum: Sequence[Sequence[float]],
               inputs_per_datum: Sequence[dict[str, Any]], config: dict[str, float]
               ) -> tuple[float, float]:
    """(Σ over datums and positions of the loss terms, Σ |term|) — the second is the scale
    used for the comparison tolerance."""
    total, scale = 0.0, 0.0
    for p, inputs in zip(p_per_datum, inputs_per_datum, strict=False):
        terms, _ = _terms(loss, p, inputs, config)
        total += math.fsum(terms)
        scale += math.fsum(abs(t) for t in terms)
    return total, scale


def dloss_dp(loss: str, p: Sequence[float], inputs: dict[str, Any],
             config: dict[str, float]) -> list[float]:
    """∂loss/∂p_i for one datum."""
    return _terms(loss, p, inputs, config)[1]
