"""The training primitives of one run, in one registry: ``PRIMITIVES`` pairs each primitive's
request model with its preparer. Capabilities, routes, fault targets and the request log read it.

A preparer checks a validated body against the run's model and the limits (422, refused before
its turn, ORD-4) and returns a thunk. The thunk runs at the request's turn in the ordered
sequence; it either raises a state error (recorded as a failed operation) or commits all of its
changes at once, so a failure changes no training state (ERR-3).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine import losses
from ..engine.optim import AdamWState, adamw_step
from ..engine.peft import peft_files
from ..engine.specs import Lora, NonFiniteLossError
from . import schemas
from .errors import Conflict, NotFound, ValidationFailed
from .records import Checkpoint, Export, Run, Thunk, Version

if TYPE_CHECKING:
    from .state import Backend

__all__ = ["PRIMITIVES", "Primitive", "prepare_forward"]


@dataclass(frozen=True)
class Primitive:
    """One ordered primitive: ``POST /runs/{run_id}/<name>`` with a ``body`` request model;
    ``prepare(backend, run, body)`` validates it and returns the thunk run at its turn."""

    name: str
    body: type[schemas.Body]
    prepare: Callable[[Backend, Run, Any], Thunk]


def _limit(message: str, **details: Any) -> ValidationFailed:
    return ValidationFailed(message, type="limit_exceeded", details=details)


def _check_tokens(token_ids: list[int], vocab_size: int, where: str) -> None:
    """Every id below ``vocab_size`` (the request model has checked they are ints >= 0)."""
    if token_ids and max(token_ids) >= vocab_size:
        bad = next(i for i, t in enumerate(token_ids) if t >= vocab_size)
        raise ValidationFailed(f"{where}[{bad}] = {token_ids[bad]} is outside the vocabulary "
                               f"[0, {vocab_size})", details={"loc": f"{where}[{bad}]",
                                                              "vocab_size": vocab_size})


def _loss_rule(exc: losses.LossRequestError) -> ValidationFailed:
    """LOSS-6: a broken loss rule as the contract's 422."""
    error_type = {"unsupported": "unsupported_loss_function",
                  "unexpected_input": "unexpected_input"}.get(exc.kind, "validation_error")
    details = dict(exc.details) if exc.loc is None else {"loc": exc.loc, **exc.details}
    return ValidationFailed(str(exc), type=error_type, details=details)


def _token_values(arrays: list[np.ndarray], vocab_size: int) -> bool:
    """Whether every value is an integral token id in ``[0, vocab_size)``."""
    values = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    return len(values) > 0 and bool(np.array_equal(values, np.round(values)) and values.min() >= 0
                and values.max() < vocab_size)


def prepare_forward(backend: Backend, run: Run, body: schemas.Forward, *,
                    backward: bool) -> Thunk:
    """``forward`` / ``forward_backward``: loss, per-position logprobs, gradient (GRAD-1)."""
    spec = run.base.spec
    limits = backend.limits
    if len(body.data) > limits.max_datums_per_request:
        raise _limit(f"{len(body.data)} datums exceed max_datums_per_request "
                     f"{limits.max_datums_per_request}", limit="max_datums_per_request")
    total = sum(len(d.model_input.token_ids) for d in body.data)
    if total > limits.max_tokens_per_request:
        raise _limit(f"{total} tokens exceed max_tokens_per_request "
                     f"{limits.max_tokens_per_request}", limit="max_tokens_per_request")
    try:
        config = losses.resolve_loss_config(body.loss_function, body.loss_config)
    except losses.LossRequestError as exc:
        raise _loss_rule(exc) from None
    # Arrays from the body's decoding pass (schemas.decode), else built here once.
    token_ids, loss_inputs = schemas.forward_arrays(body)
    # Every datum's limits, token ids and targets checked at once; only a body that breaks
    # one is walked datum by datum, so the first problem is the one reported.
    targets = [inputs.get("target_tokens") for inputs in loss_inputs]
    clean = max(len(ids) for ids in token_ids) <= spec.max_context \
        and int(np.concatenate(token_ids).max()) < spec.vocab_size \
        and all(t is not None for t in targets) \
        and _token_values([t for t in targets if t is not None], spec.vocab_size)
    for i, (ids_T, arrays) in enumerate(zip(token_ids, loss_inputs, strict=False)):
        where = f"data[{i}]"
        if not clean:
            if len(ids_T) > spec.max_context:
                raise _limit(f"{where} has {len(ids_T)} tokens, over max_context "
                             f"{spec.max_context}", limit="max_context")
            if ids_T.max() >= spec.vocab_size:
                _check_tokens(ids_T.tolist(), spec.vocab_size, f"{where}.model_input.token_ids")
        try:
            losses.check_inputs(body.loss_function, arrays, len(ids_T), where)
        except losses.LossRequestError as exc:
            raise _loss_rule(exc) from None
        if not clean and not _token_values([arrays["target_tokens"]], spec.vocab_size):
            raise ValidationFailed(f"{where}.loss_inputs.target_tokens must be token ids in "
                                   f"[0, {spec.vocab_size})",
                                   details={"loc": f"{where}.loss_inputs.target_tokens"})

    def run_forward() -> dict[str, Any]:
        try:
            result = run.base.loss_and_grad(run.lora, token_ids, loss_inputs,
                                            body.loss_function, config, need_grad=backward)
        except NonFiniteLossError as exc:
            raise Conflict(f"the loss is not finite for the current weights and these inputs "
                           f"(check logprobs and advantages): {exc}",
                           type="non_finite_loss") from None
        loss = float(result.loss)
        if backward and result.grads is not None:
            run.accumulate(result.grads)
        return {
            "loss": loss,
            "metrics": {"loss:sum": loss, "tokens": total},
            "outputs": [{"logprobs": lp.tolist()} for lp in result.logprobs],
        }

    return run_forward


