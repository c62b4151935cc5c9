"""Row 9: cost against the vocabulary size (issue 13: an engine whose cost does not grow with V).

Three declared base models with the vocabulary-independent architecture: V = 258 (a generic
model of the byte model's size, *not* the byte model), 151,936 (Qwen3) and 262,144. Each big
vocabulary is measured against the 258 figure of the same run (the "floor" column):

- ``forward_backward`` on 8 x 128 tokens (``BaseModel.loss_and_grad``, importance sampling,
  every position live, token ids drawn across the whole vocabulary);
- ``sample`` of 16 x 64 tokens (temperature 1, no truncation, no stop tokens, so every row
  generates exactly 64 tokens);
- memory per run: bytes of the LoRA parameters plus the two AdamW moments, and the
  ``tracemalloc`` delta of creating runs' state (``init_lora`` + ``AdamWState.zeros_like``);
- memory per saved version: bytes of the LoRA parameters, and the ``tracemalloc`` delta of
  the copies ``save_weights_for_sampler`` keeps (``Lora.copy``);
- the base model itself (weights and hashed embedding tables), for information: its tables
  grow as sqrt(V), a few hundred KiB at most.

Goal (issue 13): each big-vocabulary figure within 1.5x of the 258 one. Timings are process
CPU time, interleaved (see :mod:`.core`).
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mock_server.engine.model import BaseModel, get_base_model
from mock_server.engine.optim import AdamWState
from mock_server.engine.specs import Lora, ModelSpec

from .core import Config, Row, interleave, make_row

GOAL = 1.5
GROUP = "9 vocabulary"
#: (label, vocab_size, eos_token_id): the reference size first.
VOCABS: tuple[tuple[str, int, int], ...] = (
    ("258", 258, 257), ("151,936", 151936, 151645), ("262,144", 262144, 1),
)


@dataclass(frozen=True)
class Shapes:
    fb_datums: int = 8
    fb_tokens: int = 128
    sample_rows: int = 16
    sample_tokens: int = 64
    runs: int = 32
    versions: int = 200


FULL = Shapes()
TINY = Shapes(fb_datums=2, fb_tokens=16, sample_rows=2, sample_tokens=8, runs=2, versions=4)


def declared_model(vocab: int, eos: int) -> BaseModel:
    """A declared model of ``vocab`` ids, as ``--base-model`` would create it."""
    return get_base_model(ModelSpec.declare(f"bench/vocab-{vocab}", vocab, eos,
                                            max_context=4096))


def _forward_backward_call(model: BaseModel, lora: Lora, datums: int,
                           tokens: int) -> Callable[[], None]:
    rng = np.random.default_rng(3)
    vocab = model.spec.vocab_size
    ids = [rng.integers(0, vocab, tokens) for _ in range(datums)]
    inputs = [{"target_tokens": rng.integers(0, vocab, tokens).astype(np.float64),
               "logprobs": -rng.uniform(0.5, 6.0, tokens),
               "advantages": rng.standard_normal(tokens), "mask": np.ones(tokens)}
              for _ in range(datums)]

    def call() -> None:
        model.loss_and_grad(lora, ids, inputs, "importance_sampling", {}, need_grad=True)

    return call


def _sample_call(model: BaseModel, lora: Lora, rows: int, tokens: int) -> Callable[[], None]:
    prompt = np.random.default_rng(4).integers(0, model.spec.vocab_size, 8)

    def call() -> None:
        out = model.sample(lora, prompt, num_samples=rows, max_tokens=tokens, temperature=1.0,
                           top_k=0, top_p=1.0, seed=0, stop_token_ids=[])
        if len(out) != rows or {len(s.tokens) for s in out} != {tokens}:
            raise RuntimeError("sample returned the wrong shape")

    return call


def _traced(action: Callable[[], Any]) -> int:
    """Bytes still allocated after ``action`` (its result kept alive while measuring)."""
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        kept = action()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        del kept
        return after - before
    finally:
        tracemalloc.stop()


def _memory(model: BaseModel, rank: int, runs: int, versions: int) -> dict[str, float]:
    lora = model.init_lora(rank, 2.0 * rank, seed=1)
    moments = AdamWState.zeros_like(lora.params)
    state_bytes = sum(a.nbytes for a in lora.params.values())
    state_bytes += sum(a.nbytes for a in moments.m.values()) + sum(
        a.nbytes for a in moments.v.values())

    def create_runs() -> list[tuple[Lora, AdamWState]]:
        out = []
        for seed in range(runs):
            fresh = model.init_lora(rank, 2.0 * rank, seed=seed)
            out.append((fresh, AdamWState.zeros_like(fresh.params)))
        return out

    def save_versions() -> list[Lora]:
        return [lora.copy() for _ in range(versions)]

    base_bytes = sum(a.nbytes for a in vars(model).values() if isinstance(a, np.ndarray))
    base_bytes += sum(a.nbytes for a in vars(model.embedding).values()
                      if isinstance(a, np.ndarray))
    return {"run_bytes": float(state_bytes),
            "run_traced": _traced(create_runs) / runs,
            "version_bytes": float(sum(a.nbytes for a in lora.params.values())),
            "version_traced": _traced(save_versions) / versions,
            "base_bytes": float(base_bytes)}


async def rows(cfg: Config) -> list[Row]:
    shapes = TINY if cfg.name == "tiny" else FULL
    fb_datums, fb_tokens = shapes.fb_datums, shapes.fb_tokens
    sample_rows, sample_tokens = shapes.sample_rows, shapes.sample_tokens
    models = {label: declared_model(vocab, eos) for label, vocab, eos in VOCABS}
    loras = {label: model.init_lora(cfg.lora_rank, 2.0 * cfg.lora_rank, seed=1)
             for label, model in models.items()}
    # A trained-looking adapter (B non-zero), as after a few optimizer steps.
    for lora in loras.values():
        rng = np.random.default_rng(5)
        for key, value in lora.params.items():
            if ".lora_B." in key:
                value += 0.05 * rng.standard_normal(value.shape)
    fns: dict[str, Any] = {}
    for label, model in models.items():
        fns[f"fb {label}"] = _forward_backward_call(model, loras[label], fb_datums, fb_tokens)
        fns[f"sample {label}"] = _sample_call(model, loras[label], sample_rows, sample_tokens)
    timings = await interleave(fns, cfg)
    reference = VOCABS[0][0]
    out: list[Row] = []
    for what, shape, note in (
            ("fb", f"{fb_datums} x {fb_tokens} tok",
             "BaseModel.loss_and_grad (importance_sampling, every position live)"),
            ("sample", f"{sample_rows} x {sample_tokens} tok",
             "BaseModel.sample, temperature 1, no stop tokens")):
        name = "forward_backward" if what == "fb" else "sample"
        for label, _, _ in VOCABS[1:]:
            out.append(make_row(GROUP, f"{name} {shape}, V={label} vs V={reference}",
                                timings[f"{what} {label}"].median_s,
                                timings[f"{what} {reference}"].median_s, "s", GOAL,
                                f"{note}; K = {models[label].spec.num_buckets} buckets at "
                                f"V={label}, {models[reference].spec.num_buckets} at "
                                f"V={reference}"))
    memory = {label: _memory(model, cfg.lora_rank, shapes.runs, shapes.versions)
              for label, model in models.items()}
    base = memory[reference]
    for label, _, _ in VOCABS[1:]:
        here = memory[label]
        out += [
            make_row(GROUP, f"per run, LoRA + AdamW bytes, V={label} vs V={reference}",
                     here["run_bytes"], base["run_bytes"], "bytes", GOAL,
                     f"rank-{cfg.lora_rank} LoRA params + AdamW m and v"),
            make_row(GROUP, f"per run, traced, V={label} vs V={reference}",
                     here["run_traced"], base["run_traced"], "bytes", GOAL,
                     "tracemalloc delta per created run state (init_lora + AdamW moments)"),
            make_row(GROUP, f"per saved version, LoRA bytes, V={label} vs V={reference}",
                     here["version_bytes"], base["version_bytes"], "bytes", GOAL,
                     "the LoRA parameters a version keeps"),
            make_row(GROUP, f"per saved version, traced, V={label} vs V={reference}",
                     here["version_traced"], base["version_traced"], "bytes", GOAL,
                     "tracemalloc delta per Lora.copy (what save_weights_for_sampler keeps)"),
            make_row(GROUP, f"  base model weights, V={label} vs V={reference}",
                     here["base_bytes"], base["base_bytes"], "bytes", None,
                     "shared by every run; hashed embedding tables grow as sqrt(V)"),
        ]
    return out
