"""The sampling distribution the contract describes (temperature, then top-k, then top-p, ties
kept), written out over every id independently of the engine, and the chi-square statistic
the frequency tests compare draws with: shared by the byte and the declared-model tests."""

from __future__ import annotations

import numpy as np


def reference_filter(logprobs_V: np.ndarray, temperature: float, top_k: int,
                     top_p: float) -> np.ndarray:
    """Normalised sampling distribution over ids: temperature, the top-k (ties with the k-th
    kept), then the top-p nucleus (ties with the least probable kept id kept)."""
    z = logprobs_V / temperature
    probs = np.exp(z - z.max())
    if top_k:
        kth = np.sort(z)[-top_k]
        probs[z < kth] = 0.0
    probs /= probs.sum()
    if top_p < 1.0:
        kept = np.zeros(len(probs), dtype=bool)
        mass = 0.0
        for v in np.argsort(-probs, kind="stable"):
            if mass >= top_p:
                break
            kept[v] = True
            mass += probs[v]
        kept |= probs == probs[kept].min()
        probs[~kept] = 0.0
        probs /= probs.sum()
    return probs


def chi_square(counts_V: np.ndarray, probs_V: np.ndarray) -> tuple[float, int]:
    """Pearson statistic with bins of expected count < 5 pooled; returns (stat, dof)."""
    expected = counts_V.sum() * probs_V
    small = expected < 5
    obs = np.append(counts_V[~small], counts_V[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum() - 1)