def prepare_optim_step(backend: Backend, run: Run, body: schemas.OptimStep) -> Thunk:
    """OPT-1..4: explicit AdamW, torch semantics, clipping, 409 ``no_gradients``."""
    hp = body.adamw.model_dump()

    def optim_step() -> dict[str, Any]:
        if run.grads is None:
            raise Conflict("no gradient accumulated since the last optim_step; call "
                           "forward_backward first", type="no_gradients")
        with np.errstate(all="ignore"):
            params, state, grad_norm, update_norm = adamw_step(run.lora.params, run.grads,
                                                               run.optimizer, **hp)
        finite = np.isfinite([grad_norm, update_norm]).all() and all(
            np.isfinite(a).all() for group in (params, state.m, state.v) for a in group.values())
        if not finite:  # nothing is assigned: the weights stay as they were (ERR-3)
            raise Conflict("this AdamW step would make the weights or moments non-finite "
                           "(check learning_rate, weight_decay and eps)",
                           type="non_finite_update")
        run.lora = Lora(params=params, rank=run.lora.rank, alpha=run.lora.alpha)
        run.optimizer = state
        run.grads = None
        run.step += 1
        return {"step": run.step, "grad_norm": float(grad_norm), "update_norm": float(update_norm)}

    return optim_step


def prepare_save_weights(backend: Backend, run: Run,
                         body: schemas.SaveWeightsForSampler) -> Thunk:
    """VER-1: versions strictly increase; snapshots are copies (VER-2)."""

    def save_weights_for_sampler() -> dict[str, Any]:
        if run.versions and body.version <= max(run.versions):
            raise Conflict(f"version {body.version} is not above the latest saved version "
                           f"{max(run.versions)}", type="version_conflict",
                           details={"latest_version": max(run.versions)})
        if len(run.versions) >= backend.limits.max_versions_per_run:
            raise Conflict(f"the run already keeps {len(run.versions)} versions "
                           f"(max_versions_per_run)", type="quota_exceeded",
                           details={"limit": "max_versions_per_run"})
        run.versions[body.version] = Version(body.version, run.step, run.lora.copy(),
                                             backend.now_iso())
        return {"version": body.version, "step": run.step}

    return save_weights_for_sampler


def _version(run: Run, version: int) -> Version:
    snapshot = run.versions.get(version)
    if snapshot is None:
        raise NotFound(f"version {version} has not been saved on run {run.run_id}",
                       type="version_not_found", details={"version": version})
    return snapshot


def prepare_sample(backend: Backend, run: Run, body: schemas.Sample) -> Thunk:
    """SAMPLE-1, VER-2, VER-3, VER-4."""
    spec = run.base.spec
    limits = backend.limits
    sampling = body.sampling
    prompt = body.prompt.token_ids
    _check_tokens(prompt, spec.vocab_size, "prompt.token_ids")
    stop = [spec.eos_token_id] if sampling.stop_token_ids is None else sampling.stop_token_ids
    _check_tokens(stop, spec.vocab_size, "sampling.stop_token_ids")
    if sampling.top_k > spec.vocab_size:
        raise ValidationFailed(f"sampling.top_k must lie in [0, {spec.vocab_size}]",
                               details={"loc": "sampling.top_k"})
    if body.num_samples > limits.max_num_samples:
        raise _limit(f"num_samples {body.num_samples} exceeds max_num_samples "
                     f"{limits.max_num_samples}", limit="max_num_samples")
    if sampling.max_tokens > limits.max_sample_tokens:
        raise _limit(f"max_tokens {sampling.max_tokens} exceeds max_sample_tokens "
                     f"{limits.max_sample_tokens}", limit="max_sample_tokens")
    if len(prompt) + sampling.max_tokens > spec.max_context:
        raise _limit(f"prompt ({len(prompt)}) + max_tokens ({sampling.max_tokens}) exceeds "
                     f"max_context {spec.max_context}", limit="max_context")
    prompt_T = np.asarray(prompt, dtype=np.int64)

    def sample() -> dict[str, Any]:
        snapshot = _version(run, body.version)
        seed = sampling.seed if sampling.seed is not None else backend.fresh_seed()
        sequences = run.base.sample(snapshot.lora, prompt_T, num_samples=body.num_samples,
                                    max_tokens=sampling.max_tokens,
                                    temperature=sampling.temperature, top_k=sampling.top_k,
                                    top_p=sampling.top_p, seed=seed, stop_token_ids=list(stop))
        return {
            "version": snapshot.version,
            "step": snapshot.step,
            "sequences": [{"tokens": s.tokens.tolist(), "logprobs": s.logprobs.tolist(),
                           "stop_reason": s.stop_reason} for s in sequences],
        }

    return sample


