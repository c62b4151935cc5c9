"""Row 3: ``forward_backward`` compute against the bare matmuls the model needs.

Measured: ``BaseModel.loss_and_grad`` (features, EMA scan, forward, log-softmax, loss,
backward to the LoRA factors) on an ``importance_sampling`` batch with every position live,
and the whole executed primitive (the thunk ``prepare_forward`` returns: compute, gradient
accumulation, response rendering to JSON bytes). Floor: the same-shaped float64 matmuls and
nothing else: two forward projections, three backward products, the two LoRA merges and the
four LoRA factor gradients. Linearity: model time at 1x, 4x and 16x tokens against 4 and 16
times the 1x time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from mock_server.backend import schemas
from mock_server.backend.primitives import prepare_forward
from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_ID

from .body import backend_run
from .core import Config, Row, interleave, make_row
from .fixtures import forward_body

GOAL = 2.0
LINEAR_GOAL = 1.25


def arrays(datums: int, tokens: int,
           seed: int = 3) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    body = forward_body(np.random.default_rng(seed), datums, tokens)
    ids = [np.asarray(d["model_input"]["token_ids"], dtype=np.int64) for d in body["data"]]
    inputs = [{k: np.asarray(v, dtype=np.float64) for k, v in d["loss_inputs"].items()}
              for d in body["data"]]
    return ids, inputs


class MatmulFloor:
    """The float64 matmuls of one forward + backward pass over ``n`` positions."""

    def __init__(self, n: int, rank: int) -> None:
        spec = get_base_model(BASE_MODEL_ID).spec
        f, h, v = 3 * spec.embed_dim, spec.hidden_dim, spec.vocab_size
        rng = np.random.default_rng(0)
        self.x_N_F = rng.standard_normal((n, f))
        self.w_mix_H_F = rng.standard_normal((h, f))
        self.w_head_V_H = rng.standard_normal((v, h))
        self.h_N_H = rng.standard_normal((n, h))
        self.g_N_V = rng.standard_normal((n, v))
        self.g_N_H = rng.standard_normal((n, h))
        self.lora = {("mixer", "A"): rng.standard_normal((rank, f)),
                     ("mixer", "B"): rng.standard_normal((h, rank)),
                     ("lm_head", "A"): rng.standard_normal((rank, h)),
                     ("lm_head", "B"): rng.standard_normal((v, rank))}

    def __call__(self) -> None:
        p = self.lora
        p["mixer", "B"] @ p["mixer", "A"]
        p["lm_head", "B"] @ p["lm_head", "A"]
        self.x_N_F @ self.w_mix_H_F.T
        self.h_N_H @ self.w_head_V_H.T
        grad_head_V_H = self.g_N_V.T @ self.h_N_H
        self.g_N_V @ self.w_head_V_H
        grad_mix_H_F = self.g_N_H.T @ self.x_N_F
        for module, grad_w in (("mixer", grad_mix_H_F), ("lm_head", grad_head_V_H)):
            p[module, "B"].T @ grad_w
            grad_w @ p[module, "A"].T


def _model_call(cfg: Config, datums: int, tokens: int) -> Any:
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(cfg.lora_rank, 2.0 * cfg.lora_rank, seed=1)
    ids, inputs = arrays(datums, tokens)

    def call() -> None:
        model.loss_and_grad(lora, ids, inputs, "importance_sampling", {}, need_grad=True)

    return call


def _primitive_call(cfg: Config, datums: int, tokens: int) -> Any:
    backend, run = backend_run(cfg.lora_rank)
    body = schemas.validate(schemas.Forward,
                            forward_body(np.random.default_rng(3), datums, tokens))
    thunk = prepare_forward(backend, run, body, backward=True)

    def call() -> None:
        orjson.dumps(thunk(), option=orjson.OPT_SERIALIZE_NUMPY)

    return call


async def rows(cfg: Config) -> list[Row]:
    group = "3 compute"
    n = cfg.compute_datums * cfg.compute_tokens
    shape = f"{cfg.compute_datums} x {cfg.compute_tokens} tok"
    timings = await interleave({
        "model": _model_call(cfg, cfg.compute_datums, cfg.compute_tokens),
        "primitive": _primitive_call(cfg, cfg.compute_datums, cfg.compute_tokens),
        "floor": MatmulFloor(n, cfg.lora_rank),
    }, cfg)
    floor = timings["floor"].median_s
    out = [
        make_row(group, f"forward_backward model ({shape})", timings["model"].median_s, floor,
                 "s", GOAL, "BaseModel.loss_and_grad vs the same-shaped float64 matmuls"),
        make_row(group, f"forward_backward executed ({shape})", timings["primitive"].median_s,
                 floor, "s", None, "the primitive's thunk: compute + gradient accumulation + "
                 "logprobs rendered to JSON"),
    ]
    # All shapes in one interleaved comparison: a noisy neighbour then slows every size alike.
    fns: dict[str, Any] = {}
    for i, (datums, tokens) in enumerate(cfg.linear_shapes):
        fns[f"model{i}"] = _model_call(cfg, datums, tokens)
        fns[f"floor{i}"] = MatmulFloor(datums * tokens, cfg.lora_rank)
    t = await interleave(fns, cfg)
    base_tokens = cfg.linear_shapes[0][0] * cfg.linear_shapes[0][1]
    base_s = t["model0"].median_s
    for i, (datums, tokens) in enumerate(cfg.linear_shapes):
        factor = datums * tokens / base_tokens
        out.append(make_row(group, f"  model at {factor:g}x tokens ({datums} x {tokens})",
                            t[f"model{i}"].median_s, t[f"floor{i}"].median_s, "s", None,
                            "against its own matmul floor"))
    for i, (datums, tokens) in enumerate(cfg.linear_shapes[1:], start=1):
        factor = datums * tokens / base_tokens
        out.append(make_row(group, f"linearity: {factor:g}x tokens vs {factor:g} x (1x time)",
                            t[f"model{i}"].median_s, factor * base_s, "s", LINEAR_GOAL,
                            "ratio <= 1 means no worse than linear"))
    return out
