"""``whitney-mock/tiny-byte``: a tiny deterministic byte language model with LoRA, in numpy.

Architecture (all float64; shapes use torch's ``(out, in)`` convention for weights):

- tokens: bytes 0..255, BOS = 256, EOS = 257 (V = 258).
- features at position t: ``x_t = [E[tok_t], E[tok_{t-1}], c_t]`` (F = 3·D = 96), where
  ``E[tok_{-1}]`` is a zero vector and ``c_t = d·c_{t-1} + (1-d)·E[tok_t]`` (c_{-1} = 0, d = 0.8)
  is an exponential moving average over the whole prefix, so logits depend on more than the
  last token. E (V, D = 32) is frozen.
- ``h_t = tanh(x_t @ W_mixer_eff.T + b_mixer)`` (H = 64),
  ``logits_t = h_t @ W_head_eff.T + b_head``.
- LoRA on both linear layers, PEFT names ``mixer`` and ``lm_head``: lora_A (r, in), lora_B
  (out, r), ``W_eff = W + (alpha / r)·B @ A``. A is drawn from the run's seed, B starts at zero,
  so a fresh adapter reproduces the base model exactly.
- Base weights come from ``default_rng`` seeded with SHA-256 of the model id, so every process
  computes bit-identical logprobs. ``b_head`` is a "pretrained" prior: printable ASCII and EOS
  are likely, control and high bytes (and BOS) are not.

Declared base models (any ``vocab_size`` from 2 to 2**20, any EOS/BOS: ``ModelSpec.declare``)
share the features, mixer and LoRA, but not the two vocabulary-sized ends, so their cost does
not depend on V: E is computed on the fly from two small hashed tables
(:mod:`.embedding`), and the head predicts K = min(V, 256) buckets whose mass is spread
evenly over their ids, EOS and BOS alone in theirs (:mod:`.head`):
``log p(t) = log_softmax(logits)[bucket(t)] - log |bucket(t)|``. ``lm_head`` is (K, H).

Only numpy and the standard library are imported; the module holds no mutable state besides
the cache of base models.
"""

from __future__ import annotations

import functools
import hashlib
import math
import string
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from .losses import flatten_loss_inputs, loss_terms, resolve_loss_config
from .sampling import SampledSequence, sample_rows
from .specs import (
    BASE_MODEL_SPECS,
    BOS_TOKEN,
    EOS_TOKEN,
    VOCAB_SIZE,
    Lora,
    LossResult,
    ModelSpec,
    NonFiniteLossError,
    lora_key,
)

__all__ = ["BaseModel", "get_base_model"]

# Vocabulary-independent engine pieces (kept below the facade import block above).
from .embedding import DenseEmbedding, HashedEmbedding  # noqa: E402
from .head import BucketMap, FloatArray, IntArray  # noqa: E402
from .specs import BYTE_ARCHITECTURE  # noqa: E402

_EMA_BLOCK = 64  # block length of the EMA scan; d**-63 ~ 1.3e6 keeps it well conditioned
_ROW_CHUNK = 1024  # rows of (rows, K) logits handled at once: ~2 MB, stays in cache
_COMPILED_SLOTS = 8  # adapters whose merged weights are kept (~0.3 MB each at rank 8)
_DECLARED_SLOTS = 64  # declared (non built-in) base models kept built (~0.7 MB each)
_EOS_SHARE = 0.05  # a declared model's prior probability of EOS, roughly


@dataclass(frozen=True)
class _Compiled:
    """An adapter merged into matmul-ready weights: ``mix_ext`` (3D + 1, H) = [W_mix_effᵀ; b],
    ``head_ext`` (H + 1, K) = [W_head_effᵀ; b - shift], ``head`` = W_head_eff (K, H)."""

    mix_ext: FloatArray
    head_ext: FloatArray
    head: FloatArray
    row_max: bool
    # Built on first use by sample (see BaseModel._step_tables), not by every compile: the
    # training path never needs them, and a declared model's are ~3 MB.
    step_tables: dict[str, tuple[FloatArray, ...]] = field(default_factory=dict, compare=False,
                                                           repr=False)


def _prior_bias() -> FloatArray:
    """``b_head`` of the byte model: log-odds of a plausible text prior over bytes, BOS, EOS."""
    bias_V = np.full(VOCAB_SIZE, -7.0)
    for chars, value in (
        (string.ascii_lowercase, 2.0), (" ", 2.5), (string.ascii_uppercase, 0.8),
        (string.digits, 1.0), (string.punctuation, 0.0), ("\n", 0.0),
    ):
        bias_V[[ord(c) for c in chars]] = value
    bias_V[BOS_TOKEN] = -12.0
    bias_V[EOS_TOKEN] = 1.9
    return bias_V


