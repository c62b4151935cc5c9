"""Vectorised token sampling: temperature, top-k, top-p, stop tokens (SAMPLE-1, VER-3, VER-4).

The model supplies the first next-token logits and a ``step`` callback that advances all rows
by one chosen token; this module owns the truncation rules and the stop/length bookkeeping.
All ``num_samples`` rows advance together (arrays ``_S_V``); the only loop is over time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["SampledSequence", "make_rng", "truncated_probs", "draw", "log_softmax", "sample_rows"]


@dataclass(frozen=True)
class SampledSequence:
    """One completion: ``tokens`` (int64), their temperature-1 ``logprobs`` (VER-3), and
    ``stop_reason`` "stop" (last token is a stop token) or "length" (``max_tokens`` reached)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    stop_reason: str


def make_rng(seed: int | None) -> np.random.Generator:
    """``default_rng(seed)``; any int is accepted (reduced mod 2**64); None = fresh entropy."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(seed) % (1 << 64))


def log_softmax(logits_S_V: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax (a new array)."""
    shifted_S_V = logits_S_V - logits_S_V.max(axis=-1, keepdims=True)
    return shifted_S_V - np.log(np.exp(shifted_S_V).sum(axis=-1, keepdims=True))


def truncated_probs(
    logits_S_V: np.ndarray, *, temperature: float, top_k: int, top_p: float
) -> np.ndarray:
    """Unnormalised sampling weights after temperature, then top-k, then top-p.

    - temperature: logits / temperature (> 0).
    - top-k (0 = off): tokens whose tempered logit is below the k-th largest get weight 0
      (ties with the k-th are kept, as in Hugging Face's TopKLogitsWarper).
    - top-p (1.0 = off): keep the smallest set of most probable tokens (of the top-k
      distribution, renormalised) whose mass reaches top_p, plus any token exactly tied with
      the least probable one kept; the most probable token is always kept.
    """
    # Shift before dividing: at a vanishing temperature the division alone overflows to inf.
    with np.errstate(over="ignore"):
        scaled_S_V = (logits_S_V - logits_S_V.max(axis=-1, keepdims=True)) / temperature
    vocab = scaled_S_V.shape[-1]
    if 0 < top_k < vocab:
        kth_S = np.partition(scaled_S_V, vocab - top_k, axis=-1)[:, vocab - top_k]
        scaled_S_V[scaled_S_V < kth_S[:, None]] = -np.inf
    scaled_S_V -= scaled_S_V.max(axis=-1, keepdims=True)
    weights_S_V = np.exp(scaled_S_V, out=scaled_S_V)
    if top_p < 1.0:
        probs_S_V = weights_S_V / weights_S_V.sum(axis=-1, keepdims=True)
        descending_S_V = -np.sort(-probs_S_V, axis=-1)
        mass_before_S_V = np.cumsum(descending_S_V, axis=-1) - descending_S_V
        kept_S = np.count_nonzero(mass_before_S_V < top_p, axis=-1)  # >= 1 since top_p > 0
        cutoff_S = descending_S_V[np.arange(len(kept_S)), kept_S - 1]
        weights_S_V[probs_S_V < cutoff_S[:, None]] = 0.0
    return weights_S_V


def draw(weights_S_V: np.ndarray, uniform_S: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw per row from unnormalised weights, with ``uniform_S`` in (0, 1].

    The chosen index j satisfies cdf[j-1] < u·total <= cdf[j], so a zero-weight token is never
    chosen.
    """
    cdf_S_V = np.cumsum(weights_S_V, axis=-1)
    threshold_S = uniform_S * cdf_S_V[:, -1]
    return (cdf_S_V < threshold_S[:, None]).sum(axis=-1).astype(np.int64)


def sample_rows(
    first_logits_V: np.ndarray,
    step: Callable[[np.ndarray], np.ndarray],
    *,
    num_samples: int,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop_token_ids: Sequence[int],
) -> list[SampledSequence]:
    """Sample ``num_samples`` continuations at once.

    ``first_logits_V``: next-token logits after the prompt. ``step(tokens_S)`` feeds one new
    token per row to the model and returns the next logits ``(S, V)``; it is called once per
    generated position except the last. Rows that have already stopped keep being advanced
    (cheaper than compacting) but their extra tokens are discarded.
    """
    if num_samples < 1 or max_tokens < 1:
        raise ValueError("num_samples and max_tokens must be >= 1")
    if not temperature > 0:
        raise ValueError("temperature must be > 0")
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError("top_k must be >= 0 and top_p in (0, 1]")
    rng = make_rng(seed)
    stop_ids = np.asarray(list(stop_token_ids), dtype=np.int64)

    tokens_S_K = np.zeros((num_samples, max_tokens), dtype=np.int64)
    logprobs_S_K = np.zeros((num_samples, max_tokens), dtype=np.float64)
    lengths_S = np.full(num_samples, max_tokens, dtype=np.int64)
    stopped_S = np.zeros(num_samples, dtype=bool)
    rows_S = np.arange(num_samples)
    logits_S_V = np.broadcast_to(first_logits_V, (num_samples, first_logits_V.shape[-1]))

    untruncated = temperature == 1.0 and top_k == 0 and top_p == 1.0
    for k in range(max_tokens):
        # One exp per step: the temperature-1 softmax gives the reported logprobs (VER-3)
        # and, when nothing truncates, exactly truncated_probs' weights too.
        shifted_S_V = logits_S_V - logits_S_V.max(axis=-1, keepdims=True)
        exp_S_V = np.exp(shifted_S_V)
        weights_S_V = exp_S_V if untruncated else truncated_probs(
            logits_S_V, temperature=temperature, top_k=top_k, top_p=top_p)
        chosen_S = draw(weights_S_V, 1.0 - rng.random(num_samples))
        tokens_S_K[:, k] = chosen_S
        logprobs_S_K[:, k] = shifted_S_V[rows_S, chosen_S] - np.log(exp_S_V.sum(axis=-1))
        if stop_ids.size:
            newly_S = ~stopped_S & np.isin(chosen_S, stop_ids)
            lengths_S[newly_S] = k + 1
            stopped_S |= newly_S
            if stopped_S.all():
                break
        if k + 1 < max_tokens:
            logits_S_V = step(chosen_S)

    return [
        SampledSequence(
            tokens=tokens_S_K[s, : lengths_S[s]].copy(),
            logprobs=logprobs_S_K[s, : lengths_S[s]].copy(),
            stop_reason="stop" if stopped_S[s] else "length",
        )
        for s in range(num_samples)
    ]
