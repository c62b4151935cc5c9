"""The training primitives of one run: validation at submission, execution at its turn.

Each ``prepare_*`` function checks a validated body against the run's model and the limits
(422, refused before its turn, ORD-4) and returns a thunk. The thunk runs at the request's turn
in the ordered sequence; it either raises a state error (recorded as a failed operation) or
commits all of its changes at once, so a failure changes no training state (ERR-3).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine import model as nm
from . import schemas
from .errors import Conflict, NotFound, ValidationFailed

if TYPE_CHECKING:
    from .records import Run
    from .state import Backend

Thunk = Callable[[], dict[str, Any]]


@dataclass
class Version:
    """An immutable sampler snapshot (VER-2): LoRA parameters only, never base weights."""

    version: int
    step: int
    lora: nm.Lora
    created_at: str


@dataclass
class Checkpoint:
    checkpoint_id: str
    name: str
    run_id: str
    base_model: str
    step: int
    lora: nm.Lora
    optimizer: nm.AdamWState
    created_at: str


@dataclass
class Export:
    export_id: str
    files: dict[str, bytes] = field(default_factory=dict)


def _limit(message: str, **details: Any) -> ValidationFailed:
    return ValidationFailed(message, type="limit_exceeded", details=details)


def _check_tokens(token_ids: list[int], vocab_size: int, where: str) -> None:
    if token_ids and max(token_ids) >= vocab_size:
        bad = next(i for i, t in enumerate(token_ids) if t >= vocab_size)
        raise ValidationFailed(f"{where}[{bad}] = {token_ids[bad]} is outside the vocabulary "
                               f"[0, {vocab_size})", details={"loc": f"{where}[{bad}]",
                                                              "vocab_size": vocab_size})


def _loss_config(loss_function: str, given: dict[str, float]) -> dict[str, float]:
    """LOSS-6: known loss, known config keys, values inside [min, max]; defaults filled in."""
    spec = nm.LOSS_SPECS.get(loss_function)
    if spec is None:
        raise ValidationFailed(f"loss_function {loss_function!r} is not supported",
                               type="unsupported_loss_function",
                               details={"supported": sorted(nm.LOSS_SPECS)})
    config: dict[str, float] = {}
    for key, bounds in spec["config"].items():
        value = given.get(key, bounds["default"])
        if not bounds["min"] <= value <= bounds["max"]:
            raise ValidationFailed(f"loss_config.{key} = {value} is outside "
                                   f"[{bounds['min']}, {bounds['max']}]",
                                   details={"loc": f"loss_config.{key}"})
        config[key] = float(value)
    unknown = sorted(set(given) - set(spec["config"]))
    if unknown:
        raise ValidationFailed(f"loss_config key(s) {unknown} are not defined for {loss_function}",
                               details={"loc": "loss_config", "keys": unknown})
    return config


def prepare_forward(backend: "Backend", run: "Run", body: schemas.Forward, *,
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
    config = _loss_config(body.loss_function, body.loss_config)
    inputs_spec = nm.LOSS_SPECS[body.loss_function]["inputs"]
    allowed = set(inputs_spec["required"]) | set(inputs_spec["optional"])
    token_ids: list[np.ndarray] = []
    loss_inputs: list[dict[str, np.ndarray]] = []
    for i, datum in enumerate(body.data):
        ids = datum.model_input.token_ids
        where = f"data[{i}]"
        if not ids:
            raise ValidationFailed(f"{where}.model_input.token_ids is empty",
                                   details={"loc": f"{where}.model_input.token_ids"})
        if len(ids) > spec.max_context:
            raise _limit(f"{where} has {len(ids)} tokens, over max_context {spec.max_context}",
                         limit="max_context")
        # pydantic has checked every id is an int in [0, 2**63): fromiter is exact and ~2x
        # faster than asarray on a list; the upper bound is then one numpy max.
        ids_T = np.fromiter(ids, dtype=np.int64, count=len(ids))
        if ids_T.max() >= spec.vocab_size:
            _check_tokens(ids, spec.vocab_size, f"{where}.model_input.token_ids")
        unexpected = sorted(set(datum.loss_inputs) - allowed)
        if unexpected:
            raise ValidationFailed(f"{where}.loss_inputs {unexpected} are not inputs of "
                                   f"{body.loss_function}", type="unexpected_input",
                                   details={"loc": f"{where}.loss_inputs", "inputs": unexpected})
        missing = [name for name in inputs_spec["required"] if name not in datum.loss_inputs]
        if missing:
            raise ValidationFailed(f"{where}.loss_inputs is missing {missing}",
                                   details={"loc": f"{where}.loss_inputs", "missing": missing})
        arrays: dict[str, np.ndarray] = {}
        for name, values in datum.loss_inputs.items():
            if len(values) != len(ids):
                raise ValidationFailed(f"{where}.loss_inputs.{name} has {len(values)} entries, "
                                       f"token_ids has {len(ids)}",
                                       details={"loc": f"{where}.loss_inputs.{name}"})
            arrays[name] = np.fromiter(values, dtype=np.float64, count=len(values))
        targets = arrays["target_tokens"]
        if not np.array_equal(targets, np.round(targets)) or targets.min() < 0 \
                or targets.max() >= spec.vocab_size:
            raise ValidationFailed(f"{where}.loss_inputs.target_tokens must be token ids in "
                                   f"[0, {spec.vocab_size})",
                                   details={"loc": f"{where}.loss_inputs.target_tokens"})
        token_ids.append(ids_T)
        loss_inputs.append(arrays)

    def run_forward() -> dict[str, Any]:
        try:
            result = run.base.loss_and_grad(run.lora, token_ids, loss_inputs,
                                            body.loss_function, config, need_grad=backward)
        except nm.NonFiniteLossError as exc:
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


def prepare_optim_step(backend: "Backend", run: "Run", body: schemas.OptimStep) -> Thunk:
    """OPT-1..4: explicit AdamW, torch semantics, clipping, 409 ``no_gradients``."""
    hp = body.adamw.model_dump()

    def optim_step() -> dict[str, Any]:
        if run.grads is None:
            raise Conflict("no gradient accumulated since the last optim_step; call "
                           "forward_backward first", type="no_gradients")
        with np.errstate(all="ignore"):
            params, state, grad_norm, update_norm = nm.adamw_step(run.lora.params, run.grads,
                                                                  run.optimizer, **hp)
        finite = np.isfinite([grad_norm, update_norm]).all() and all(
            np.isfinite(a).all() for group in (params, state.m, state.v) for a in group.values())
        if not finite:  # nothing is assigned: the weights stay as they were (ERR-3)
            raise Conflict("this AdamW step would make the weights or moments non-finite "
                           "(check learning_rate, weight_decay and eps)",
                           type="non_finite_update")
        run.lora = nm.Lora(params=params, rank=run.lora.rank, alpha=run.lora.alpha)
        run.optimizer = state
        run.grads = None
        run.step += 1
        return {"step": run.step, "grad_norm": float(grad_norm), "update_norm": float(update_norm)}

    return optim_step


def prepare_save_weights(backend: "Backend", run: "Run",
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


def _version(run: "Run", version: int) -> Version:
    snapshot = run.versions.get(version)
    if snapshot is None:
        raise NotFound(f"version {version} has not been saved on run {run.run_id}",
                       type="version_not_found", details={"version": version})
    return snapshot


def prepare_sample(backend: "Backend", run: "Run", body: schemas.Sample) -> Thunk:
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


def prepare_logprobs(backend: "Backend", run: "Run", body: schemas.Logprobs) -> Thunk:
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


def prepare_save_state(backend: "Backend", run: "Run", body: schemas.SaveState) -> Thunk:
    """CKPT-1: weights, step and AdamW moments, restorable bit for bit."""

    def save_state() -> dict[str, Any]:
        checkpoint = Checkpoint(backend.new_id("ckpt"), body.name, run.run_id, run.base_model,
                                run.step, run.lora.copy(), run.optimizer.copy(),
                                backend.now_iso())
        backend.add_checkpoint(run, checkpoint)
        return {"checkpoint_id": checkpoint.checkpoint_id, "step": checkpoint.step}

    return save_state


def prepare_load_state(backend: "Backend", run: "Run", body: schemas.LoadState) -> Thunk:
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
            else nm.AdamWState.zeros_like(run.lora.params)
        return {"checkpoint_id": checkpoint.checkpoint_id, "step": run.step}

    return load_state


def prepare_export(backend: "Backend", run: "Run", body: schemas.ExportLora) -> Thunk:
    """EXPORT-1: PEFT ``adapter_model.safetensors`` + ``adapter_config.json``."""

    def export_lora() -> dict[str, Any]:
        files = peft_files(run)
        export = Export(backend.new_id("exp"), files)
        run.exports[export.export_id] = export
        return {
            "export_id": export.export_id,
            "format": "peft",
            "files": [{"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                      for name, data in files.items()],
        }

    return export_lora


def peft_files(run: "Run") -> dict[str, bytes]:
    """The adapter as PEFT writes it: float32 tensors under PEFT key names, and its config."""
    from safetensors.numpy import save

    tensors = {name: np.ascontiguousarray(value, dtype=np.float32)
               for name, value in run.lora.params.items()}
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": run.lora.rank,
        "lora_alpha": run.lora.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(run.base.target_modules),
        "base_model_name_or_path": run.base_model,
        "inference_mode": True,
    }
    return {
        "adapter_model.safetensors": save(tensors, metadata={"format": "pt"}),
        "adapter_config.json": json.dumps(config, indent=2, sort_keys=True).encode(),
    }


PREPARERS: dict[str, Callable[..., Thunk]] = {
    "forward": lambda b, r, body: prepare_forward(b, r, body, backward=False),
    "forward_backward": lambda b, r, body: prepare_forward(b, r, body, backward=True),
    "optim_step": prepare_optim_step,
    "save_weights_for_sampler": prepare_save_weights,
    "sample": prepare_sample,
    "logprobs": prepare_logprobs,
    "save_state": prepare_save_state,
    "load_state": prepare_load_state,
    "export_lora": prepare_export,
}