def _bucket_prior(spec: ModelSpec, buckets: BucketMap, rng: np.random.Generator) -> FloatArray:
    """``b_head`` of a declared model, one entry per bucket: N(0, 1) for ordinary buckets,
    EOS at roughly a 5% share of the mass (so sampled rows stop, and stopping is learnable),
    BOS (when declared and not EOS) at -12, nearly never predicted, as in the byte model."""
    bias_K = rng.normal(0.0, 1.0, buckets.count)
    eos = int(buckets.bucket_of(np.array([spec.eos_token_id]))[0])
    ordinary = buckets.count - len(spec.special_token_ids)
    # An ordinary bucket's exp(logit) averages about e^0.95 (bias N(0,1), tanh-bounded h·w);
    # EOS's own h·w term adds about e^0.45, hence the +0.5.
    bias_K[eos] = math.log(_EOS_SHARE / (1.0 - _EOS_SHARE) * max(ordinary, 1)) + 0.5
    if spec.bos_token_id is not None and spec.bos_token_id != spec.eos_token_id:
        bias_K[int(buckets.bucket_of(np.array([spec.bos_token_id]))[0])] = -12.0
    return bias_K


_BLAS = ThreadpoolController()
P = ParamSpec("P")
R = TypeVar("R")


def _one_blas_thread(method: Callable[P, R]) -> Callable[P, R]:
    """Run ``method`` with single-threaded BLAS.

    The matrices here are small: a second OpenBLAS thread gains little when idle, and on a
    shared 2-core CI machine its spin-waiting made forward_backward 2-10x slower (8 x 128
    tokens: 6 ms single-threaded, 14-70 ms with two threads). When every BLAS library is
    already at one thread (``OPENBLAS_NUM_THREADS=1``, or the server's
    :func:`pin_blas_threads`) there is nothing to do: one ``get_num_threads`` per library,
    ~1 us. Otherwise threadpoolctl's ``limit()`` sets one thread and restores on exit
    (~12 us); it is not replaced by a hand-rolled set-and-restore, because OpenBLAS's count is
    process-wide and such a restore from one thread can land under another thread's call
    (the tests run uvicorn in a thread beside in-process calls, and their results differed).
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if all(lib.get_num_threads() == 1 for lib in _blas_libraries()):
            return method(*args, **kwargs)
        with _BLAS.limit(limits=1, user_api="blas"):
            return method(*args, **kwargs)

    return wrapper


@functools.cache
def _blas_libraries() -> tuple[Any, ...]:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process."""
    return tuple(lib for lib in _BLAS.lib_controllers if lib.user_api == "blas")


def pin_blas_threads() -> None:
    """Set every BLAS library of this process to one thread for good (no restore): for the
    processes the kit owns, such as ``python -m mock_server``, where it makes the per-call
    guard free. Library users who want the same set ``OPENBLAS_NUM_THREADS=1``."""
    _BLAS.limit(limits=1, user_api="blas")