def prepare_logprobs(backend: Backend, run: Run, body: schemas.Logprobs) -> Thunk:
    """Score ``token_ids`` with the weights saved as ``version`` (VER-2, VER-3)."""
    spec = run.base.spec
    _check_tokens(body.token_ids, spec.vocab_size, "token_ids")
    if len(body.token_ids) > spec.max_context:
        raise _limit(f"{len(body.token_ids)} tokens exceed max_context {spec.max_context}",
                     limit="max_context")
    if len(body.token_ids) > backend.limits.max_tokens_per_request:
        raise _limit("token_ids exceed max_tokens_per_request", limit="max_tokens_per_request")
    ids_T = np.asarray(body.token_ids, dtype=np.int64)

    def logprobs() -> dict[str, Any]:
        snapshot = _version(run, body.version)
        scores_T = run.base.score(snapshot.lora, ids_T)
        values: list[float | None] = scores_T.tolist()
        values[0] = None
        return {"version": snapshot.version, "step": snapshot.step, "logprobs": values}

    return logprobs


def prepare_save_state(backend: Backend, run: Run, body: schemas.SaveState) -> Thunk:
    """CKPT-1: weights, step and AdamW moments, restorable bit for bit."""

    def save_state() -> dict[str, Any]:
        checkpoint = Checkpoint(backend.new_id("ckpt"), body.name, run.run_id, run.base_model,
                                run.step, run.lora.copy(), run.optimizer.copy(),
                                backend.now_iso())
        backend.add_checkpoint(run, checkpoint)
        return {"checkpoint_id": checkpoint.checkpoint_id, "step": checkpoint.step}

    return save_state


def prepare_load_state(backend: Backend, run: Run, body: schemas.LoadState) -> Thunk:
    """CKPT-1: restore weights and step; the optimizer too when ``with_optimizer``."""

    def load_state() -> dict[str, Any]:
        checkpoint = backend.find_checkpoint(run.key, body.checkpoint_id)
        if checkpoint is None:
            raise NotFound(f"checkpoint {body.checkpoint_id!r} not found",
                           type="checkpoint_not_found")
        if checkpoint.base_model != run.base_model or checkpoint.lora.rank != run.lora.rank:
            raise Conflict("checkpoint was saved from a run with another base model or LoRA "
                           "rank", type="checkpoint_incompatible",
                           details={"base_model": checkpoint.base_model,
                                    "rank": checkpoint.lora.rank})
        run.lora = checkpoint.lora.copy()
        run.step = checkpoint.step
        run.grads = None
        run.optimizer = checkpoint.optimizer.copy() if body.with_optimizer \
            else AdamWState.zeros_like(run.lora.params)
        return {"checkpoint_id": checkpoint.checkpoint_id, "step": run.step}

    return load_state


def prepare_export(backend: Backend, run: Run, body: schemas.ExportLora) -> Thunk:
    """EXPORT-1: PEFT ``adapter_model.safetensors`` + ``adapter_config.json``."""

    def export_lora() -> dict[str, Any]:
        files = peft_files(run.lora.params, rank=run.lora.rank, alpha=run.lora.alpha,
                           target_modules=run.base.target_modules, base_model=run.base_model)
        export = Export(backend.new_id("exp"), files)
        run.exports[export.export_id] = export
        return {
            "export_id": export.export_id,
            "format": "peft",
            "files": [{"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                      for name, data in files.items()],
        }

    return export_lora


#: Every primitive, in the order the capabilities document lists them.
PRIMITIVES: dict[str, Primitive] = {p.name: p for p in (
    Primitive("forward", schemas.Forward, functools.partial(prepare_forward, backward=False)),
    Primitive("forward_backward", schemas.Forward,
              functools.partial(prepare_forward, backward=True)),
    Primitive("optim_step", schemas.OptimStep, prepare_optim_step),
    Primitive("save_weights_for_sampler", schemas.SaveWeightsForSampler, prepare_save_weights),
    Primitive("sample", schemas.Sample, prepare_sample),
    Primitive("logprobs", schemas.Logprobs, prepare_logprobs),
    Primitive("save_state", schemas.SaveState, prepare_save_state),
    Primitive("load_state", schemas.LoadState, prepare_load_state),
    Primitive("export_lora", schemas.ExportLora, prepare_export),
)}
