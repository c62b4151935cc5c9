"""Frozen input embeddings: a dense table (the byte model) or hashed rows computed on the fly.

Both map ids ``[0, V]`` to ``D``-vectors, where the extra id ``V`` ("no token", used for the
previous token of the first position and for padding) maps to zeros.

:class:`HashedEmbedding` keeps no ``(V, D)`` table. With ``n`` = the bit length of ``V - 1``,
an id goes through a bijection of ``[0, 2**n)`` (multiply by an odd constant, xor-shift,
multiply, xor-shift, all modulo ``2**n``) and the result ``u`` is split into its low
``a = ceil(n / 2)`` and high ``n - a`` bits::

    E(t) = (LO[u mod 2**a] + HI[u >> a]) / sqrt(2)

with ``LO`` (``2**a`` rows) and ``HI`` (``2**(n-a)`` rows) drawn once per model, at most 1024
rows each for ``V <= 2**20``. Since the bijection gives distinct ids distinct ``(low, high)``
pairs, distinct ids get distinct embeddings; the coordinates are N(0, 1) like the dense table's.
"""

from __future__ import annotations

import math

import numpy as np

from .head import FloatArray, IntArray

__all__ = ["DenseEmbedding", "HashedEmbedding"]


class DenseEmbedding:
    """``table_ext`` (V + 1, D): one row per id plus the all-zero row ``V``."""

    def __init__(self, table_ext: FloatArray) -> None:
        self.table_ext = table_ext
        self.vocab_size = table_ext.shape[0] - 1
        self.dim = table_ext.shape[1]

    def lookup(self, ids: IntArray, out: FloatArray | None = None) -> FloatArray:
        """Rows for ``ids`` (any shape, values in ``[0, V]``), shape ``ids.shape + (D,)``."""
        if out is None:
            return np.take(self.table_ext, ids, axis=0)
        return np.take(self.table_ext, ids, axis=0, out=out)

    def project(self, weight_D_X: FloatArray) -> tuple[FloatArray, ...]:
        """Tables for :meth:`lookup_projected`: here the one table ``table_ext @ weight_D_X``
        (V + 1, X). Its rows are gathered once per id, so a constant added to them is added
        once per looked-up id."""
        return (self.table_ext @ weight_D_X,)

    def lookup_projected(self, tables: tuple[FloatArray, ...], ids: IntArray,
                         out: FloatArray) -> FloatArray:
        """``lookup(ids) @ weight_D_X`` (up to rounding) from :meth:`project`'s tables, into
        ``out`` (``ids.shape + (X,)``): a gather instead of a matmul."""
        return np.take(tables[0], ids, axis=0, out=out)

    def parameters(self) -> dict[str, FloatArray]:
        return {"embed_tokens.weight": self.table_ext[:-1].copy()}


class HashedEmbedding:
    """Hashed embedding rows (see the module docstring); ``O(sqrt(V))`` memory."""

    def __init__(self, vocab_size: int, dim: int, rng: np.random.Generator) -> None:
        bits = max(1, (vocab_size - 1).bit_length())
        self.vocab_size, self.dim, self.bits = vocab_size, dim, bits
        self.low_bits = (bits + 1) // 2
        self.mask = (1 << bits) - 1
        self.multipliers = tuple(int(m) | 1 for m in rng.integers(0, 1 << bits, 2))
        self.shifts = (max(1, bits // 2), max(1, (bits + 1) // 2))
        scale = 1.0 / math.sqrt(2.0)
        # One extra all-zero row at the end of each table for the "no token" id V.
        self.low_ext = np.zeros(((1 << self.low_bits) + 1, dim))
        self.low_ext[:-1] = rng.standard_normal(((1 << self.low_bits), dim)) * scale
        self.high_ext = np.zeros(((1 << (bits - self.low_bits)) + 1, dim))
        self.high_ext[:-1] = rng.standard_normal(((1 << (bits - self.low_bits)), dim)) * scale
        for table in (self.low_ext, self.high_ext):
            table.flags.writeable = False

    def mix(self, ids: IntArray) -> IntArray:
        """The bijection of ``[0, 2**bits)`` applied to ``ids``."""
        (m1, m2), (s1, s2) = self.multipliers, self.shifts
        u = (np.asarray(ids, dtype=np.int64) * m1) & self.mask
        u ^= u >> s1
        u *= m2
        u &= self.mask
        u ^= u >> s2
        return u

    def rows(self, ids: IntArray) -> tuple[IntArray, IntArray]:
        """(row of LO, row of HI) for every id; id V (or above) gets the zero rows."""
        ids = np.asarray(ids, dtype=np.int64)
        u = self.mix(ids)
        pad = ids >= self.vocab_size
        low = u & ((1 << self.low_bits) - 1)
        high = u >> self.low_bits
        if pad.any():
            low[pad] = len(self.low_ext) - 1
            high[pad] = len(self.high_ext) - 1
        return low, high

    def lookup(self, ids: IntArray, out: FloatArray | None = None) -> FloatArray:
        """Rows for ``ids`` (any shape, values in ``[0, V]``), shape ``ids.shape + (D,)``."""
        low, high = self.rows(ids)
        if out is None:
            out = np.take(self.low_ext, low, axis=0)
        else:
            np.take(self.low_ext, low, axis=0, out=out)
        out += np.take(self.high_ext, high, axis=0)
        return out

    def project(self, weight_D_X: FloatArray) -> tuple[FloatArray, ...]:
        """Tables for :meth:`lookup_projected`: ``(LO @ weight_D_X, HI @ weight_D_X)``, each
        with at most 1025 rows (no V-sized table). Every id gathers exactly one row of the
        first, so a constant added to its rows is added once per looked-up id."""
        return (self.low_ext @ weight_D_X, self.high_ext @ weight_D_X)

    def lookup_projected(self, tables: tuple[FloatArray, ...], ids: IntArray,
                         out: FloatArray) -> FloatArray:
        """``lookup(ids) @ weight_D_X`` (up to rounding) from :meth:`project`'s tables, into
        ``out`` (``ids.shape + (X,)``): ``LO'[low] + HI'[high]``, two gathers."""
        low, high = self.rows(ids)
        np.take(tables[0], low, axis=0, out=out)
        out += np.take(tables[1], high, axis=0)
        return out

    def parameters(self) -> dict[str, FloatArray]:
        return {"embed_tokens.low": self.low_ext[:-1].copy(),
                "embed_tokens.high": self.high_ext[:-1].copy()}
