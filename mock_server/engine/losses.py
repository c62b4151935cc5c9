"""The five contract losses (LOSS-1 .. LOSS-5): one table, ``LOSSES``, from which the
capabilities document (DISC-1), the request rules (LOSS-6) and the math all read.

Every loss is a sum over positions (and, by the caller, over datums) with no normalisation.
With p = current logprob of the target, q = input ``logprobs``, A = ``advantages``,
r = exp(p - q), m = ``mask`` (default 1), w = ``weights`` (default 1) and sg = stop-gradient:

- LOSS-1 ``cross_entropy``       = -Σ w·p
- LOSS-2 ``importance_sampling`` = -Σ m·r·A
- LOSS-3 ``ppo``                 = -Σ m·min(r·A, clip(r, lo, hi)·A)
- LOSS-4 ``cispo``               = -Σ m·sg(clip(r, lo, hi))·p·A
- LOSS-5 ``dro``                 = -Σ m·(p·A - β/2·(p - q)²)

The model turns dL/dp into dL/dlogits = dL/dp · (onehot - softmax) and backpropagates from
there, so a loss only supplies its closed-form per-position dL/dp. Pure numpy, no state.

The rules a loss request must follow (known loss, declared inputs and config keys, config
values in range, one input value per token) are written once, here: the backend calls
:func:`resolve_loss_config` and :func:`check_inputs` at submission and turns a
:class:`LossRequestError` into the contract's 422; the model calls the same functions on its
own inputs, so a direct caller meets the same rules with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["LOSSES", "LOSS_SPECS", "Bound", "Loss", "LossRequestError", "check_inputs",
           "flatten_loss_inputs", "loss_terms", "resolve_loss_config"]

#: ``terms(p_N, inputs, config) -> (loss summed over N, dL/dp_N)``: ``inputs`` holds the float
#: loss inputs flattened to N (optional ones may be absent), ``config`` is fully resolved.
Terms = Callable[[np.ndarray, Mapping[str, np.ndarray], Mapping[str, float]],
                 tuple[float, np.ndarray]]


@dataclass(frozen=True)
class Bound:
    """One ``loss_config`` key: its contract default and inclusive range."""

    default: float
    min: float
    max: float


@dataclass(frozen=True)
class Loss:
    """One contract loss: the inputs and config it declares (its DISC-1 entry) and its math."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    config: Mapping[str, Bound]
    terms: Terms

    @property
    def declared(self) -> frozenset[str]:
        return frozenset(self.required) | frozenset(self.optional)

    def capabilities_entry(self) -> dict[str, Any]:
        """The ``loss_functions[name]`` object of the capabilities document (DISC-1)."""
        return {
            "inputs": {"required": list(self.required), "optional": list(self.optional)},
            "config": {key: {"default": b.default, "min": b.min, "max": b.max}
                       for key, b in self.config.items()},
        }


def _cross_entropy(p_N: np.ndarray, inputs: Mapping[str, np.ndarray],
                   config: Mapping[str, float]) -> tuple[float, np.ndarray]:
    w_N = inputs.get("weights")
    if w_N is None:
        return float(-p_N.sum()), np.full_like(p_N, -1.0)
    return float(-(w_N * p_N).sum()), -w_N


def _dro(p_N: np.ndarray, inputs: Mapping[str, np.ndarray],
         config: Mapping[str, float]) -> tuple[float, np.ndarray]:
    q_N, adv_N = inputs["logprobs"], inputs["advantages"]
    mask_N = inputs.get("mask")
    if mask_N is None:
        mask_N = np.ones_like(p_N)
    beta = config["beta"]
    with np.errstate(over="ignore", invalid="ignore"):
        diff_N = p_N - q_N
        live_N = mask_N != 0
        term_N = np.where(live_N, mask_N * (p_N * adv_N - 0.5 * beta * diff_N * diff_N), 0.0)
        grad_N = np.where(live_N, -mask_N * (adv_N - beta * diff_N), 0.0)
    return float(-term_N.sum()), grad_N


#: ``objective(p_N, ratio_N, adv_N, mask_N, config) -> (objective_N, dL/dp_N)`` of a ratio loss.
Objective = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Mapping[str, float]],
                     tuple[np.ndarray, np.ndarray]]


