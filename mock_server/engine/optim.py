"""AdamW with exactly ``torch.optim.AdamW`` semantics (OPT-2) and global-norm clipping (OPT-3).

Pure functions over ``dict[str, np.ndarray]``: nothing passed in is mutated, so a caller can
keep old parameter/moment dicts as immutable versions and checkpoints (VER-2, CKPT-1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["AdamWState", "adamw_step", "global_norm"]


@dataclass
class AdamWState:
    """AdamW moments per parameter name and the step count ``t`` (torch's ``state['step']``).

    A fresh state has empty dicts: missing moments are zeros, as in torch before the first step.
    """

    m: dict[str, np.ndarray] = field(default_factory=dict)
    v: dict[str, np.ndarray] = field(default_factory=dict)
    t: int = 0

    @classmethod
    def zeros_like(cls, params: dict[str, np.ndarray]) -> AdamWState:
        """Fresh state (t = 0) with explicit zero moments shaped like ``params``."""
        return cls(
            m={k: np.zeros_like(a) for k, a in params.items()},
            v={k: np.zeros_like(a) for k, a in params.items()},
            t=0,
        )

    def copy(self) -> AdamWState:
        """Deep copy (arrays copied), for checkpoints that must not alias live training state."""
        return AdamWState(
            m={k: a.copy() for k, a in self.m.items()},
            v={k: a.copy() for k, a in self.v.items()},
            t=self.t,
        )


def global_norm(arrays: dict[str, np.ndarray]) -> float:
    """L2 norm over all entries of all arrays (torch: norm of the per-tensor norms)."""
    if not arrays:
        return 0.0
    per_tensor = np.array([np.linalg.norm(a.ravel()) for a in arrays.values()])
    return float(np.linalg.norm(per_tensor))


def _lerp(start: np.ndarray, end: np.ndarray, weight: float) -> np.ndarray:
    # torch.lerp's two-branch formula, so moments match torch's to the last bit where possible.
    out: np.ndarray
    if weight < 0.5:
        out = start + weight * (end - start)
    else:
        out = end - (end - start) * (1.0 - weight)
    return out


def adamw_step(
    params: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    state: AdamWState,
    *,
    learning_rate: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    grad_clip_norm: float,
) -> tuple[dict[str, np.ndarray], AdamWState, float, float]:
    """One AdamW step; returns ``(new_params, new_state, grad_norm, update_norm)``.

    OPT-3: gradients are first clipped like ``torch.nn.utils.clip_grad_norm_`` over ALL
    parameters together: with n the global norm, every gradient is multiplied by
    ``min(1, grad_clip_norm / (n + 1e-6))`` (``grad_clip_norm == 0`` turns clipping off).
    ``grad_norm`` is n, before clipping.

    OPT-2 (torch ``_single_tensor_adamw``): t += 1; θ ← θ·(1 - lr·wd); m ← lerp(m, g, 1 - β1);
    v ← β2·v + (1 - β2)·g²; θ ← θ - (lr / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + eps).

    ``update_norm`` is the global norm of θ_new - θ_old. Inputs are never mutated.
    """
    if set(params) != set(grads):
        raise ValueError(
            f"params and grads differ in keys: {sorted(set(params) ^ set(grads))}"
        )
    for name, param in params.items():
        if grads[name].shape != param.shape:
            raise ValueError(f"grad {name!r} has shape {grads[name].shape}, param {param.shape}")

    grad_norm = global_norm(grads)
    clip_coef = 1.0
    if grad_clip_norm > 0:
        clip_coef = min(1.0, grad_clip_norm / (grad_norm + 1e-6))

    t = state.t + 1
    bias_correction1 = 1.0 - beta1**t
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**t)
    step_size = learning_rate / bias_correction1

    new_params: dict[str, np.ndarray] = {}
    new_m: dict[str, np.ndarray] = {}
    new_v: dict[str, np.ndarray] = {}
    update_sq = 0.0
    for name, param in params.items():
        g = grads[name] * clip_coef if clip_coef != 1.0 else grads[name]
        m_prev = state.m.get(name)
        v_prev = state.v.get(name)
        if m_prev is None:
            m_prev = np.zeros_like(param)
        if v_prev is None:
            v_prev = np.zeros_like(param)
        theta = param * (1.0 - learning_rate * weight_decay)
        m = _lerp(m_prev, g, 1.0 - beta1)
        v = v_prev * beta2 + (1.0 - beta2) * (g * g)
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        theta = theta - step_size * (m / denom)
        delta = theta - param
        update_sq += float(np.dot(delta.ravel(), delta.ravel()))
        new_params[name], new_m[name], new_v[name] = theta, m, v
    return new_params, AdamWState(m=new_m, v=new_v, t=t), grad_norm, math.sqrt(update_sq)
