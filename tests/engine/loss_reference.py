"""The contract's loss formulas (LOSS-1..5), written out from the spec, independently of the
engine: the reference that the gradient tests of the byte and the declared models share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mock_server.engine.specs import Lora


def reference_loss(loss: str, p_list: Sequence[np.ndarray], inputs: Sequence[dict[str, Any]],
                   config: dict[str, float],
                   frozen_ratio: Sequence[np.ndarray] | None = None) -> float:
    """Σ over datums of the loss; optional inputs (weights, mask) default to 1, config keys to
    the contract's defaults. For CISPO, ``frozen_ratio`` holds sg(clip(r)) when given."""
    total = 0.0
    for i, (p, inp) in enumerate(zip(p_list, inputs, strict=True)):
        if loss == "cross_entropy":
            total += -np.sum(inp.get("weights", np.ones_like(p)) * p)
            continue
        q, adv = inp["logprobs"], inp["advantages"]
        m = inp.get("mask", np.ones_like(p))
        r = np.exp(p - q)
        lo = config.get("clip_low_threshold", 0.8)
        hi = config.get("clip_high_threshold", 1.2)
        if loss == "importance_sampling":
            total += -np.sum(m * r * adv)
        elif loss == "ppo":
            total += -np.sum(m * np.minimum(r * adv, np.clip(r, lo, hi) * adv))
        elif loss == "cispo":
            clipped = np.clip(r, lo, hi) if frozen_ratio is None else frozen_ratio[i]
            total += -np.sum(m * clipped * p * adv)
        elif loss == "dro":
            total += -np.sum(m * (p * adv - config.get("beta", 0.05) / 2 * (p - q) ** 2))
    return float(total)


def with_param(lora: Lora, key: str, value: np.ndarray) -> Lora:
    """``lora`` with one parameter replaced (for finite differences)."""
    return Lora(params={**lora.params, key: value}, rank=lora.rank, alpha=lora.alpha)