def _ratio_loss(objective: Objective) -> Terms:
    """A loss of r = exp(p - q): positions whose m·A is exactly zero contribute exactly zero,
    even where r overflows."""

    def terms(p_N: np.ndarray, inputs: Mapping[str, np.ndarray],
              config: Mapping[str, float]) -> tuple[float, np.ndarray]:
        q_N, adv_N = inputs["logprobs"], inputs["advantages"]
        mask_N = inputs.get("mask")
        if mask_N is None:
            mask_N = np.ones_like(p_N)
        with np.errstate(over="ignore", invalid="ignore"):
            live_N = (mask_N != 0) & (adv_N != 0)
            ratio_N = np.exp(p_N - q_N)
            obj_N, grad_N = objective(p_N, ratio_N, adv_N, mask_N, config)
            obj_N = np.where(live_N, obj_N, 0.0)
            grad_N = np.where(live_N, grad_N, 0.0)
        return float(-obj_N.sum()), grad_N

    return terms


def _importance_sampling(p_N: np.ndarray, ratio_N: np.ndarray, adv_N: np.ndarray,
                         mask_N: np.ndarray, config: Mapping[str, float]
                         ) -> tuple[np.ndarray, np.ndarray]:
    obj_N = ratio_N * (mask_N * adv_N)
    return obj_N, -obj_N


