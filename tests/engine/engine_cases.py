"""Shared cases for the vocabulary-independent engine tests (not a test module).

Every vocabulary size the engine must serve, with EOS (and sometimes BOS) drawn at random
from a fixed seed, plus a declared 1000-id model squeezed into 7 buckets, whose buckets of
~143 ids make the bucket logic cheap to check by enumerating the vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mock_server.engine.model import BaseModel, get_base_model
from mock_server.engine.specs import Lora, ModelSpec

_RNG = np.random.default_rng(20240613)


def _ids(vocab: int, with_bos: bool) -> tuple[int, int | None]:
    eos = int(_RNG.integers(0, vocab))
    bos = int(_RNG.integers(0, vocab)) if with_bos else None
    return eos, bos


@dataclass(frozen=True)
class Case:
    label: str
    spec: ModelSpec

    @property
    def model(self) -> BaseModel:
        return get_base_model(self.spec)

    @property
    def vocab(self) -> int:
        return self.spec.vocab_size

    def __str__(self) -> str:
        return self.label


def _case(label: str, vocab: int, with_bos: bool, **dims: int) -> Case:
    eos, bos = _ids(vocab, with_bos)
    if "max_buckets" in dims:
        spec = ModelSpec(id=f"test/{label}", vocab_size=vocab, max_context=4096,
                         eos_token_id=eos, bos_token_id=bos, max_lora_rank=16, **dims)
    else:
        spec = ModelSpec.declare(f"test/{label}", vocab, eos, bos, max_context=4096,
                                 max_lora_rank=16)
    return Case(label, spec)


CASES: list[Case] = [
    _case("v2", 2, False),
    _case("v3", 3, True),
    _case("v32", 32, True),
    _case("v258-generic", 258, True),  # declared with the byte model's size: buckets, hashes
    _case("v1000", 1000, False),
    _case("v1000-k7", 1000, True, max_buckets=7),
    Case("v151936-qwen3", ModelSpec.declare("Qwen/Qwen3-4B", 151936, 151645, 151643,
                                            max_context=40960, max_lora_rank=16)),
    _case("v262144", 262144, True),
]
#: The cases whose full distribution is cheap to enumerate (one datum per id).
SMALL = [c for c in CASES if c.vocab <= 1000]
BIG = [c for c in CASES if c.vocab > 1000]


def perturbed_lora(model: BaseModel, seed: int, rank: int = 3, alpha: float = 6.0,
                   scale: float = 0.3) -> Lora:
    """A LoRA whose B is non-zero, so the adapter changes the model and every factor has a
    gradient."""
    lora = model.init_lora(rank, alpha, seed)
    rng = np.random.default_rng(seed + 1)
    return Lora(params={k: (a + scale * rng.standard_normal(a.shape) if ".lora_B." in k else a)
                        for k, a in lora.params.items()}, rank=rank, alpha=alpha)


def reference_bucket(spec: ModelSpec, token: int) -> tuple[int, int]:
    """(bucket, size) of one id, restated from the documented layout (ids in order, specials
    last, sizes differing by at most one), without the engine's vectorised code."""
    k = min(spec.vocab_size, spec.max_buckets)
    if spec.vocab_size <= spec.max_buckets:
        return token, 1
    specials = sorted(set(spec.special_token_ids))
    if token in specials:
        return k - len(specials) + specials.index(token), 1
    regular = spec.vocab_size - len(specials)
    regular_buckets = k - len(specials)
    rank = token - sum(1 for s in specials if s < token)
    bucket = rank * regular_buckets // regular
    first = math.ceil(bucket * regular / regular_buckets)
    last = math.ceil((bucket + 1) * regular / regular_buckets)
    return bucket, last - first


def reference_bucket_logprobs(model: BaseModel, lora: Lora | None,
                              tokens_T: np.ndarray) -> np.ndarray:
    """log_softmax over the K buckets after each prefix ``tokens_T[:t+1]``, one position at a
    time in plain numpy from the frozen arrays (embedding rows, mixer, head) and the factors."""
    emb = model.embed(tokens_T)
    w_mix, w_head = model.mixer_weight.copy(), model.head_weight.copy()
    if lora is not None:
        s = lora.alpha / lora.rank
        for name, w in (("mixer", w_mix), ("lm_head", w_head)):
            w += s * lora.params[f"base_model.model.{name}.lora_B.weight"] @ \
                lora.params[f"base_model.model.{name}.lora_A.weight"]
    decay = model.spec.ema_decay
    ema = np.zeros(emb.shape[1])
    prev = np.zeros(emb.shape[1])
    out = np.empty((len(tokens_T), w_head.shape[0]))
    for t in range(len(tokens_T)):
        ema = decay * ema + (1 - decay) * emb[t]
        x = np.concatenate([emb[t], prev, ema])
        h = np.tanh(w_mix @ x + model.mixer_bias)
        logits = w_head @ h + model.head_bias
        out[t] = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        prev = emb[t]
    return out


def reference_token_logprob(spec: ModelSpec, bucket_logprobs_K: np.ndarray, token: int) -> float:
    bucket, size = reference_bucket(spec, token)
    return float(bucket_logprobs_K[bucket] - math.log(size))


def next_token_logprobs(model: BaseModel, lora: Lora, prefix: np.ndarray,
                        ids: np.ndarray) -> np.ndarray:
    """log P(v | prefix) for each v in ``ids``, from ``forward`` (one datum per id)."""
    targets = np.zeros((len(ids), len(prefix)), dtype=np.int64)
    targets[:, -1] = ids
    out = model.forward(lora, [prefix] * len(ids), list(targets))
    return np.array([row[-1] for row in out])
