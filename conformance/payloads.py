"""Tiny request payloads (a real endpoint bills per token: every datum here is a few tokens).

A datum's position i predicts ``target_tokens[i]`` from ``token_ids[:i+1]``, so a text of
n tokens gives a datum of n - 1 positions: inputs ``tokens[:-1]``, targets ``tokens[1:]``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

__all__ = ["ce_datum", "rl_datum", "with_inputs", "loss_body", "sampling", "adamw"]


def ce_datum(tokens: Sequence[int], weights: Sequence[float] | None = None) -> dict[str, Any]:
    """A ``cross_entropy`` datum scoring ``tokens[1:]`` after ``tokens[:-1]``."""
    loss_inputs: dict[str, Any] = {"target_tokens": list(tokens[1:])}
    if weights is not None:
        loss_inputs["weights"] = list(weights)
    return {"model_input": {"token_ids": list(tokens[:-1])}, "loss_inputs": loss_inputs}


def rl_datum(tokens: Sequence[int], logprobs: Sequence[float], advantages: Sequence[float],
             mask: Sequence[float] | None = None) -> dict[str, Any]:
    """A datum for the RL losses (importance_sampling, ppo, cispo, dro)."""
    loss_inputs: dict[str, Any] = {"target_tokens": list(tokens[1:]),
                                   "logprobs": list(logprobs), "advantages": list(advantages)}
    if mask is not None:
        loss_inputs["mask"] = list(mask)
    return {"model_input": {"token_ids": list(tokens[:-1])}, "loss_inputs": loss_inputs}


def with_inputs(datum: dict[str, Any], **loss_inputs: Any) -> dict[str, Any]:
    """A copy of ``datum`` with ``loss_inputs`` replaced/added (None removes a key)."""
    out = copy.deepcopy(datum)
    for key, value in loss_inputs.items():
        if value is None:
            out["loss_inputs"].pop(key, None)
        else:
            out["loss_inputs"][key] = value
    return out


def loss_body(data: Sequence[dict[str, Any]], loss: str = "cross_entropy",
              config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of ``forward`` / ``forward_backward`` (without ``seq``)."""
    return {"loss_function": loss, "loss_config": dict(config or {}), "data": list(data)}


def sampling(max_tokens: int = 6, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             **extra: Any) -> dict[str, Any]:
    return {"max_tokens": max_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            **extra}


def adamw(**overrides: Any) -> dict[str, Any]:
    base = {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
            "weight_decay": 0.0, "grad_clip_norm": 0.0}
    return {**base, **overrides}
