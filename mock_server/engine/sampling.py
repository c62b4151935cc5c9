"""Vectorised token sampling: temperature, top-k, top-p, stop tokens (SAMPLE-1, VER-3, VER-4).

The model supplies the first next-token logits and a ``step`` callback that advances all rows
by one chosen token; this module owns the truncation rules and the stop/length bookkeeping.
All ``num_samples`` rows advance together (arrays ``_S_K``); the only Python loop is over
time, and every step costs a fixed number of numpy calls whatever the number of rows.

Logits are over the model's ``K`` output buckets (see :mod:`.head`): every id of bucket ``b``
has probability ``softmax(logits)[b] / size_b``, so all ids of a bucket are tied. Truncation
follows the token-level rules exactly, computed in bucket space with token counts: top-k keeps
the ``k`` most probable *ids* plus every id tied with the k-th (whole buckets, since a bucket's
ids are tied), top-p keeps the smallest most-probable set of ids whose mass reaches ``p`` plus
every id tied with the least probable one kept. A bucket is drawn from the truncated bucket
masses, then an id uniformly within it. Nothing here allocates ``V``-sized arrays. When every
bucket holds one id (the byte model, or a small vocabulary) this is plain token sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .head import BoolArray, BucketMap, FloatArray, IntArray

__all__ = ["SampledSequence", "make_rng", "truncated_weights", "truncated_probs", "draw",
           "log_softmax", "sample_rows"]

_RNG_CHUNK = 64  # steps whose uniforms are drawn at once (same stream as one draw per step)


@dataclass(frozen=True)
class SampledSequence:
    """One completion: ``tokens`` (int64), their temperature-1 ``logprobs`` (VER-3), and
    ``stop_reason`` "stop" (last token is a stop token) or "length" (``max_tokens`` reached)."""

    tokens: IntArray
    logprobs: FloatArray
    stop_reason: str


def make_rng(seed: int | None) -> np.random.Generator:
    """``default_rng(seed)``; any int is accepted (reduced mod 2**64); None = fresh entropy."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(seed) % (1 << 64))


def log_softmax(logits_S_V: FloatArray) -> FloatArray:
    """Row-wise log-softmax (a new array)."""
    shifted_S_V = logits_S_V - logits_S_V.max(axis=-1, keepdims=True)
    result: FloatArray = shifted_S_V - np.log(np.exp(shifted_S_V).sum(axis=-1, keepdims=True))
    return result


def truncated_weights(logits_S_K: FloatArray, *, temperature: float, top_k: int, top_p: float,
                      buckets: BucketMap | None = None) -> FloatArray:
    """Unnormalised bucket masses after temperature, then top-k, then top-p (token rules).

    - temperature: every id's logit ``logits[b] - log size_b`` is divided by it (> 0).
    - top-k (0 = off, counted in ids): ids whose tempered logit is below the k-th largest get
      weight 0 (ties with the k-th are kept, as in Hugging Face's TopKLogitsWarper).
    - top-p (1.0 = off): keep the smallest set of most probable ids (of the top-k
      distribution, renormalised) whose mass reaches top_p, plus any id exactly tied with the
      least probable one kept; the most probable id is always kept.

    ``buckets`` None means one id per bucket. Returns ``(S, K)``: a bucket's weight is its
    size times its ids' common weight.
    """
    identity = buckets is None or buckets.identity
    vocab = logits_S_K.shape[-1] if buckets is None else buckets.vocab_size
    token_S_K = logits_S_K if identity or buckets is None \
        else logits_S_K - buckets.log_sizes_K
    # Shift before dividing: at a vanishing temperature the division alone overflows to inf.
    with np.errstate(over="ignore"):
        scaled_S_K = (token_S_K - token_S_K.max(axis=-1, keepdims=True)) / temperature
    rows_S = np.arange(len(scaled_S_K))
    order_S_K: IntArray | None = None
    if 0 < top_k < vocab:
        if identity:
            kth_S = np.partition(scaled_S_K, vocab - top_k, axis=-1)[:, vocab - top_k]
        else:
            assert buckets is not None
            order_S_K = np.argsort(-scaled_S_K, axis=-1, kind="stable")
            ids_before_S_K = np.cumsum(buckets.sizes_K[order_S_K], axis=-1)
            position_S = np.count_nonzero(ids_before_S_K < top_k, axis=-1)
            kth_S = scaled_S_K[rows_S, order_S_K[rows_S, position_S]]
        scaled_S_K[scaled_S_K < kth_S[:, None]] = -np.inf
    weights_S_K: FloatArray = np.exp(scaled_S_K, out=scaled_S_K)  # the top id has weight 1
    if top_p < 1.0:
        if identity:
            probs_S_K = weights_S_K / weights_S_K.sum(axis=-1, keepdims=True)
            descending_S_K = -np.sort(-probs_S_K, axis=-1)
            mass_before_S_K = np.cumsum(descending_S_K, axis=-1) - descending_S_K
            kept_S = np.count_nonzero(mass_before_S_K < top_p, axis=-1)  # >= 1: top_p > 0
            cutoff_S = descending_S_K[rows_S, kept_S - 1]
            weights_S_K[probs_S_K < cutoff_S[:, None]] = 0.0
        else:
            assert buckets is not None
            if order_S_K is None:
                order_S_K = np.argsort(-weights_S_K, axis=-1, kind="stable")
            sorted_S_K = np.take_along_axis(weights_S_K, order_S_K, axis=-1)
            mass_S_K = sorted_S_K * buckets.sizes_K[order_S_K]
            cumulative_S_K = np.cumsum(mass_S_K, axis=-1)
            mass_before_S_K = (cumulative_S_K - mass_S_K) / cumulative_S_K[:, -1:]
            kept_S = np.count_nonzero(mass_before_S_K < top_p, axis=-1)
            cutoff_S = sorted_S_K[rows_S, kept_S - 1]
            weights_S_K[weights_S_K < cutoff_S[:, None]] = 0.0
    if identity or buckets is None:
        return weights_S_K
    result: FloatArray = weights_S_K * buckets.sizes_K
    return result


