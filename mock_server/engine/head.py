"""The output layer's vocabulary map: ids ``[0, V)`` grouped into ``K`` buckets.

A bucketed model predicts a distribution over ``K`` buckets and spreads each bucket's mass
evenly over the ids in it::

    log p(t) = log_softmax(bucket_logits)[b(t)] - log |bucket b(t)|

which is exact (the ``V`` probabilities sum to one because the sizes sum to ``V``), costs
``O(K)`` per position whatever ``V`` is, and gives every id a non-zero probability.

Layout (:class:`BucketMap`):

- ``V <= max_buckets``: the identity, every id is its own bucket (``K = V``).
- otherwise ``K = max_buckets``: the special ids (EOS and, when declared, BOS) get singleton
  buckets ``Kr, Kr + 1`` at the end, so the model can learn when to stop; the ``R`` other ids,
  in order, fill the ``Kr = K - #specials`` regular buckets as contiguous runs whose sizes
  differ by at most one: the id of regular rank ``r`` (its position among non-special ids)
  lies in bucket ``r * Kr // R``.

Every method is vectorised and touches ``O(len(ids))`` memory: nothing here has ``V`` entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["BucketMap", "BoolArray", "FloatArray", "IntArray"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


class BucketMap:
    """Which bucket each id belongs to, and back (see the module docstring)."""

    def __init__(self, vocab_size: int, special_ids: Sequence[int], max_buckets: int) -> None:
        specials = tuple(sorted({int(s) for s in special_ids}))
        if vocab_size < 1 or any(not 0 <= s < vocab_size for s in specials):
            raise ValueError(f"special ids {specials} outside the vocabulary [0, {vocab_size})")
        if max_buckets < len(specials) + 1:
            raise ValueError(f"max_buckets {max_buckets} leaves no bucket for ordinary ids")
        self.vocab_size = int(vocab_size)
        self.identity = vocab_size <= max_buckets
        self.count = self.vocab_size if self.identity else int(max_buckets)
        self.specials: tuple[int, ...] = () if self.identity else specials
        self.regular_ids = self.vocab_size - len(self.specials)  # R
        self.regular_buckets = self.count - len(self.specials)  # Kr
        kr, r = self.regular_buckets, self.regular_ids
        starts = (np.arange(kr + 1, dtype=np.int64) * r + kr - 1) // kr  # ceil(j·R / Kr)
        sizes_K = np.ones(self.count, dtype=np.int64)
        if not self.identity:
            sizes_K[:kr] = np.diff(starts)
        self.sizes_K: IntArray = sizes_K
        self.log_sizes_K: FloatArray = np.log(sizes_K.astype(np.float64))
        self._starts_K: IntArray = np.zeros(self.count, dtype=np.int64)
        self._starts_K[:kr] = starts[:-1]
        self._special_of_K: IntArray = np.full(self.count, -1, dtype=np.int64)
        self._special_of_K[kr:] = np.array(self.specials, dtype=np.int64)
        for array in (self.sizes_K, self.log_sizes_K, self._starts_K, self._special_of_K):
            array.flags.writeable = False

    def __repr__(self) -> str:
        return (f"BucketMap(vocab_size={self.vocab_size}, buckets={self.count}, "
                f"specials={self.specials})")

    def bucket_of(self, ids: IntArray) -> IntArray:
        """The bucket of every id (ids must lie in ``[0, V)``)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.identity:
            return ids
        rank = ids.copy()
        for special in self.specials:
            rank -= ids > special
        buckets = rank * self.regular_buckets // self.regular_ids
        for i, special in enumerate(self.specials):
            buckets[ids == special] = self.regular_buckets + i
        return buckets

    def token_of(self, buckets: IntArray, uniform: FloatArray) -> IntArray:
        """One id per bucket: the ``floor(u · size)``-th id of the bucket, ``u`` in ``[0, 1)``
        (a uniform ``u`` gives a uniform id within the bucket)."""
        buckets = np.asarray(buckets, dtype=np.int64)
        if self.identity:
            return buckets
        sizes = self.sizes_K[buckets]
        offsets = np.minimum((np.asarray(uniform) * sizes).astype(np.int64), sizes - 1)
        ids = self._starts_K[buckets] + offsets
        for special in self.specials:  # ascending: skip each special id at or below
            ids += ids >= special
        special_of = self._special_of_K[buckets]
        return np.where(special_of >= 0, special_of, ids)

    def members(self, bucket: int) -> IntArray:
        """Every id of one bucket, ascending (``O(size)``; for tests and small buckets)."""
        if not 0 <= bucket < self.count:
            raise ValueError(f"bucket {bucket} outside [0, {self.count})")
        size = int(self.sizes_K[bucket])
        offsets = (np.arange(size) + 0.5) / size
        return self.token_of(np.full(size, bucket, dtype=np.int64), offsets)
