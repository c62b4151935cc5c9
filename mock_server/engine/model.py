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
from dataclasses import dataclass
from typing import Callable, ParamSpec, Sequence, TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from .losses import flatten_loss_inputs, loss_terms, resolve_loss_config
from .sampling import SampledSequence, sample_rows
from .specs import (BASE_MODEL_SPECS, BOS_TOKEN, EOS_TOKEN, VOCAB_SIZE, Lora, LossResult,
                    ModelSpec, NonFiniteLossError, lora_key)

__all__ = ["BaseModel", "get_base_model"]

_EMA_BLOCK = 64  # block length of the EMA scan; d**-63 ~ 1.3e6 keeps it well conditioned
_ROW_CHUNK = 1024  # rows of (rows, V) logits handled at once: ~2 MB, stays in cache
_COMPILED_SLOTS = 8  # adapters whose merged weights are kept (~0.3 MB each at rank 8)


@dataclass(frozen=True)
class _Compiled:
    """An adapter merged into matmul-ready weights: ``mix_ext`` (3D + 1, H) = [W_mix_effᵀ; b],
    ``head_ext`` (H + 1, V) = [W_head_effᵀ; b - shift], ``head`` = W_head_eff (V, H)."""

    mix_ext: np.ndarray
    head_ext: np.ndarray
    head: np.ndarray
    row_max: bool


def _prior_bias() -> np.ndarray:
    """``b_head``: log-odds of a plausible text prior over bytes, BOS and EOS."""
    bias_V = np.full(VOCAB_SIZE, -7.0)
    for chars, value in (
        (string.ascii_lowercase, 2.0), (" ", 2.5), (string.ascii_uppercase, 0.8),
        (string.digits, 1.0), (string.punctuation, 0.0), ("\n", 0.0),
    ):
        bias_V[[ord(c) for c in chars]] = value
    bias_V[BOS_TOKEN] = -12.0
    bias_V[EOS_TOKEN] = 1.9
    return bias_V


_BLAS = ThreadpoolController()
P = ParamSpec("P")
R = TypeVar("R")