class BaseModel:
    """A frozen base model; every method is a pure function of its arguments.

    Two architectures share everything but the vocabulary ends (``spec.architecture``):

    - ``tiny-byte`` (the built-in byte model): a dense embedding table (V + 1, D) and an exact
      V-way head with a text prior, as the module docstring describes.
    - ``hashed-buckets`` (every declared model, any V from 2 to 2**20): the embedding of an id
      is computed on the fly from two small tables (:class:`.embedding.HashedEmbedding`), and
      the head predicts ``K = min(V, max_buckets)`` buckets whose mass is spread evenly over
      their ids (:class:`.head.BucketMap`; EOS and BOS have buckets of their own)::

          log p(t) = log_softmax(h @ W_headᵀ + b)[bucket(t)] - log |bucket(t)|

      ``lm_head`` is then (K, H) and its LoRA B is (K, r): time and memory per position, per
      run and per saved version do not depend on V.
    """

    target_modules: tuple[str, ...] = ("mixer", "lm_head")

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        d, h, v, k = spec.embed_dim, spec.hidden_dim, spec.vocab_size, spec.num_buckets
        seed = int.from_bytes(hashlib.sha256(spec.id.encode("utf-8")).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        self.embedding: DenseEmbedding | HashedEmbedding
        if spec.architecture == BYTE_ARCHITECTURE:
            # One extra all-zero row (index V) stands for "no previous token" and for padding.
            embed_ext = np.zeros((v + 1, d))
            embed_ext[:v] = rng.standard_normal((v, d))
            embed_ext.flags.writeable = False
            self.embedding = DenseEmbedding(embed_ext)
            self.mixer_weight: FloatArray = rng.standard_normal((h, 3 * d)) / math.sqrt(3 * d)
            self.mixer_bias: FloatArray = rng.normal(0.0, 0.5, h)
            self.head_weight: FloatArray = rng.standard_normal((v, h)) * (1.5 / math.sqrt(h))
            self.buckets = BucketMap(v, (), v)
            self.head_bias: FloatArray = _prior_bias()
        else:
            self.mixer_weight = rng.standard_normal((h, 3 * d)) / math.sqrt(3 * d)
            self.mixer_bias = rng.normal(0.0, 0.5, h)
            self.head_weight = rng.standard_normal((k, h)) * (1.5 / math.sqrt(h))
            self.buckets = BucketMap(v, spec.special_token_ids, spec.max_buckets)
            self.head_bias = _bucket_prior(spec, self.buckets, rng)
            self.embedding = HashedEmbedding(v, d, rng)
        for array in (self.mixer_weight, self.mixer_bias, self.head_weight, self.head_bias):
            array.flags.writeable = False
        self.module_shapes: dict[str, tuple[int, int]] = {
            "mixer": (h, 3 * d),  # (out_features, in_features)
            "lm_head": (k, h),
        }
        # Merged weights of the last few adapters, keyed by identity: a sampler version is
        # scored many times, and its Lora is never mutated (optim_step builds a new one).
        self._compiled: dict[int, tuple[weakref.ref[Lora], _Compiled]] = {}
        self._compiled_lock = threading.Lock()
        decay, steps_K = spec.ema_decay, np.arange(_EMA_BLOCK)
        lags_K_K = steps_K[:, None] - steps_K[None, :]
        self._ema_matrix: FloatArray = np.where(
            lags_K_K >= 0, (1.0 - decay) * decay ** np.maximum(lags_K_K, 0), 0.0)
        self._ema_matrix.flags.writeable = False

    @property
    def embed_ext(self) -> FloatArray:
        """The byte model's dense embedding table (V + 1, D), zero last row. A declared model
        has none (its rows are hashed): AttributeError."""
        if isinstance(self.embedding, DenseEmbedding):
            return self.embedding.table_ext
        raise AttributeError(f"{self.spec.id!r} has a hashed embedding, not a dense table")

    def embed(self, token_ids: IntArray) -> FloatArray:
        """The frozen input embedding of ``token_ids`` (any shape), ``(..., D)``."""
        return self.embedding.lookup(self._check_tokens(np.ravel(token_ids), "token_ids")
                                     ).reshape(np.shape(token_ids) + (self.spec.embed_dim,))

    # ----------------------------------------------------------------------------- adapters

    def init_lora(self, rank: int, alpha: float, seed: int) -> Lora:
        """A fresh adapter: A ~ U(-1/sqrt(in), 1/sqrt(in)) from ``seed`` (PEFT's kaiming-uniform
        bound), B = 0. Same seed, same A. ``seed`` may be any int (reduced mod 2**64)."""
        if not 1 <= rank <= self.spec.max_lora_rank:
            raise ValueError(f"rank {rank} outside [1, {self.spec.max_lora_rank}]")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        rng = np.random.default_rng(int(seed) % (1 << 64))
        params: dict[str, FloatArray] = {}
        for module in self.target_modules:
            out_features, in_features = self.module_shapes[module]
            bound = 1.0 / math.sqrt(in_features)
            params[lora_key(module, "A")] = rng.uniform(-bound, bound, (rank, in_features))
            params[lora_key(module, "B")] = np.zeros((out_features, rank))
        return Lora(params=params, rank=int(rank), alpha=float(alpha))

    def _check_lora(self, lora: Lora) -> None:
        for module in self.target_modules:
            out_features, in_features = self.module_shapes[module]
            a = lora.params[lora_key(module, "A")]
            b = lora.params[lora_key(module, "B")]
            if a.shape != (lora.rank, in_features) or b.shape != (out_features, lora.rank):
                raise ValueError(f"LoRA {module}: A {a.shape}, B {b.shape} do not fit rank "
                                 f"{lora.rank} and module shape {(out_features, in_features)}")

    def _merge(self, lora: Lora) -> tuple[FloatArray, FloatArray]:
        """(W_mixer_eff, W_head_eff) = W + alpha/r · B @ A for both modules."""
        self._check_lora(lora)
        p, s = lora.params, lora.scale
        w_mix = self.mixer_weight + s * (p[lora_key("mixer", "B")] @ p[lora_key("mixer", "A")])
        w_head = self.head_weight + s * (p[lora_key("lm_head", "B")]
                                         @ p[lora_key("lm_head", "A")])
        return w_mix, w_head

    def merged_weights(self, lora: Lora) -> dict[str, FloatArray]:
        """Effective weights with the adapter merged (``W + alpha/r · B @ A``), plus the frozen
        ones, under the base model's own module names (a declared model's embedding is its two
        hashed tables, ``embed_tokens.low`` and ``embed_tokens.high``)."""
        w_mix, w_head = self._merge(lora)
        return {"mixer.weight": w_mix, "lm_head.weight": w_head,
                "mixer.bias": self.mixer_bias.copy(), "lm_head.bias": self.head_bias.copy(),
                **self.embedding.parameters()}

    # ----------------------------------------------------------------------------- kernels

    def _check_tokens(self, tokens: IntArray | FloatArray, what: str) -> IntArray:
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional")
        if arr.dtype.kind == "f":
            if not np.array_equal(arr.astype(np.int64), arr):
                raise ValueError(f"{what} must hold integers")
        elif arr.dtype.kind not in "iu" and arr.size:
            raise ValueError(f"{what} must hold integers")
        ids: IntArray = arr.astype(np.int64, copy=False)
        if ids.size and (ids.min() < 0 or ids.max() >= self.spec.vocab_size):
            raise ValueError(f"{what} must lie in [0, {self.spec.vocab_size})")
        return ids

    def _log_prob(self, logits_C_K: FloatArray, log_partition_C: FloatArray,
                  bucket_C: IntArray) -> FloatArray:
        """log p(token) from bucket logits: logit[bucket] - log Z - log |bucket|."""
        logp_C: FloatArray = logits_C_K[np.arange(len(bucket_C)), bucket_C] - log_partition_C
        if not self.buckets.identity:
            logp_C -= self.buckets.log_sizes_K[bucket_C]
        return logp_C

    def _ema(self, emb_B_T_D: FloatArray, out_B_T_D: FloatArray) -> None:
        """c_t = d·c_{t-1} + (1-d)·e_t along T (c_{-1} = 0), as a blocked closed-form scan:
        inside a block c_{s+i} = (1-d)·d^i·Σ_{j<=i} d^-j·e_{s+j} + d^(i+1)·c_{s-1}."""
        d = self.spec.ema_decay
        steps_K = np.arange(_EMA_BLOCK, dtype=np.float64)
        grow_K, shrink_K, carry_K = d**-steps_K, (1.0 - d) * d**steps_K, d ** (steps_K + 1.0)
        carry_B_D: FloatArray | None = None
        for start in range(0, emb_B_T_D.shape[1], _EMA_BLOCK):
            block = out_B_T_D[:, start : start + _EMA_BLOCK]
            k = block.shape[1]
            np.multiply(emb_B_T_D[:, start : start + k], grow_K[:k, None], out=block)
            np.cumsum(block, axis=1, out=block)
            block *= shrink_K[:k, None]
            if carry_B_D is not None:
                block += carry_K[:k, None] * carry_B_D[:, None, :]
            carry_B_D = block[:, -1]

    def _features(self, seqs: Sequence[IntArray]) -> FloatArray:
        """x (N, 3D + 1) for the concatenated ``seqs`` (each a fresh context); the last column
        is a constant 1 so the mixer bias rides inside the matmul."""
        d, pad = self.spec.embed_dim, self.spec.vocab_size
        lengths_B = np.array([len(s) for s in seqs], dtype=np.int64)
        longest = int(lengths_B.max()) if len(seqs) else 0
        if longest == 0:
            return np.empty((0, 3 * d + 1))
        ids_B_T = np.full((len(seqs), longest), pad, dtype=np.int64)
        valid_B_T = np.arange(longest) < lengths_B[:, None]
        ids_B_T[valid_B_T] = np.concatenate(seqs)
        x_B_T_F = np.empty((len(seqs), longest, 3 * d + 1))
        self.embedding.lookup(ids_B_T, out=x_B_T_F[:, :, :d])
        x_B_T_F[:, 0, d : 2 * d] = 0.0
        x_B_T_F[:, 1:, d : 2 * d] = x_B_T_F[:, :-1, :d]
        self._ema(x_B_T_F[:, :, :d], x_B_T_F[:, :, 2 * d : 3 * d])
        x_B_T_F[:, :, 3 * d] = 1.0
        if valid_B_T.all():
            return x_B_T_F.reshape(-1, 3 * d + 1)
        valid_N_F: FloatArray = x_B_T_F[valid_B_T]
        return valid_N_F

    def _compile(self, lora: Lora) -> _Compiled:
        """:meth:`_compile_uncached`, remembered for the last ``_COMPILED_SLOTS`` adapters."""
        with self._compiled_lock:
            hit = self._compiled.pop(id(lora), None)
            if hit is not None and hit[0]() is lora:
                self._compiled[id(lora)] = hit  # most recent last
                return hit[1]
        compiled = self._compile_uncached(lora)
        with self._compiled_lock:
            self._compiled[id(lora)] = (weakref.ref(lora), compiled)
            while len(self._compiled) > _COMPILED_SLOTS:
                del self._compiled[next(iter(self._compiled))]
        return compiled

    def _compile_uncached(self, lora: Lora) -> _Compiled:
        """Merged weights in matmul layout with biases folded in as an extra input row.

        The head bias is shifted by the static bound max_k(b_k + |W_k|_1) >= every logit
        (|h| <= 1), so no per-row max pass is needed; if the bound is loose enough to risk
        underflow of the whole partition function, fall back to per-row max subtraction.
        """
        w_mix, w_head = self._merge(lora)
        # C order: vstack of a transpose comes out Fortran-ordered, and BLAS is slower on it
        # for these shapes (a 16-row head product 17 -> 11 us).
        mix_ext = np.ascontiguousarray(np.vstack([w_mix.T, self.mixer_bias[None, :]]))
        spread_K = np.abs(w_head).sum(axis=1)
        upper = float((self.head_bias + spread_K).max())
        row_max = not upper - float((self.head_bias - spread_K).max()) < 650.0
        shift = 0.0 if row_max else upper
        head_ext = np.ascontiguousarray(np.vstack([w_head.T, (self.head_bias - shift)[None, :]]))
        return _Compiled(mix_ext=mix_ext, head_ext=head_ext, head=w_head, row_max=row_max)

    def _logits(self, weights: _Compiled, x_C_F: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(h_ext (C, H + 1) with a constant-1 last column, logits (C, K) up to a row constant,
        at most 0 and with a row maximum above -650, so exp neither overflows nor vanishes)."""
        hidden = weights.mix_ext.shape[1]
        h_C_H1 = np.empty((len(x_C_F), hidden + 1))
        np.tanh(x_C_F @ weights.mix_ext, out=h_C_H1[:, :hidden])
        h_C_H1[:, hidden] = 1.0
        logits_C_K: FloatArray = h_C_H1 @ weights.head_ext
        if weights.row_max:
            logits_C_K -= logits_C_K.max(axis=1, keepdims=True)
        return h_C_H1, logits_C_K

    # ----------------------------------------------------------------------------- public API

    @_one_blas_thread
    def forward(self, lora: Lora, token_ids: list[IntArray],
                target_tokens: list[IntArray]) -> list[FloatArray]:
        """Per datum, ``out[i] = log P(target_tokens[i] | token_ids[:i+1])`` (float64)."""
        return self._run(lora, token_ids, target_tokens, None, None, need_grad=False)[1]

    @_one_blas_thread
    def score(self, lora: Lora, token_ids: IntArray) -> FloatArray:
        """``out[i] = log P(token_ids[i] | token_ids[:i])`` for i >= 1; ``out[0]`` is NaN."""
        tokens_T = self._check_tokens(token_ids, "token_ids")
        out_T = np.full(len(tokens_T), np.nan)
        if 1 < len(tokens_T) <= _EMA_BLOCK + 1:
            out_T[1:] = self._score_short(self._compile(lora), tokens_T)
        elif len(tokens_T) > 1:
            out_T[1:] = self.forward(lora, [tokens_T[:-1]], [tokens_T[1:]])[0]
        return out_T

    def _score_short(self, weights: _Compiled, tokens_T: IntArray) -> FloatArray:
        """One short sequence (<= one EMA block) in a dozen numpy calls: the EMA is a product
        with the cached lower-triangular decay matrix instead of the blocked scan."""
        d, n = self.spec.embed_dim, len(tokens_T) - 1
        emb_N_D = self.embedding.lookup(tokens_T[:-1])
        x_N_F = np.empty((n, 3 * d + 1))
        x_N_F[:, :d] = emb_N_D
        x_N_F[0, d : 2 * d] = 0.0
        x_N_F[1:, d : 2 * d] = emb_N_D[:-1]
        x_N_F[:, 2 * d : 3 * d] = self._ema_matrix[:n, :n] @ emb_N_D
        x_N_F[:, 3 * d] = 1.0
        _, logits_N_K = self._logits(weights, x_N_F)
        # _logits keeps exp in range
        return self._log_prob(logits_N_K, np.log(np.exp(logits_N_K).sum(axis=1)),
                              self.buckets.bucket_of(tokens_T[1:]))

    @_one_blas_thread
    def loss_and_grad(self, lora: Lora, token_ids: list[IntArray],
                      loss_inputs: list[dict[str, FloatArray]], loss_function: str,
                      loss_config: dict[str, float], need_grad: bool) -> LossResult:
        """Loss (LOSS-1..5, summed, unnormalised), p per datum and, if ``need_grad``, the exact
        gradient of the loss w.r.t. every LoRA parameter (sums over datums, so GRAD-1 holds).

        Raises ``ValueError`` for an unknown loss or config, missing/undeclared inputs, wrong
        lengths or bad tokens, and :class:`NonFiniteLossError` for a non-finite result.
        """
        config = resolve_loss_config(loss_function, loss_config)
        targets, flat_inputs = flatten_loss_inputs(loss_function, token_ids, loss_inputs)
        result = self._run(lora, token_ids, targets, loss_function, (flat_inputs, config),
                           need_grad=need_grad)[0]
        assert result is not None
        return result

    def _run(self, lora: Lora, token_ids: Sequence[IntArray],
             target_tokens: Sequence[IntArray | FloatArray], loss_function: str | None,
             loss_args: tuple[dict[str, FloatArray], dict[str, float]] | None, *,
             need_grad: bool) -> tuple[LossResult | None, list[FloatArray]]:
        """Forward (+ loss, + backward) in chunks of ``_ROW_CHUNK`` positions, so the (rows, K)
        logits stay in cache from the matmul through softmax, loss and dL/dlogits."""
        if len(token_ids) != len(target_tokens):
            raise ValueError("token_ids and target_tokens differ in length")
        seqs = [self._check_tokens(t, "token_ids") for t in token_ids]
        tgts = [self._check_tokens(t, "target_tokens") for t in target_tokens]
        if any(len(seq) != len(tgt) for seq, tgt in zip(seqs, tgts, strict=False)):
            raise ValueError("target_tokens and token_ids differ in length")
        weights = self._compile(lora)
        x_N_F = self._features(seqs)
        target_N = np.concatenate(tgts) if tgts else np.zeros(0, dtype=np.int64)
        bucket_N = self.buckets.bucket_of(target_N)
        total, hidden = len(bucket_N), self.spec.hidden_dim
        logp_N = np.empty(total)
        loss = 0.0
        backward = need_grad and loss_function is not None
        grad_head = np.zeros_like(weights.head)  # dL/dW_head_eff (K, H)
        grad_mix_ext = np.zeros(weights.mix_ext.shape[::-1])  # dL/d[W_mix_eff | b_mix]
        for start in range(0, total, _ROW_CHUNK):
            rows = slice(start, min(start + _ROW_CHUNK, total))
            x_C_F, bucket_C = x_N_F[rows], bucket_N[rows]
            h_C_H1, logits_C_K = self._logits(weights, x_C_F)
            index_C = np.arange(len(bucket_C))
            target_logit_C = logits_C_K[index_C, bucket_C]
            probs_C_K = np.exp(logits_C_K, out=logits_C_K)  # unnormalised
            partition_C = probs_C_K.sum(axis=1)
            logp_C = logp_N[rows]
            np.subtract(target_logit_C, np.log(partition_C), out=logp_C)
            if not self.buckets.identity:
                logp_C -= self.buckets.log_sizes_K[bucket_C]
            if loss_function is None or loss_args is None:
                continue
            flat_inputs, config = loss_args
            chunk_loss, dloss_dp_C = loss_terms(
                loss_function, logp_C, {k: v[rows] for k, v in flat_inputs.items()}, config)
            if not (math.isfinite(chunk_loss) and np.isfinite(dloss_dp_C).all()):
                raise NonFiniteLossError(f"{loss_function} loss is not finite for these inputs")
            loss += chunk_loss
            if not backward:
                continue
            # Rows with dL/dp == 0 (masked prompt) add nothing: drop them when that pays.
            live_L = np.flatnonzero(dloss_dp_C)
            if len(live_L) < 0.8 * len(index_C):
                probs_C_K, h_C_H1, x_C_F, bucket_C = (
                    probs_C_K[live_L], h_C_H1[live_L], x_C_F[live_L], bucket_C[live_L])
                dloss_dp_C, partition_C = dloss_dp_C[live_L], partition_C[live_L]
            # dL/dlogits = g·(onehot(bucket) - softmax), built in place over the probabilities;
            # the -log|bucket| term of log p is a constant.
            probs_C_K *= (-dloss_dp_C / partition_C)[:, None]
            probs_C_K[np.arange(len(bucket_C)), bucket_C] += dloss_dp_C
            h_C_H = h_C_H1[:, :hidden]
            grad_head += probs_C_K.T @ h_C_H
            grad_pre_C_H = probs_C_K @ weights.head
            grad_pre_C_H *= 1.0 - h_C_H * h_C_H
            grad_mix_ext += grad_pre_C_H.T @ x_C_F
        logprobs = np.split(logp_N, np.cumsum([len(s) for s in seqs])[:-1]) if seqs else []
        if loss_function is None:
            return None, logprobs
        grads = self._lora_grads(lora, grad_mix_ext[:, :-1], grad_head) if backward else None
        return LossResult(loss=loss, logprobs=logprobs, grads=grads), logprobs

    def _lora_grads(self, lora: Lora, grad_mix: FloatArray,
                    grad_head: FloatArray) -> dict[str, FloatArray]:
        """dL/dA = s·Bᵀ·dL/dW_eff and dL/dB = s·dL/dW_eff·Aᵀ, per module."""
        s, p = lora.scale, lora.params
        grads: dict[str, FloatArray] = {}
        for module, grad_w in (("mixer", grad_mix), ("lm_head", grad_head)):
            a, b = p[lora_key(module, "A")], p[lora_key(module, "B")]
            grads[lora_key(module, "A")] = s * (b.T @ grad_w)
            grads[lora_key(module, "B")] = s * (grad_w @ a.T)
        if not all(np.isfinite(g).all() for g in grads.values()):
            raise NonFiniteLossError("gradient is not finite")
        return {k: grads[k] for k in p}

    @_one_blas_thread
    def sample(self, lora: Lora, prompt: IntArray, *, num_samples: int, max_tokens: int,
               temperature: float, top_k: int, top_p: float, seed: int | None,
               stop_token_ids: list[int]) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt`` (non-empty), all rows at once.

        Temperature, then top-k (0 = off, counted in ids), then top-p (1.0 = off);
        ``default_rng(seed)`` (VER-4). SAMPLE-1: a row ends at its first stop token (included,
        "stop") or after ``max_tokens`` ("length"). VER-3: reported logprobs are the
        temperature-1 untruncated policy's, equal to :meth:`score` on prompt + completion up to
        float rounding. A bucketed model draws a bucket, then an id uniformly within it.
        """
        prompt_T = self._check_tokens(prompt, "prompt")
        if len(prompt_T) == 0:
            raise ValueError("prompt must hold at least one token")
        weights = self._compile(lora)
        last_F = self._features([prompt_T])[-1]
        stepper = _Stepper(self, weights, last_F, num_samples)
        return sample_rows(self._logits(weights, last_F[None, :])[1][0], stepper.step,
                           num_samples=num_samples, max_tokens=max_tokens,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           stop_token_ids=stop_token_ids, buckets=self.buckets)

    def _step_tables(self, weights: _Compiled) -> tuple[FloatArray, ...]:
        """The mixer folded into per-token tables (then the head), cached with ``weights``.

        The mixer is linear before its tanh: with ``W = [W1; W2; W3; b]`` (``mix_ext``),
        ``x_t @ W = E[t]·W1 + E[t-1]·W2 + c_t·W3 + b`` and ``m_t = c_t·W3`` obeys the EMA's own
        recursion ``m_t = d·m_{t-1} + (1-d)·E[t]·W3``. So one gather of ``E[t] @ [W1 | (1-d)·W3 |
        W2]`` (bias folded into the first part) replaces the step's features and matmul;
        :meth:`.embedding.HashedEmbedding.project` projects its two small tables, never V rows.
        """
        tables = weights.step_tables.get("mixer")
        if tables is None:
            d, decay = self.spec.embed_dim, self.spec.ema_decay
            w1, w2, w3 = (weights.mix_ext[i * d : (i + 1) * d] for i in range(3))
            tables = self.embedding.project(np.hstack([w1, (1.0 - decay) * w3, w2]))
            hidden = weights.mix_ext.shape[1]
            tables[0][:, :hidden] += weights.mix_ext[3 * d]
            for table in tables:
                table.flags.writeable = False
            tables += (weights.head_ext,)  # C-ordered (see _compile_uncached)
            weights.step_tables["mixer"] = tables
        return tables


class _Stepper:
    """``sample``'s step: advances ``rows`` sequences by one token each, in preallocated
    buffers, with the mixer as gathers from :meth:`BaseModel._step_tables` (equal to the
    ``score`` path's matmul up to rounding). State: ``m = c·W3`` and ``E[previous]·W2``."""

    def __init__(self, model: BaseModel, weights: _Compiled, last_F: FloatArray,
                 rows: int) -> None:
        d, hidden = model.spec.embed_dim, model.spec.hidden_dim
        self.embedding, self.decay = model.embedding, model.spec.ema_decay
        tables = model._step_tables(weights)
        self.tables, self.head_ext = tables[:-1], tables[-1]
        self.row_max = weights.row_max
        mix_ext = weights.mix_ext
        self.ema_S_H = np.empty((rows, hidden))
        self.ema_S_H[:] = last_F[2 * d : 3 * d] @ mix_ext[2 * d : 3 * d]
        # Two gather buffers used in turn: the previous token's E·W2 part stays readable.
        self.gathered_2_S_X = np.empty((2, rows, 3 * hidden))
        self.gathered_2_S_X[1, :, 2 * hidden :] = last_F[:d] @ mix_ext[d : 2 * d]
        self.parts = [(g[:, :hidden], g[:, hidden : 2 * hidden], g[:, 2 * hidden :])
                      for g in self.gathered_2_S_X]
        self.hidden_S_H1 = np.ones((rows, hidden + 1))
        self.pre_S_H = self.hidden_S_H1[:, :hidden]
        self.logits_S_K = np.empty((rows, weights.head_ext.shape[1]))
        self.turn = 0

    def step(self, tokens_S: IntArray) -> FloatArray:
        """Next logits ``(S, K)`` after ``tokens_S`` (a buffer overwritten by the next call)."""
        turn, self.turn = self.turn, self.turn ^ 1
        own_S_H, ema_in_S_H, _ = self.parts[turn]
        previous_S_H = self.parts[turn ^ 1][2]
        self.embedding.lookup_projected(self.tables, tokens_S, out=self.gathered_2_S_X[turn])
        ema_S_H, pre_S_H = self.ema_S_H, self.pre_S_H
        ema_S_H *= self.decay
        ema_S_H += ema_in_S_H
        np.add(own_S_H, ema_S_H, out=pre_S_H)
        pre_S_H += previous_S_H
        np.tanh(pre_S_H, out=pre_S_H)
        logits_S_K = self.logits_S_K
        np.dot(self.hidden_S_H1, self.head_ext, out=logits_S_K)
        if self.row_max:
            logits_S_K -= logits_S_K.max(axis=1, keepdims=True)
        return logits_S_K


# --------------------------------------------------------------------------- model cache

_PINNED: dict[ModelSpec, BaseModel] = {}
_PINNED_LOCK = threading.Lock()


@functools.lru_cache(maxsize=_DECLARED_SLOTS)
def _declared_model(spec: ModelSpec) -> BaseModel:
    return BaseModel(spec)


def model_for_spec(spec: ModelSpec) -> BaseModel:
    """The (cached, shared, read-only) base model of any valid :class:`ModelSpec`: the built-in
    byte model or a declared one (``ModelSpec.declare``, ``spec_from_hf_folder``).

    Equal specs give the same object: built-in specs (those in ``BASE_MODEL_SPECS``) are kept
    for the life of the process, declared ones in an LRU of ``_DECLARED_SLOTS``. Weights depend
    only on the spec (seeded by SHA-256 of its id), so they are identical in every process.
    """
    model = _PINNED.get(spec)
    if model is not None:
        return model
    if BASE_MODEL_SPECS.get(spec.id) == spec:
        with _PINNED_LOCK:
            return _PINNED.setdefault(spec, BaseModel(spec))
    return _declared_model(spec)


def get_base_model(model: str | ModelSpec) -> BaseModel:
    """The (cached, shared, read-only) base model for a built-in id (KeyError if unknown) or
    for a spec (:func:`model_for_spec`)."""
    if isinstance(model, ModelSpec):
        return model_for_spec(model)
    if model not in BASE_MODEL_SPECS:
        raise KeyError(model)
    return model_for_spec(BASE_MODEL_SPECS[model])