def truncated_probs(logits_S_V: FloatArray, *, temperature: float, top_k: int,
                    top_p: float) -> FloatArray:
    """:func:`truncated_weights` with one id per column (token-level logits)."""
    return truncated_weights(logits_S_V, temperature=temperature, top_k=top_k, top_p=top_p)


def draw(weights_S_K: FloatArray, uniform_S: FloatArray) -> IntArray:
    """Inverse-CDF draw per row from unnormalised weights, with ``uniform_S`` in (0, 1].

    The chosen index j satisfies cdf[j-1] < u·total <= cdf[j], so a zero-weight column is never
    chosen.
    """
    cdf_S_K = np.cumsum(weights_S_K, axis=-1)
    threshold_S = uniform_S * cdf_S_K[:, -1]
    return _first_reaching(cdf_S_K, cdf_S_K[0], threshold_S,
                           np.empty(cdf_S_K.shape, dtype=bool), len(cdf_S_K) == 1)


def _first_reaching(cdf_S_K: FloatArray, cdf_K: FloatArray, threshold_S: FloatArray,
                    reached_S_K: BoolArray, one_row: bool) -> IntArray:
    """Per row, the first column whose running sum reaches the threshold (``threshold <=
    cdf[:, -1]``): the count of entries below it, as a running sum of non-negative weights
    never decreases. One row: a binary search; several: the first True of ``cdf >= t``
    (argmax stops there), cheaper than counting the whole row."""
    if one_row:
        found_1: IntArray = np.searchsorted(cdf_K, threshold_S)
        return found_1
    np.greater_equal(cdf_S_K, threshold_S[:, None], out=reached_S_K)
    found_S: IntArray = reached_S_K.argmax(axis=1)
    return found_S


def _stop_mask(tokens: IntArray, stop_ids: IntArray) -> BoolArray:
    """Boolean mask of ``tokens`` that are stop ids (a few comparisons, or a sorted lookup)."""
    if len(stop_ids) <= 4:
        mask: BoolArray = tokens == stop_ids[0]
        for stop in stop_ids[1:]:
            mask |= tokens == stop
        return mask
    at = np.minimum(np.searchsorted(stop_ids, tokens), len(stop_ids) - 1)
    found: BoolArray = stop_ids[at] == tokens
    return found