def _one_blas_thread(method: Callable[P, R]) -> Callable[P, R]:
    """Run ``method`` with single-threaded BLAS.

    The matrices here are small: a second OpenBLAS thread gains little when idle, and on a
    shared 2-core CI machine its spin-waiting made forward_backward 2-10x slower (8 x 128
    tokens: 6 ms single-threaded, 14-70 ms with two threads). Restored on exit (~16 us).
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with _BLAS.limit(limits=1, user_api="blas"):
            return method(*args, **kwargs)

    return wrapper


class BaseModel:
    """A frozen base model; every method is a pure function of its arguments."""

    target_modules: tuple[str, ...] = ("mixer", "lm_head")

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        d, h, v = spec.embed_dim, spec.hidden_dim, spec.vocab_size
        seed = int.from_bytes(hashlib.sha256(spec.id.encode("utf-8")).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        # One extra all-zero row (index V) stands for "no previous token" and for padding.
        self.embed_ext = np.zeros((v + 1, d))
        self.embed_ext[:v] = rng.standard_normal((v, d))
        self.mixer_weight = rng.standard_normal((h, 3 * d)) / math.sqrt(3 * d)
        self.mixer_bias = rng.normal(0.0, 0.5, h)
        self.head_weight = rng.standard_normal((v, h)) * (1.5 / math.sqrt(h))
        self.head_bias = _prior_bias()
        for array in (self.embed_ext, self.mixer_weight, self.mixer_bias, self.head_weight,
                      self.head_bias):
            array.flags.writeable = False
        self.module_shapes: dict[str, tuple[int, int]] = {
            "mixer": (h, 3 * d),  # (out_features, in_features)
            "lm_head": (v, h),
        }
        # Merged weights of the last few adapters, keyed by identity: a sampler version is
        # scored many times, and its Lora is never mutated (optim_step builds a new one).
        self._compiled: dict[int, tuple[weakref.ref[Lora], _Compiled]] = {}
        self._compiled_lock = threading.Lock()
        decay, steps_K = spec.ema_decay, np.arange(_EMA_BLOCK)
        lags_K_K = steps_K[:, None] - steps_K[None, :]
        self._ema_matrix = np.where(lags_K_K >= 0,
                                    (1.0 - decay) * decay ** np.maximum(lags_K_K, 0), 0.0)
        self._ema_matrix.flags.writeable = False

    # ----------------------------------------------------------------------------- adapters

    def init_lora(self, rank: int, alpha: float, seed: int) -> Lora:
        """A fresh adapter: A ~ U(-1/sqrt(in), 1/sqrt(in)) from ``seed`` (PEFT's kaiming-uniform
        bound), B = 0. Same seed, same A. ``seed`` may be any int (reduced mod 2**64)."""
        if not 1 <= rank <= self.spec.max_lora_rank:
            raise ValueError(f"rank {rank} outside [1, {self.spec.max_lora_rank}]")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        rng = np.random.default_rng(int(seed) % (1 << 64))
        params: dict[str, np.ndarray] = {}
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

    def _merge(self, lora: Lora) -> tuple[np.ndarray, np.ndarray]:
        """(W_mixer_eff, W_head_eff) = W + alpha/r · B @ A for both modules."""
        self._check_lora(lora)
        p, s = lora.params, lora.scale
        return tuple(base + s * (p[lora_key(module, "B")] @ p[lora_key(module, "A")])
                     for module, base in (("mixer", self.mixer_weight),
                                          ("lm_head", self.head_weight)))

    def merged_weights(self, lora: Lora) -> dict[str, np.ndarray]:
        """Effective weights with the adapter merged (``W + alpha/r · B @ A``), plus the frozen
        ones, under the base model's own module names."""
        w_mix, w_head = self._merge(lora)
        return {"mixer.weight": w_mix, "lm_head.weight": w_head,
                "mixer.bias": self.mixer_bias.copy(), "lm_head.bias": self.head_bias.copy(),
                "embed_tokens.weight": self.embed_ext[:-1].copy()}

    # ----------------------------------------------------------------------------- kernels

    def _check_tokens(self, tokens: np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional")
        if arr.dtype.kind == "f":
            if not np.array_equal(arr.astype(np.int64), arr):
                raise ValueError(f"{what} must hold integers")
        elif arr.dtype.kind not in "iu" and arr.size:
            raise ValueError(f"{what} must hold integers")
        arr = arr.astype(np.int64, copy=False)
        if arr.size and (arr.min() < 0 or arr.max() >= self.spec.vocab_size):
            raise ValueError(f"{what} must lie in [0, {self.spec.vocab_size})")
        return arr

    def _ema(self, emb_B_T_D: np.ndarray, out_B_T_D: np.ndarray) -> None:
        """c_t = d·c_{t-1} + (1-d)·e_t along T (c_{-1} = 0), as a blocked closed-form scan:
        inside a block c_{s+i} = (1-d)·d^i·Σ_{j<=i} d^-j·e_{s+j} + d^(i+1)·c_{s-1}."""
        d = self.spec.ema_decay
        steps_K = np.arange(_EMA_BLOCK, dtype=np.float64)
        grow_K, shrink_K, carry_K = d**-steps_K, (1.0 - d) * d**steps_K, d ** (steps_K + 1.0)
        carry_B_D = None
        for start in range(0, emb_B_T_D.shape[1], _EMA_BLOCK):
            block = out_B_T_D[:, start : start + _EMA_BLOCK]
            k = block.shape[1]
            np.multiply(emb_B_T_D[:, start : start + k], grow_K[:k, None], out=block)
            np.cumsum(block, axis=1, out=block)
            block *= shrink_K[:k, None]
            if carry_B_D is not None:
                block += carry_K[:k, None] * carry_B_D[:, None, :]
            carry_B_D = block[:, -1]

    def _features(self, seqs: Sequence[np.ndarray]) -> np.ndarray:
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
        np.take(self.embed_ext, ids_B_T, axis=0, out=x_B_T_F[:, :, :d])
        x_B_T_F[:, 0, d : 2 * d] = 0.0
        x_B_T_F[:, 1:, d : 2 * d] = x_B_T_F[:, :-1, :d]
        self._ema(x_B_T_F[:, :, :d], x_B_T_F[:, :, 2 * d : 3 * d])
        x_B_T_F[:, :, 3 * d] = 1.0
        if valid_B_T.all():
            return x_B_T_F.reshape(-1, 3 * d + 1)
        return x_B_T_F[valid_B_T]

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

        The head bias is shifted by the static bound max_v(b_v + |W_v|_1) >= every logit
        (|h| <= 1), so no per-row max pass is needed; if the bound is loose enough to risk
        underflow of the whole partition function, fall back to per-row max subtraction.
        """
        w_mix, w_head = self._merge(lora)
        mix_ext = np.vstack([w_mix.T, self.mixer_bias[None, :]])
        spread_V = np.abs(w_head).sum(axis=1)
        upper = float((self.head_bias + spread_V).max())
        row_max = not upper - float((self.head_bias - spread_V).max()) < 650.0
        shift = 0.0 if row_max else upper
        head_ext = np.vstack([w_head.T, (self.head_bias - shift)[None, :]])
        return _Compiled(mix_ext=mix_ext, head_ext=head_ext, head=w_head, row_max=row_max)

    def _logits(self, weights: _Compiled, x_C_F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(h_ext (C, H + 1) with a constant-1 last column, logits (C, V) up to a row constant)."""
        hidden = weights.mix_ext.shape[1]
        h_C_H1 = np.empty((len(x_C_F), hidden + 1))
        np.tanh(x_C_F @ weights.mix_ext, out=h_C_H1[:, :hidden])
        h_C_H1[:, hidden] = 1.0
        logits_C_V = h_C_H1 @ weights.head_ext
        if weights.row_max:
            logits_C_V -= logits_C_V.max(axis=1, keepdims=True)
        return h_C_H1, logits_C_V

    # ----------------------------------------------------------------------------- public API

    @_one_blas_thread
    def forward(self, lora: Lora, token_ids: list[np.ndarray],
                target_tokens: list[np.ndarray]) -> list[np.ndarray]:
        """Per datum, ``out[i] = log P(target_tokens[i] | token_ids[:i+1])`` (float64)."""
        return self._run(lora, token_ids, target_tokens, None, None, need_grad=False)[1]

    @_one_blas_thread
    def score(self, lora: Lora, token_ids: np.ndarray) -> np.ndarray:
        """``out[i] = log P(token_ids[i] | token_ids[:i])`` for i >= 1; ``out[0]`` is NaN."""
        tokens_T = self._check_tokens(token_ids, "token_ids")
        out_T = np.full(len(tokens_T), np.nan)
        if 1 < len(tokens_T) <= _EMA_BLOCK + 1:
            out_T[1:] = self._score_short(self._compile(lora), tokens_T)
        elif len(tokens_T) > 1:
            out_T[1:] = self.forward(lora, [tokens_T[:-1]], [tokens_T[1:]])[0]
        return out_T

    def _score_short(self, weights: _Compiled, tokens_T: np.ndarray) -> np.ndarray:
        """One short sequence (<= one EMA block) in a dozen numpy calls: the EMA is a product
        with the cached lower-triangular decay matrix instead of the blocked scan."""
        d, n = self.spec.embed_dim, len(tokens_T) - 1
        emb_N_D = self.embed_ext[tokens_T[:-1]]
        x_N_F = np.empty((n, 3 * d + 1))
        x_N_F[:, :d] = emb_N_D
        x_N_F[0, d : 2 * d] = 0.0
        x_N_F[1:, d : 2 * d] = emb_N_D[:-1]
        x_N_F[:, 2 * d : 3 * d] = self._ema_matrix[:n, :n] @ emb_N_D
        x_N_F[:, 3 * d] = 1.0
        _, logits_N_V = self._logits(weights, x_N_F)
        target_N = logits_N_V[np.arange(n), tokens_T[1:]]
        return target_N - np.log(np.exp(logits_N_V).sum(axis=1))  # _logits keeps exp in range

    @_one_blas_thread
    def loss_and_grad(self, lora: Lora, token_ids: list[np.ndarray],
                      loss_inputs: list[dict[str, np.ndarray]], loss_function: str,
                      loss_config: dict[str, float], need_grad: bool) -> LossResult:
        """Loss (LOSS-1..5, summed, unnormalised), p per datum and, if ``need_grad``, the exact
        gradient of the loss w.r.t. every LoRA parameter (sums over datums, so GRAD-1 holds).

        Raises ``ValueError`` for an unknown loss or config, missing/undeclared inputs, wrong
        lengths or bad tokens, and :class:`NonFiniteLossError` for a non-finite result.
        """
        config = resolve_loss_config(loss_function, loss_config)
        targets, flat_inputs = flatten_loss_inputs(loss_function, token_ids, loss_inputs)
        return self._run(lora, token_ids, targets, loss_function, (flat_inputs, config),
                         need_grad=need_grad)[0]

    def _run(self, lora, token_ids, target_tokens, loss_function, loss_args, *, need_grad):
        """Forward (+ loss, + backward) in chunks of ``_ROW_CHUNK`` positions, so the (rows, V)
        logits stay in cache from the matmul through softmax, loss and dL/dlogits."""
        if len(token_ids) != len(target_tokens):
            raise ValueError("token_ids and target_tokens differ in length")
        seqs = [self._check_tokens(t, "token_ids") for t in token_ids]
        tgts = [self._check_tokens(t, "target_tokens") for t in target_tokens]
        if any(len(seq) != len(tgt) for seq, tgt in zip(seqs, tgts)):
            raise ValueError("target_tokens and token_ids differ in length")
        weights = self._compile(lora)
        x_N_F = self._features(seqs)
        target_N = np.concatenate(tgts) if tgts else np.zeros(0, dtype=np.int64)
        total, hidden = len(target_N), self.spec.hidden_dim
        logp_N = np.empty(total)
        loss = 0.0
        backward = need_grad and loss_function is not None
        if backward:
            grad_head = np.zeros_like(weights.head)  # dL/dW_head_eff (V, H)
            grad_mix_ext = np.zeros(weights.mix_ext.shape[::-1])  # dL/d[W_mix_eff | b_mix]
        for start in range(0, total, _ROW_CHUNK):
            rows = slice(start, min(start + _ROW_CHUNK, total))
            x_C_F, target_C = x_N_F[rows], target_N[rows]
            h_C_H1, logits_C_V = self._logits(weights, x_C_F)
            index_C = np.arange(len(target_C))
            target_logit_C = logits_C_V[index_C, target_C]
            probs_C_V = np.exp(logits_C_V, out=logits_C_V)  # unnormalised
            partition_C = probs_C_V.sum(axis=1)
            logp_C = logp_N[rows]
            np.subtract(target_logit_C, np.log(partition_C), out=logp_C)
            if loss_function is None:
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
                probs_C_V, h_C_H1, x_C_F, target_C = (
                    probs_C_V[live_L], h_C_H1[live_L], x_C_F[live_L], target_C[live_L])
                dloss_dp_C, partition_C = dloss_dp_C[live_L], partition_C[live_L]
            # dL/dlogits = g·(onehot - softmax), built in place over the probabilities.
            probs_C_V *= (-dloss_dp_C / partition_C)[:, None]
            probs_C_V[np.arange(len(target_C)), target_C] += dloss_dp_C
            h_C_H = h_C_H1[:, :hidden]
            grad_head += probs_C_V.T @ h_C_H
            grad_pre_C_H = probs_C_V @ weights.head
            grad_pre_C_H *= 1.0 - h_C_H * h_C_H
            grad_mix_ext += grad_pre_C_H.T @ x_C_F
        logprobs = np.split(logp_N, np.cumsum([len(s) for s in seqs])[:-1]) if seqs else []
        if loss_function is None:
            return None, logprobs
        grads = self._lora_grads(lora, grad_mix_ext[:, :-1], grad_head) if backward else None
        return LossResult(loss=loss, logprobs=logprobs, grads=grads), logprobs

    def _lora_grads(self, lora, grad_mix, grad_head) -> dict[str, np.ndarray]:
        """dL/dA = s·Bᵀ·dL/dW_eff and dL/dB = s·dL/dW_eff·Aᵀ, per module."""
        s, p = lora.scale, lora.params
        grads: dict[str, np.ndarray] = {}
        for module, grad_w in (("mixer", grad_mix), ("lm_head", grad_head)):
            a, b = p[lora_key(module, "A")], p[lora_key(module, "B")]
            grads[lora_key(module, "A")] = s * (b.T @ grad_w)
            grads[lora_key(module, "B")] = s * (grad_w @ a.T)
        if not all(np.isfinite(g).all() for g in grads.values()):
            raise NonFiniteLossError("gradient is not finite")
        return {k: grads[k] for k in p}

    @_one_blas_thread
    def sample(self, lora: Lora, prompt: np.ndarray, *, num_samples: int, max_tokens: int,
               temperature: float, top_k: int, top_p: float, seed: int | None,
               stop_token_ids: list[int]) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt`` (non-empty), all rows at once.

        Temperature, then top-k (0 = off), then top-p (1.0 = off); ``default_rng(seed)`` (VER-4).
        SAMPLE-1: a row ends at its first stop token (included, "stop") or after ``max_tokens``
        ("length"). VER-3: reported logprobs are the temperature-1 untruncated policy's, equal
        to :meth:`score` on prompt + completion up to float rounding.
        """
        prompt_T = self._check_tokens(prompt, "prompt")
        if len(prompt_T) == 0:
            raise ValueError("prompt must hold at least one token")
        weights = self._compile(lora)
        d, decay = self.spec.embed_dim, self.spec.ema_decay
        last_F = self._features([prompt_T])[-1]
        state = {"x_S_F": np.broadcast_to(last_F, (num_samples, len(last_F)))}

        def step(tokens_S: np.ndarray) -> np.ndarray:
            prev_S_F = state["x_S_F"]
            x_S_F = np.empty((len(tokens_S), 3 * d + 1))
            np.take(self.embed_ext, tokens_S, axis=0, out=x_S_F[:, :d])
            x_S_F[:, d : 2 * d] = prev_S_F[:, :d]
            ema_S_D = decay * prev_S_F[:, 2 * d : 3 * d]
            ema_S_D += (1.0 - decay) * x_S_F[:, :d]
            x_S_F[:, 2 * d : 3 * d] = ema_S_D
            x_S_F[:, 3 * d] = 1.0
            state["x_S_F"] = x_S_F
            return self._logits(weights, x_S_F)[1]

        return sample_rows(self._logits(weights, last_F[None, :])[1][0], step,
                           num_samples=num_samples, max_tokens=max_tokens,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           stop_token_ids=stop_token_ids)


@functools.lru_cache(maxsize=None)
def _cached_model(model_id: str) -> BaseModel:
    return BaseModel(BASE_MODEL_SPECS[model_id])


def get_base_model(model_id: str) -> BaseModel:
    """The (cached, shared, read-only) base model for ``model_id``; KeyError if unknown."""
    if model_id not in BASE_MODEL_SPECS:
        raise KeyError(model_id)
    return _cached_model(model_id)
