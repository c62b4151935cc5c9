"""The seed's shared advantage and datum helpers, under the seed's names.

Conventions (they match the contract's Datum and losses LOSS-1..5):

* **Next-token shift.** For prompt ``P`` and completion ``C`` a datum has
  ``token_ids = (P + C)[:-1]`` and ``target_tokens = (P + C)[1:]``: position ``i`` predicts
  ``target_tokens[i]`` from ``token_ids[:i+1]``, and every loss input has ``len(token_ids)``
  entries.
* **Prompt positions are masked.** The first ``len(P) - 1`` positions predict prompt tokens:
  ``mask`` 0, ``advantages`` 0, ``logprobs`` 0 there. The last ``len(C)`` positions predict the
  completion: ``mask`` 1, ``advantages`` A, ``logprobs`` the sampler's logprobs (VER-3). The
  mask matters for ``dro``, whose ``β/2·(p - q)²`` term is non-zero even where A is 0.
* **Advantages.** Mean-centred within the group; with ``normalize_std`` divided by the
  *population* standard deviation (ddof 0, so normalised advantages have unit population std)
  floored at ``STD_EPS``. A group whose rewards are equal within ``UNIFORM_RTOL`` of the reward
  scale gets advantages that are exactly ``0.0``, so :func:`all_zero` is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "STD_EPS",
    "UNIFORM_RTOL",
    "is_uniform",
    "group_mean_advantages",
    "leave_one_out_advantages",
    "all_zero",
    "rl_datum",
    "forward_backward_payload",
]

STD_EPS = 1e-6
UNIFORM_RTOL = 1e-9


def _rewards_array(rewards: Sequence[float]) -> np.ndarray:
    rewards_G = np.asarray(rewards, dtype=np.float64)
    if rewards_G.ndim != 1 or rewards_G.size == 0:
        raise ValueError("rewards must be a non-empty flat sequence of numbers")
    if not np.all(np.isfinite(rewards_G)):
        raise ValueError(f"rewards must be finite, got {rewards_G.tolist()}")
    return rewards_G


def is_uniform(rewards: Sequence[float]) -> bool:
    """True when the group carries no signal: ``max - min <= UNIFORM_RTOL * max|r|``.

    The tolerance is relative to the reward scale, so rewards computed as ``0.1 + 0.2`` and
    ``0.3`` count as equal while rewards ``1e-12`` and ``2e-12`` do not.
    """
    return _is_uniform(_rewards_array(rewards))


def _is_uniform(rewards_G: np.ndarray) -> bool:
    spread = float(rewards_G.max() - rewards_G.min())
    return spread <= UNIFORM_RTOL * float(np.abs(rewards_G).max())


def group_mean_advantages(rewards: Sequence[float], normalize_std: bool = False) -> list[float]:
    """GRPO advantages of one group: ``r - mean(r)``, optionally ``/ max(std(r), STD_EPS)``.

    ``std`` is the population standard deviation (ddof 0). A uniform group (:func:`is_uniform`)
    gives exactly ``[0.0, ...]`` with or without normalisation. Shifting every reward by a
    constant leaves the advantages unchanged; permuting the rewards permutes them.
    """
    rewards_G = _rewards_array(rewards)
    if _is_uniform(rewards_G):
        return [0.0] * rewards_G.size
    advantages_G = rewards_G - rewards_G.mean()
    if normalize_std:
        advantages_G = advantages_G / max(float(advantages_G.std()), STD_EPS)
    return [float(advantage) for advantage in advantages_G]


def leave_one_out_advantages(rewards: Sequence[float]) -> list[float]:
    """RLOO advantages: ``r_i - mean_{j != i} r_j``, which equals ``G/(G-1) · (r_i - mean(r))``.

    Needs at least two rewards; a uniform group gives exactly ``[0.0, ...]``.
    """
    rewards_G = _rewards_array(rewards)
    group_size = rewards_G.size
    if group_size < 2:
        raise ValueError("leave-one-out needs a group of at least 2 samples")
    if _is_uniform(rewards_G):
        return [0.0] * group_size
    baselines_G = (rewards_G.sum() - rewards_G) / (group_size - 1)
    return [float(advantage) for advantage in rewards_G - baselines_G]


def all_zero(advantages: Sequence[float]) -> bool:
    """True when every advantage is exactly zero (the helpers above produce exact zeros)."""
    return all(float(advantage) == 0.0 for advantage in advantages)


def rl_datum(
    prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    logprobs: Sequence[float],
    advantage: float,
) -> dict[str, Any]:
    """One policy-gradient Datum for the ``importance_sampling``/``ppo``/``cispo``/``dro`` losses.

    ``logprobs`` are the sampler's logprobs of ``completion_tokens`` (one each, SAMPLE-1). See
    the module docstring for the shift and the masking. Returns
    ``{"model_input": {"token_ids"}, "loss_inputs": {"target_tokens", "logprobs",
    "advantages", "mask"}}``, every list of length ``len(prompt) + len(completion) - 1``.
    """
    if len(prompt_tokens) < 1:
        raise ValueError("the prompt needs at least one token (e.g. BOS) to predict from")
    if len(completion_tokens) < 1:
        raise ValueError("the completion is empty: there is nothing to train on")
    if len(logprobs) != len(completion_tokens):
        raise ValueError(
            f"{len(logprobs)} logprobs for {len(completion_tokens)} completion tokens"
        )
    if not math.isfinite(advantage):
        raise ValueError(f"advantage must be finite, got {advantage}")
    tokens = [int(token) for token in prompt_tokens] + [int(token) for token in completion_tokens]
    num_prompt_positions = len(prompt_tokens) - 1
    num_completion = len(completion_tokens)
    return {
        "model_input": {"token_ids": tokens[:-1]},
        "loss_inputs": {
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * num_prompt_positions + [float(lp) for lp in logprobs],
            "advantages": [0.0] * num_prompt_positions + [float(advantage)] * num_completion,
            "mask": [0.0] * num_prompt_positions + [1.0] * num_completion,
        },
    }


def forward_backward_payload(
    data: Sequence[dict[str, Any]],
    loss_function: str,
    loss_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``forward_backward`` body without ``seq``: ``loss_config`` defaults to ``{}``
    (the contract requires the key; ``{}`` means the server's declared config defaults)."""
    if not data:
        raise ValueError("a forward_backward payload needs at least one datum")
    return {
        "loss_function": loss_function,
        "loss_config": dict(loss_config or {}),
        "data": list(data),
    }