def sample_rows(
    first_logits_K: FloatArray,
    step: Callable[[IntArray], FloatArray],
    *,
    num_samples: int,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop_token_ids: Sequence[int],
    buckets: BucketMap | None = None,
) -> list[SampledSequence]:
    """Sample ``num_samples`` continuations at once.

    ``first_logits_K``: next-bucket logits after the prompt (any row constant; one id per
    bucket when ``buckets`` is None). ``step(tokens_S)`` feeds one new id per row to the model
    and returns the next logits ``(S, K)``; it is called once per generated position except the
    last. Rows that have already stopped keep being advanced (cheaper than compacting) but
    their extra tokens are discarded. Uniforms come from ``default_rng(seed)``, one per row
    and step (plus one more per row and step to pick the id within a bucket of several ids),
    so the same seed gives the same tokens (VER-4). Reported logprobs are the untruncated
    temperature-1 ones of the chosen ids (VER-3).
    """
    if num_samples < 1 or max_tokens < 1:
        raise ValueError("num_samples and max_tokens must be >= 1")
    if not temperature > 0:
        raise ValueError("temperature must be > 0")
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError("top_k must be >= 0 and top_p in (0, 1]")
    width = first_logits_K.shape[-1]
    if buckets is not None and buckets.count != width:
        raise ValueError(f"logits have {width} columns for {buckets.count} buckets")
    vocab = width if buckets is None else buckets.vocab_size
    spread = buckets is not None and not buckets.identity
    rng = make_rng(seed)
    stop_ids = np.unique(np.asarray(list(stop_token_ids), dtype=np.int64))

    tokens_T_S = np.zeros((max_tokens, num_samples), dtype=np.int64)
    logprobs_T_S = np.zeros((max_tokens, num_samples), dtype=np.float64)
    stopped_S = np.zeros(num_samples, dtype=bool)
    rows_S = np.arange(num_samples)
    logits_S_K = np.broadcast_to(first_logits_K, (num_samples, width))
    exp_S_K = np.empty((num_samples, width))
    cdf_S_K = np.empty((num_samples, width))
    reached_S_K = np.empty((num_samples, width), dtype=bool)
    cdf_K = cdf_S_K[0]
    one_row = num_samples == 1
    untruncated = temperature == 1.0 and not 0 < top_k < vocab and top_p == 1.0
    uniform_C_S = offset_C_S = np.empty((0, num_samples))
    steps = max_tokens
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for k in range(max_tokens):
            chunk_at = k % _RNG_CHUNK
            if chunk_at == 0:
                size = (min(_RNG_CHUNK, max_tokens - k), num_samples)
                uniform_C_S = 1.0 - rng.random(size)  # (0, 1]
                if spread:
                    offset_C_S = rng.random(size)  # [0, 1): which id of the drawn bucket
            # The model keeps its logits in exp's range (a static shift or a per-row max), so
            # one exp serves the partition function and the draw; other logits are shifted.
            np.cumsum(np.exp(logits_S_K, out=exp_S_K), axis=1, out=cdf_S_K)
            total_S = cdf_S_K[:, -1]
            log_total_S = np.log(total_S)
            if not math.isfinite(log_total_S[0] if one_row else log_total_S.sum()):
                logits_S_K = logits_S_K - logits_S_K.max(axis=1, keepdims=True)
                np.cumsum(np.exp(logits_S_K, out=exp_S_K), axis=1, out=cdf_S_K)
                log_total_S = np.log(total_S)
            if untruncated:
                threshold_S = uniform_C_S[chunk_at] * total_S  # in (0, total]: u <= 1
                bucket_S = _first_reaching(cdf_S_K, cdf_K, threshold_S, reached_S_K, one_row)
            else:
                bucket_S = draw(truncated_weights(logits_S_K, temperature=temperature,
                                                  top_k=top_k, top_p=top_p, buckets=buckets),
                                uniform_C_S[chunk_at])
            logprob_S = logprobs_T_S[k]
            np.subtract(logits_S_K[rows_S, bucket_S], log_total_S, out=logprob_S)
            if spread:
                assert buckets is not None
                logprob_S -= buckets.log_sizes_K[bucket_S]
                token_S = buckets.token_of(bucket_S, offset_C_S[chunk_at])
            else:
                token_S = bucket_S
            tokens_T_S[k] = token_S
            if stop_ids.size:
                stopped_S |= _stop_mask(token_S, stop_ids)
                if stopped_S.all():
                    steps = k + 1
                    break
            if k + 1 < max_tokens:
                logits_S_K = step(token_S)

    lengths_S = np.full(num_samples, max_tokens, dtype=np.int64)
    if stop_ids.size:
        first_stop_S = _stop_mask(tokens_T_S[:steps], stop_ids).argmax(axis=0)
        lengths_S = np.where(stopped_S, first_stop_S + 1, max_tokens)
    tokens_S_T, logprobs_S_T = tokens_T_S.T, logprobs_T_S.T
    return [
        SampledSequence(tokens=tokens_S_T[s, :length].copy(),
                        logprobs=logprobs_S_T[s, :length].copy(),
                        stop_reason="stop" if stopped else "length")
        for s, (length, stopped) in enumerate(zip(lengths_S.tolist(), stopped_S.tolist(),
                                                   strict=False))
    ]
