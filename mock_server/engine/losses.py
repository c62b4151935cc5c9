"""The five contract losses (LOSS-1 .. LOSS-5) and their derivative with respect to p.

Every loss is a sum over positions (and, by the caller, over datums) with no normalisation.
With p = current logprob of the target, q = input ``logprobs``, A = ``advantages``,
r = exp(p - q), m = ``mask`` (default 1), w = ``weights`` (default 1) and sg = stop-gradient:

- LOSS-1 ``cross_entropy``       = -Σ w·p
- LOSS-2 ``importance_sampling`` = -Σ m·r·A
- LOSS-3 ``ppo``                 = -Σ m·min(r·A, clip(r, lo, hi)·A)
- LOSS-4 ``cispo``               = -Σ m·sg(clip(r, lo, hi))·p·A
- LOSS-5 ``dro``                 = -Σ m·(p·A - β/2·(p - q)²)

The model turns dL/dp into dL/dlogits = dL/dp · (onehot - softmax) and backpropagates from
there, so this module only needs the closed-form per-position dL/dp. Pure numpy, no state.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["LOSS_SPECS", "resolve_loss_config", "flatten_loss_inputs", "loss_terms"]

_RL_INPUTS: dict[str, list[str]] = {
    "required": ["target_tokens", "logprobs", "advantages"],
    "optional": ["mask"],
}
_CLIP_CONFIG: dict[str, dict[str, float]] = {
    "clip_low_threshold": {"default": 0.8, "min": 0.0, "max": 1.0},
    "clip_high_threshold": {"default": 1.2, "min": 1.0, "max": 10.0},
}

#: The ``loss_functions`` entry of the capabilities document (DISC-1), verbatim. Treat as
#: read-only: the HTTP layer validates ``loss_inputs`` / ``loss_config`` against it (LOSS-6).
LOSS_SPECS: dict[str, dict[str, Any]] = {
    "cross_entropy": {
        "inputs": {"required": ["target_tokens"], "optional": ["weights"]},
        "config": {},
    },
    "importance_sampling": {
        "inputs": {k: list(v) for k, v in _RL_INPUTS.items()},
        "config": {},
    },
    "ppo": {
        "inputs": {k: list(v) for k, v in _RL_INPUTS.items()},
        "config": {k: dict(v) for k, v in _CLIP_CONFIG.items()},
    },
    "cispo": {
        "inputs": {k: list(v) for k, v in _RL_INPUTS.items()},
        "config": {k: dict(v) for k, v in _CLIP_CONFIG.items()},
    },
    "dro": {
        "inputs": {k: list(v) for k, v in _RL_INPUTS.items()},
        "config": {"beta": {"default": 0.05, "min": 0.0, "max": 100.0}},
    },
}


def resolve_loss_config(loss_function: str, loss_config: dict[str, float]) -> dict[str, float]:
    """Return ``loss_config`` with every declared key present (defaults filled in).

    Raises ``ValueError`` for an unknown loss, an unknown key or a value outside [min, max];
    the HTTP layer normally rejects those first (LOSS-6), this is the last line of defence.
    """
    if loss_function not in LOSS_SPECS:
        raise ValueError(f"unsupported loss function {loss_function!r}")
    declared = LOSS_SPECS[loss_function]["config"]
    unknown = sorted(set(loss_config) - set(declared))
    if unknown:
        raise ValueError(f"loss {loss_function!r} has no config key(s) {unknown}")
    resolved: dict[str, float] = {}
    for key, bounds in declared.items():
        value = float(loss_config.get(key, bounds["default"]))
        if not (bounds["min"] <= value <= bounds["max"]):
            raise ValueError(
                f"loss_config.{key}={value} outside [{bounds['min']}, {bounds['max']}]"
            )
        resolved[key] = value
    return resolved


def flatten_loss_inputs(
    loss_function: str,
    token_ids: Sequence[Any],
    loss_inputs: Sequence[dict[str, Any]],
) -> tuple[list[Any], dict[str, np.ndarray]]:
    """Check each datum's inputs against ``LOSS_SPECS`` and concatenate the float ones.

    Returns the per-datum ``target_tokens`` (unconverted) and every float input flattened over
    all datums. An optional input absent from every datum is left out (``loss_terms`` uses
    its default 1); one given for some datums only is 1 on the others.
    Raises ``ValueError`` for a missing or undeclared input or a wrong length.
    """
    if loss_function not in LOSS_SPECS:
        raise ValueError(f"unsupported loss function {loss_function!r}")
    spec = LOSS_SPECS[loss_function]["inputs"]
    declared = set(spec["required"]) | set(spec["optional"])
    if len(loss_inputs) != len(token_ids):
        raise ValueError("loss_inputs and token_ids differ in length")
    float_names = sorted(declared - {"target_tokens"})
    targets: list[Any] = []
    parts: dict[str, list[np.ndarray | None]] = {name: [] for name in float_names}
    for i, (tokens, inputs) in enumerate(zip(token_ids, loss_inputs)):
        missing = set(spec["required"]) - set(inputs)
        extra = set(inputs) - declared
        if missing or extra:
            raise ValueError(
                f"datum {i}: missing inputs {sorted(missing)}, undeclared inputs {sorted(extra)}"
            )
        for name, values in inputs.items():
            if len(values) != len(tokens):
                raise ValueError(
                    f"datum {i}: {name} has {len(values)} entries, token_ids {len(tokens)}"
                )
        targets.append(inputs["target_tokens"])
        for name in float_names:
            given = inputs.get(name)
            parts[name].append(None if given is None else np.asarray(given, np.float64))
    flat_inputs: dict[str, np.ndarray] = {}
    for name in float_names:
        if name in spec["optional"] and all(part is None for part in parts[name]):
            continue
        flat_inputs[name] = np.concatenate(
            [np.ones(len(tokens)) if part is None else part
             for part, tokens in zip(parts[name], token_ids)] + [np.zeros(0)]
        )
    return targets, flat_inputs


def loss_terms(
    loss_function: str,
    logprobs_N: np.ndarray,
    inputs: dict[str, np.ndarray],
    config: dict[str, float],
) -> tuple[float, np.ndarray]:
    """Loss (summed over the N flattened positions) and dL/dp per position.

    ``inputs`` holds the float loss inputs (everything but ``target_tokens``) flattened to N;
    optional ones may be absent. ``config`` must come from :func:`resolve_loss_config`.
    Positions whose multiplier (m, w, or m·A for the ratio losses) is exactly zero contribute
    exactly zero, even where r = exp(p - q) overflows.
    """
    p_N = logprobs_N
    if loss_function == "cross_entropy":
        w_N = inputs.get("weights")
        if w_N is None:
            return float(-p_N.sum()), np.full_like(p_N, -1.0)
        return float(-(w_N * p_N).sum()), -w_N

    q_N = inputs["logprobs"]
    adv_N = inputs["advantages"]
    mask_N = inputs.get("mask")
    if mask_N is None:
        mask_N = np.ones_like(p_N)

    with np.errstate(over="ignore", invalid="ignore"):
        if loss_function == "dro":
            beta = config["beta"]
            diff_N = p_N - q_N
            live_N = mask_N != 0
            term_N = np.where(live_N, mask_N * (p_N * adv_N - 0.5 * beta * diff_N * diff_N), 0.0)
            grad_N = np.where(live_N, -mask_N * (adv_N - beta * diff_N), 0.0)
            return float(-term_N.sum()), grad_N

        live_N = (mask_N != 0) & (adv_N != 0)
        ratio_N = np.exp(p_N - q_N)
        m_adv_N = mask_N * adv_N
        if loss_function == "importance_sampling":
            obj_N = ratio_N * m_adv_N
            grad_N = -obj_N
        elif loss_function in ("ppo", "cispo"):
            lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
            clipped_N = np.clip(ratio_N, lo, hi)
            if loss_function == "ppo":
                unclipped_obj_N = ratio_N * adv_N
                clipped_obj_N = clipped_N * adv_N
                # min() picks the unclipped branch (gradient r·A) or the clipped one, whose
                # gradient is zero wherever it is strictly smaller (r outside [lo, hi]).
                takes_unclipped_N = unclipped_obj_N <= clipped_obj_N
                obj_N = mask_N * np.minimum(unclipped_obj_N, clipped_obj_N)
                grad_N = np.where(takes_unclipped_N, -ratio_N * m_adv_N, 0.0)
            else:
                obj_N = clipped_N * p_N * m_adv_N
                grad_N = -clipped_N * m_adv_N
        else:
            raise ValueError(f"unsupported loss function {loss_function!r}")
        obj_N = np.where(live_N, obj_N, 0.0)
        grad_N = np.where(live_N, grad_N, 0.0)
    return float(-obj_N.sum()), grad_N