def _ppo(p_N: np.ndarray, ratio_N: np.ndarray, adv_N: np.ndarray, mask_N: np.ndarray,
         config: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    clipped_N = np.clip(ratio_N, config["clip_low_threshold"], config["clip_high_threshold"])
    unclipped_obj_N = ratio_N * adv_N
    clipped_obj_N = clipped_N * adv_N
    # min() picks the unclipped branch (gradient r·A) or the clipped one, whose gradient is
    # zero wherever it is strictly smaller (r outside [lo, hi]).
    takes_unclipped_N = unclipped_obj_N <= clipped_obj_N
    obj_N = mask_N * np.minimum(unclipped_obj_N, clipped_obj_N)
    return obj_N, np.where(takes_unclipped_N, -ratio_N * (mask_N * adv_N), 0.0)


def _cispo(p_N: np.ndarray, ratio_N: np.ndarray, adv_N: np.ndarray, mask_N: np.ndarray,
           config: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    clipped_N = np.clip(ratio_N, config["clip_low_threshold"], config["clip_high_threshold"])
    m_adv_N = mask_N * adv_N
    return clipped_N * p_N * m_adv_N, -clipped_N * m_adv_N


_RL_REQUIRED = ("target_tokens", "logprobs", "advantages")
_CLIP = {"clip_low_threshold": Bound(default=0.8, min=0.0, max=1.0),
         "clip_high_threshold": Bound(default=1.2, min=1.0, max=10.0)}

#: The contract's losses, in the order the capabilities document lists them.
LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(("target_tokens",), ("weights",), {}, _cross_entropy),
    "importance_sampling": Loss(_RL_REQUIRED, ("mask",), {}, _ratio_loss(_importance_sampling)),
    "ppo": Loss(_RL_REQUIRED, ("mask",), _CLIP, _ratio_loss(_ppo)),
    "cispo": Loss(_RL_REQUIRED, ("mask",), _CLIP, _ratio_loss(_cispo)),
    "dro": Loss(_RL_REQUIRED, ("mask",), {"beta": Bound(default=0.05, min=0.0, max=100.0)},
                _dro),
}

#: The ``loss_functions`` object of the capabilities document (DISC-1), derived from
#: ``LOSSES``. Treat as read-only.
LOSS_SPECS: dict[str, dict[str, Any]] = {
    name: loss.capabilities_entry() for name, loss in LOSSES.items()}


class LossRequestError(ValueError):
    """A loss request that ``LOSSES`` does not allow (LOSS-6).

    ``kind``: ``"unsupported"`` (no such loss), ``"unexpected_input"`` (an input the loss does
    not declare) or ``"invalid"`` (anything else); ``loc`` is the dotted path of the offending
    part of the request body, ``details`` what the contract's 422 envelope reports.
    """

    def __init__(self, message: str, *,
                 kind: Literal["unsupported", "unexpected_input", "invalid"] = "invalid",
                 loc: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.loc = loc
        self.details = details


def _loss(loss_function: str) -> Loss:
    loss = LOSSES.get(loss_function)
    if loss is None:
        raise LossRequestError(f"loss_function {loss_function!r} is not supported",
                               kind="unsupported", supported=sorted(LOSSES))
    return loss


def resolve_loss_config(loss_function: str, loss_config: Mapping[str, float]) -> dict[str, float]:
    """``loss_config`` with every declared key present (defaults filled in), as floats.

    Raises :class:`LossRequestError` for an unknown loss, a value outside [min, max] or an
    undeclared key (in that order).
    """
    loss = _loss(loss_function)
    resolved: dict[str, float] = {}
    for key, bound in loss.config.items():
        value = loss_config.get(key, bound.default)
        if not bound.min <= value <= bound.max:
            raise LossRequestError(f"loss_config.{key} = {value} is outside "
                                   f"[{bound.min}, {bound.max}]", loc=f"loss_config.{key}")
        resolved[key] = float(value)
    unknown = sorted(set(loss_config) - set(loss.config))
    if unknown:
        raise LossRequestError(f"loss_config key(s) {unknown} are not defined for "
                               f"{loss_function}", loc="loss_config", keys=unknown)
    return resolved


def check_inputs(loss_function: str, inputs: Mapping[str, Sized], length: int,
                 where: str) -> None:
    """One datum's ``loss_inputs`` (at ``where``, e.g. ``data[0]``) against the loss: no
    undeclared input, every required one, and one value per token (``length`` tokens)."""
    loss = _loss(loss_function)
    unexpected = sorted(set(inputs) - loss.declared)
    if unexpected:
        raise LossRequestError(f"{where}.loss_inputs {unexpected} are not inputs of "
                               f"{loss_function}", kind="unexpected_input",
                               loc=f"{where}.loss_inputs", inputs=unexpected)
    missing = [name for name in loss.required if name not in inputs]
    if missing:
        raise LossRequestError(f"{where}.loss_inputs is missing {missing}",
                               loc=f"{where}.loss_inputs", missing=missing)
    for name, values in inputs.items():
        if len(values) != length:
            raise LossRequestError(f"{where}.loss_inputs.{name} has {len(values)} entries, "
                                   f"token_ids has {length}", loc=f"{where}.loss_inputs.{name}")


def flatten_loss_inputs(
    loss_function: str,
    token_ids: Sequence[Sized],
    loss_inputs: Sequence[Mapping[str, Any]],
) -> tuple[list[Any], dict[str, np.ndarray]]:
    """Check each datum's inputs (:func:`check_inputs`) and concatenate the float ones.

    Returns the per-datum ``target_tokens`` (unconverted) and every float input flattened over
    all datums. An optional input absent from every datum is left out (the loss uses its
    default 1); one given for some datums only is 1 on the others.
    """
    loss = _loss(loss_function)
    if len(loss_inputs) != len(token_ids):
        raise ValueError("loss_inputs and token_ids differ in length")
    float_names = sorted(loss.declared - {"target_tokens"})
    targets: list[Any] = []
    parts: dict[str, list[np.ndarray | None]] = {name: [] for name in float_names}
    for i, (tokens, inputs) in enumerate(zip(token_ids, loss_inputs, strict=True)):
        check_inputs(loss_function, inputs, len(tokens), f"data[{i}]")
        targets.append(inputs["target_tokens"])
        for name in float_names:
            given = inputs.get(name)
            parts[name].append(None if given is None else np.asarray(given, np.float64))
    flat_inputs: dict[str, np.ndarray] = {}
    for name in float_names:
        if name in loss.optional and all(part is None for part in parts[name]):
            continue
        flat_inputs[name] = np.concatenate(
            [np.ones(len(tokens)) if part is None else part
             for part, tokens in zip(parts[name], token_ids, strict=True)] + [np.zeros(0)]
        )
    return targets, flat_inputs


def loss_terms(
    loss_function: str,
    logprobs_N: np.ndarray,
    inputs: Mapping[str, np.ndarray],
    config: Mapping[str, float],
) -> tuple[float, np.ndarray]:
    """Loss (summed over the N flattened positions) and dL/dp per position.

    ``inputs`` and ``config`` come from :func:`flatten_loss_inputs` and
    :func:`resolve_loss_config`. Positions whose multiplier (m, w, or m·A for the ratio losses)
    is exactly zero contribute exactly zero, even where r = exp(p - q) overflows.
    """
    return _loss(loss_function).terms(logprobs_N, inputs, config)
