"""CKPT-1 (save_state / load_state) and EXPORT-1 (PEFT export and its files)."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from ..context import Ctx, RunHandle, assert_close, assert_moved, expect_status
from ..payloads import adamw, ce_datum
from ..registry import CheckFailed, check


def _probe(ctx: Ctx, run: RunHandle) -> list[float]:
    return run.score(ctx.tokens("checkpoint probe"))


def _load(run: RunHandle, checkpoint_id: str, with_optimizer: bool) -> dict[str, Any]:
    return run.body("load_state", {"checkpoint_id": checkpoint_id,
                                   "with_optimizer": with_optimizer})


@check("CKPT-1", "with-optimizer", capability="primitives.load_state", title="load_state "
       "with_optimizer restores weights, step and AdamW moments: training continues bit for bit "
       "(and the restored run differs from a fresh one, its moments from fresh moments)")
def ckpt1_with_optimizer(ctx: Ctx) -> None:
    fresh = _probe(ctx, ctx.run(seed=71))
    run = ctx.run(seed=71)
    run.train(ctx.tokens("before the checkpoint"))
    saved = run.body("save_state", {"name": "ckpt-1"})
    if saved.get("step") != 1 or not isinstance(saved.get("checkpoint_id"), str):
        raise CheckFailed(f"save_state after one step answered {saved}")
    at_save = _probe(ctx, run)
    assert_moved(at_save, fresh, ctx.tol, "the run at save_state vs a fresh run")
    continued = run.train(ctx.tokens("after the checkpoint"), beta1=0.6)
    after_continue = _probe(ctx, run)
    assert_moved(after_continue, at_save, ctx.tol, "the step after save_state")
    loaded = _load(run, saved["checkpoint_id"], True)
    if (loaded.get("checkpoint_id"), loaded.get("step")) != (saved["checkpoint_id"], 1):
        raise CheckFailed(f"load_state answered {loaded}, expected the checkpoint id and step 1")
    if run.get()["step"] != 1:
        raise CheckFailed(f"run step after load_state is {run.view['step']}, expected 1")
    assert_close(_probe(ctx, run), at_save, ctx.tol, "logprobs after load_state vs at save")
    replayed = run.train(ctx.tokens("after the checkpoint"), beta1=0.6)
    for key in ("step", "grad_norm", "update_norm"):
        assert_close(replayed[key], continued[key], ctx.tol,
                     f"the step after load_state(with_optimizer) {key}", rel=ctx.tol)
    assert_close(_probe(ctx, run), after_continue, ctx.tol,
                 "logprobs of the continued training after load_state(with_optimizer)")
    # The moments are observable: the same step from fresh moments (t = 1) lands elsewhere.
    _load(run, saved["checkpoint_id"], False)
    run.train(ctx.tokens("after the checkpoint"), beta1=0.6)
    assert_moved(_probe(ctx, run), after_continue, ctx.tol, "the same step from the checkpoint "
                 "with fresh AdamW moments vs with the restored ones")


@check("CKPT-1", "without-optimizer", capability="primitives.load_state", title="load_state "
       "without optimizer resets AdamW moments and count (next step is a first step) and "
       "empties the gradient buffer")
def ckpt1_without_optimizer(ctx: Ctx) -> None:
    run = ctx.run(seed=73)
    run.train(ctx.tokens("warm up the moments"))
    checkpoint = run.body("save_state", {"name": "ckpt-2"})["checkpoint_id"]
    run.train(ctx.tokens("move away"))
    run.forward([ce_datum(ctx.tokens("pending gradient"))], backward=True)
    _load(run, checkpoint, False)
    run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    # With fresh moments and t = 1 the step does not depend on the betas (OPT-2); with the
    # checkpoint's moments (t = 2) it would.
    results = []
    for betas in ((0.9, 0.999), (0.3, 0.5)):
        _load(run, checkpoint, False)
        step = run.train(ctx.tokens("after reload"), beta1=betas[0], beta2=betas[1])
        results.append((step, _probe(ctx, run)))
    (a, a_lp), (b, b_lp) = results
    _load(run, checkpoint, False)
    assert_moved(a_lp, _probe(ctx, run), ctx.tol, "the first step after load_state")
    if a["step"] != 2 or b["step"] != 2:
        raise CheckFailed(f"steps after load_state at step 1 report {a['step']}, {b['step']}")
    assert_close(b["update_norm"], a["update_norm"], ctx.tol, "first step after "
                 "load_state(with_optimizer=false) with other betas: update_norm",
                 rel=1e-6 + ctx.tol)
    assert_close(b_lp, a_lp, ctx.tol, "logprobs after that step with other betas")


def parse_safetensors(blob: bytes) -> dict[str, dict[str, Any]]:
    """Header of a safetensors file: {name: {dtype, shape, data_offsets}} (format spec)."""
    if len(blob) < 8:
        raise CheckFailed("adapter_model.safetensors shorter than its header length")
    (size,) = struct.unpack("<Q", blob[:8])
    if 8 + size > len(blob):
        raise CheckFailed("safetensors header length exceeds the file")
    header = json.loads(blob[8:8 + size])
    header.pop("__metadata__", None)
    data_len = len(blob) - 8 - size
    for name, info in header.items():
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= data_len:
            raise CheckFailed(f"tensor {name}: data_offsets {info['data_offsets']} outside data")
    tensors: dict[str, dict[str, Any]] = header
    return tensors


@check("EXPORT-1", "peft", capability="primitives.export_lora", title="export_lora -> peft "
       "files whose bytes and sha256 match; lora_A/lora_B per target module; config r, "
       "lora_alpha, target_modules, base_model_name_or_path")
def export1_peft(ctx: Ctx) -> None:
    rank, alpha = ctx.lora_rank, 8.0
    run = ctx.run(rank=rank, alpha=alpha)
    run.train(ctx.tokens("export me"))
    export = run.body("export_lora")
    if export.get("format") != "peft" or not isinstance(export.get("export_id"), str):
        raise CheckFailed(f"export_lora answered {export}")
    files = {f["name"]: f for f in export.get("files") or []}
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        if name not in files:
            raise CheckFailed(f"export lacks {name}: {sorted(files)}")
    blobs = {}
    for name, meta in files.items():
        reply = ctx.wire.call("GET", f"/runs/{run.id}/exports/{export['export_id']}/{name}")
        expect_status(reply, 200, what=f"GET export file {name}")
        blobs[name] = reply.content
        if len(reply.content) != meta["bytes"]:
            raise CheckFailed(f"{name}: {len(reply.content)} bytes, export says {meta['bytes']}")
        digest = hashlib.sha256(reply.content).hexdigest()
        if digest != meta["sha256"]:
            raise CheckFailed(f"{name}: sha256 {digest}, export says {meta['sha256']}")
    config = json.loads(blobs["adapter_config.json"])
    expected = {"r": rank, "lora_alpha": alpha, "base_model_name_or_path": ctx.base_model["id"]}
    for key, value in expected.items():
        if config.get(key) != value:
            raise CheckFailed(f"adapter_config.json {key} is {config.get(key)!r}, expected "
                              f"{value!r}")
    modules = config.get("target_modules")
    if not isinstance(modules, list) or not modules:
        raise CheckFailed(f"adapter_config.json target_modules is {modules!r}")
    tensors = parse_safetensors(blobs["adapter_model.safetensors"])
    for module in modules:
        for part, axis in (("lora_A", 0), ("lora_B", 1)):
            names = [n for n in tensors if n.startswith("base_model.model.")
                     and n.endswith(f".{part}.weight") and f"{module}." in n]
            if not names:
                raise CheckFailed(f"no PEFT tensor base_model.model.…{module}.{part}.weight in "
                                  f"{sorted(tensors)}")
            for name in names:
                shape = tensors[name]["shape"]
                if len(shape) != 2 or shape[axis] != rank:
                    raise CheckFailed(f"{name} has shape {shape}; rank {rank} must be axis "
                                      f"{axis}")
    expect_status(ctx.wire.call("GET", f"/runs/{run.id}/exports/{export['export_id']}/"
                                       f"no_such_file.bin"), 404, what="unknown export file")
