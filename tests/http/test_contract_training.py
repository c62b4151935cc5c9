"""Contract rules LOSS-1..6, GRAD-1, OPT-1..4 over HTTP (VER-*, SAMPLE-1, CKPT-1, EXPORT-1 are
in test_contract_versions.py).

References are independent of the mock's code: losses are recomputed per position from the
returned logprobs with the contract's formulas, and AdamW is written out from the torch docs.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from conftest import (
    ADAMW,
    API,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    params_of,
    rl_datum,
    state_snapshot,
    text_tokens,
)

TEXTS = ["the cat sat", "on a mat!", "Whitney 42"]
CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def ce_body(texts: list[str], loss: str = "cross_entropy") -> dict[str, Any]:
    return {"loss_function": loss, "loss_config": {},
            "data": [ce_datum(text_tokens(t)) for t in texts]}


# -- LOSS-1..5: value recomputed from the returned per-position logprobs ------------------
def reference_loss(name: str, p: float, inputs: dict[str, float],
                   config: dict[str, float]) -> float:
    """One position's term of the contract's loss (§4), written from the formula."""
    if name == "cross_entropy":
        return -inputs.get("weights", 1.0) * p
    m, q, a = inputs.get("mask", 1.0), inputs["logprobs"], inputs["advantages"]
    r = math.exp(p - q)
    lo, hi = config.get("clip_low_threshold"), config.get("clip_high_threshold")
    if name == "importance_sampling":
        return -m * r * a
    if name == "ppo":
        return -m * min(r * a, min(max(r, lo), hi) * a)
    if name == "cispo":
        return -m * min(max(r, lo), hi) * p * a
    if name == "dro":
        return -m * (p * a - config["beta"] / 2 * (p - q) ** 2)
    raise AssertionError(name)


LOSS_CASES = [
    ("cross_entropy", {}, {}),
    ("cross_entropy", {}, {"weights": True}),
    ("importance_sampling", {}, {}),
    ("ppo", {}, CLIP_DEFAULTS),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05},
     {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
    ("cispo", {}, CLIP_DEFAULTS),
    ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5},
     {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
    ("dro", {}, {"beta": 0.05}),
    ("dro", {"beta": 2.5}, {"beta": 2.5}),
]


@pytest.mark.parametrize("loss,config,effective", LOSS_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LOSS_CASES)])
def test_loss_1_to_5_value_matches_formula(run, loss, config, effective):
    """LOSS-1 cross_entropy, LOSS-2 importance_sampling, LOSS-3 ppo, LOSS-4 cispo, LOSS-5 dro."""
    rng = np.random.default_rng(len(loss) * 7 + len(config))
    current = run.ok("forward", ce_body(TEXTS))["outputs"]
    data, flat_inputs = [], []
    for d, text in enumerate(TEXTS):
        tokens = text_tokens(text)
        n = len(tokens) - 1
        p0 = np.asarray(current[d]["logprobs"])
        inputs: dict[str, list[float]] = {"target_tokens": tokens[1:]}
        if loss == "cross_entropy":
            if effective.get("weights"):
                inputs["weights"] = rng.uniform(-0.5, 2.0, n).round(3).tolist()
        else:  # ratios r = exp(p - q) on both sides of any clip range, advantages of both signs
            inputs["logprobs"] = (p0 + rng.uniform(-0.8, 0.8, n)).tolist()
            inputs["advantages"] = rng.choice([-1.5, -0.25, 0.5, 2.0], n).tolist()
            if d != 1:  # datum 1 has no mask: the default 1 applies
                inputs["mask"] = rng.choice([0.0, 1.0, 1.0], n).tolist()
        data.append({"model_input": {"token_ids": tokens[:-1]}, "loss_inputs": inputs})
        flat_inputs.append(inputs)
    body = {"loss_function": loss, "loss_config": config, "data": data}
    for primitive in ("forward", "forward_backward"):
        result = run.ok(primitive, body)
        expected, positions, ratios = 0.0, 0, []
        for output, inputs in zip(result["outputs"], flat_inputs, strict=True):
            assert len(output["logprobs"]) == len(inputs["target_tokens"])
            for i, p in enumerate(output["logprobs"]):
                position = {k: v[i] for k, v in inputs.items() if k != "target_tokens"}
                expected += reference_loss(loss, p, position, effective)
                if "logprobs" in position:
                    ratios.append(math.exp(p - position["logprobs"]))
                positions += 1
        assert result["loss"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert result["metrics"]["loss:sum"] == result["loss"]
        assert result["metrics"]["tokens"] == positions
        if "clip_low_threshold" in effective:  # the clip is actually exercised
            assert min(ratios) < effective["clip_low_threshold"]
            assert max(ratios) > effective["clip_high_threshold"]


def test_loss_outputs_are_current_policy_logprobs(run):
    """p in forward outputs is log P(target_i | tokens[:i+1]) = logprobs primitive's i + 1."""
    run.ok("forward_backward", ce_body(TEXTS))
    run.ok("optim_step", {"adamw": ADAMW})
    run.ok("save_weights_for_sampler", {"version": 0})
    outputs = run.ok("forward", ce_body(TEXTS))["outputs"]
    tol = run.client.get(f"{API}/capabilities").json()["features"]["logprob_tolerance"]
    for text, output in zip(TEXTS, outputs, strict=False):
        scored = run.ok("logprobs", {"version": 0, "token_ids": text_tokens(text)})["logprobs"]
        assert scored[0] is None
        assert np.max(np.abs(np.asarray(scored[1:]) - output["logprobs"])) <= tol


# -- LOSS-6 -----------------------------------------------------------------------------------
def _rl_body(**changes: Any) -> dict[str, Any]:
    tokens = text_tokens("abc")
    inputs = {"target_tokens": tokens[1:], "logprobs": [-1.0] * 3, "advantages": [1.0] * 3}
    inputs.update(changes.pop("inputs", {}))
    for name in changes.pop("drop", []):
        del inputs[name]
    body = {"loss_function": "ppo", "loss_config": {},
            "data": [{"model_input": {"token_ids": tokens[:-1]}, "loss_inputs": inputs}]}
    body.update(changes)
    return body


@pytest.mark.parametrize("body,error_type", [
    (_rl_body(loss_function="grpo"), "unsupported_loss_function"),
    (_rl_body(loss_config={"clip_ratio": 0.2}), None),
    (_rl_body(loss_config={"clip_low_threshold": 1.5}), None),
    (_rl_body(loss_config={"clip_high_threshold": 0.5}), None),
    (_rl_body(loss_function="dro", loss_config={"beta": -1.0}), None),
    (_rl_body(drop=["advantages"]), None),
    (_rl_body(drop=["target_tokens"]), None),
    (_rl_body(inputs={"advantages": [1.0, 1.0]}), None),
    (_rl_body(inputs={"mask": [1.0] * 4}), None),
    (_rl_body(inputs={"weights": [1.0] * 3}), "unexpected_input"),
    (_rl_body(inputs={"target_tokens": [97, 98, 258]}), None),
    (_rl_body(inputs={"target_tokens": [97, 98.5, 99]}), None),
    (_rl_body(loss_function="cross_entropy", drop=["logprobs", "advantages"],
              inputs={"mask": [1.0] * 3}), "unexpected_input"),
    ({k: v for k, v in _rl_body().items() if k != "loss_config"}, None),
    (_rl_body(data=[]), None),
], ids=lambda v: v if isinstance(v, str) else None)
def test_loss_6_bad_loss_requests_are_422_without_effect(mock, run, body, error_type):
    run.ok("forward_backward", ce_body(TEXTS))
    before = state_snapshot(mock.backend, run.run_id)
    for primitive in ("forward", "forward_backward"):
        expect_error(run.post(primitive, body, seq=2), 422, error_type)
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


def test_loss_6_non_finite_number_in_inputs_is_422(mock, run):
    before = state_snapshot(mock.backend, run.run_id)
    raw = json.dumps({"seq": 1, **_rl_body()}).replace('"advantages": [1.0', '"advantages": [1e999')
    assert "1e999" in raw
    expect_error(run.client.post(run.url("forward_backward"), content=raw.encode()), 422)
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


def test_loss_6_non_finite_loss_at_turn_is_a_4xx_without_effect(mock, run):
    """q far below p makes r = exp(p - q) overflow: the loss is not finite."""
    run.ok("forward_backward", ce_body(TEXTS))
    before = state_snapshot(mock.backend, run.run_id)
    body = _rl_body(loss_function="importance_sampling", inputs={"logprobs": [-1000.0] * 3})
    response = run.post("forward_backward", body)
    assert 400 <= response.status_code < 500
    expect_error(response, response.status_code)
    after = state_snapshot(mock.backend, run.run_id)
    after["next_seq"], after["ops"] = before["next_seq"], before["ops"]  # ORD-4 either way
    assert_same_state(before, after)
    next_seq = run.view()["next_seq"]  # recorded at its turn or refused before: either way
    assert run.ok("optim_step", {"adamw": ADAMW}, seq=next_seq)["step"] == 1


# -- GRAD-1 -----------------------------------------------------------------------------------
def test_grad_1_forward_never_touches_the_gradient_buffer(mock, run):
    run.ok("forward", ce_body(TEXTS))
    assert mock.backend.runs[run.run_id].grads is None
    expect_error(run.post("optim_step", {"adamw": ADAMW}), 409, "no_gradients")
    run.ok("forward_backward", ce_body(TEXTS[:1]))
    before = state_snapshot(mock.backend, run.run_id)
    run.ok("forward", ce_body(TEXTS, "cross_entropy"))
    after = state_snapshot(mock.backend, run.run_id)
    after["next_seq"], after["ops"] = before["next_seq"], before["ops"]
    assert_same_state(before, after)


def test_grad_1_two_forward_backward_equal_one_on_the_union(make_mock):
    mock = make_mock()
    client = mock.client()
    split, union = new_run(client, lora_seed=11), new_run(client, lora_seed=11)
    for handle in (split, union):  # a first step makes lora_B non-zero, so A gets gradients
        handle.ok("forward_backward", ce_body(TEXTS))
        handle.ok("optim_step", {"adamw": ADAMW})
    first = [rl_datum(text_tokens("Q:"), list(b"yes"), [-2.0, -1.5, -3.0], 1.0),
             rl_datum(text_tokens("Q:"), list(b"no"), [-2.5, -0.5], -1.0)]
    second = [rl_datum(text_tokens("Q?"), list(b"maybe"), [-1.0] * 5, 0.5)]
    losses = [split.ok("forward_backward", {"loss_function": "ppo", "loss_config": {},
                                            "data": part})["loss"] for part in (first, second)]
    whole = union.ok("forward_backward", {"loss_function": "ppo", "loss_config": {},
                                          "data": first + second})
    assert whole["loss"] == pytest.approx(sum(losses), rel=1e-12)
    grads_split = mock.backend.runs[split.run_id].grads
    grads_union = mock.backend.runs[union.run_id].grads
    assert any(np.abs(g).max() > 0 for g in grads_union.values())
    for name in grads_union:
        np.testing.assert_allclose(grads_split[name], grads_union[name], rtol=1e-10, atol=1e-14)
    steps = [h.ok("optim_step", {"adamw": ADAMW}) for h in (split, union)]
    assert steps[0]["grad_norm"] == pytest.approx(steps[1]["grad_norm"], rel=1e-10)
    for name, value in params_of(mock.backend, union.run_id).items():
        np.testing.assert_allclose(params_of(mock.backend, split.run_id)[name], value,
                                   rtol=1e-9, atol=1e-12)


# -- OPT-1..4 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field", sorted(ADAMW))
def test_opt_1_every_adamw_field_is_required(mock, run, field):
    run.ok("forward_backward", ce_body(TEXTS))
    before = state_snapshot(mock.backend, run.run_id)
    missing = {k: v for k, v in ADAMW.items() if k != field}
    expect_error(run.post("optim_step", {"adamw": missing}, seq=2), 422)
    expect_error(run.post("optim_step", {"adamw": {**ADAMW, field: None}}, seq=2), 422)
    expect_error(run.post("optim_step", {}, seq=2), 422)
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


def reference_adamw(theta, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW as documented: decoupled decay, bias-corrected moments."""
    theta = theta * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return theta - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def test_opt_2_optim_step_is_torch_adamw(mock, run):
    hp = {"learning_rate": 0.05, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6,
          "weight_decay": 0.1, "grad_clip_norm": 0.0}
    live = mock.backend.runs[run.run_id]
    theta = params_of(mock.backend, run.run_id)
    m = {k: np.zeros_like(a) for k, a in theta.items()}
    v = {k: np.zeros_like(a) for k, a in theta.items()}
    for t, texts in enumerate((TEXTS, TEXTS[:2], TEXTS[1:]), start=1):
        run.ok("forward_backward", ce_body(texts))
        grads = {k: g.copy() for k, g in live.grads.items()}
        result = run.ok("optim_step", {"adamw": hp})
        expected_norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        assert result["step"] == t
        assert result["grad_norm"] == pytest.approx(expected_norm, rel=1e-12)
        new = {}
        for k in theta:
            new[k], m[k], v[k] = reference_adamw(theta[k], grads[k], m[k], v[k], t,
                                                 hp["learning_rate"], hp["beta1"], hp["beta2"],
                                                 hp["eps"], hp["weight_decay"])
        now = params_of(mock.backend, run.run_id)
        update = math.sqrt(sum(float(((now[k] - theta[k]) ** 2).sum()) for k in theta))
        assert result["update_norm"] == pytest.approx(update, rel=1e-12)
        for k in theta:
            np.testing.assert_allclose(now[k], new[k], rtol=1e-12, atol=1e-15)
        theta = now
        assert live.grads is None  # buffer emptied


def test_opt_3_gradients_clipped_to_global_norm(make_mock):
    mock = make_mock()
    client = mock.client()
    hp = {"learning_rate": 0.05, "beta1": 0.9, "beta2": 0.99, "eps": 0.5,  # eps large: Adam
          "weight_decay": 0.0, "grad_clip_norm": 0.0}                        # sees the scale
    results = {}
    for clip in (0.0, 1e9, "quarter"):
        handle = new_run(client, lora_seed=3)
        handle.ok("forward_backward", ce_body(TEXTS))
        grads = {k: g.copy() for k, g in mock.backend.runs[handle.run_id].grads.items()}
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        max_norm = norm / 4 if clip == "quarter" else clip
        theta = params_of(mock.backend, handle.run_id)
        result = handle.ok("optim_step", {"adamw": {**hp, "grad_clip_norm": max_norm}})
        assert result["grad_norm"] == pytest.approx(norm, rel=1e-12)  # before clipping
        scale = max_norm / norm if 0 < max_norm < norm else 1.0      # 0 means off
        now = params_of(mock.backend, handle.run_id)
        for k in theta:
            expected, _, _ = reference_adamw(theta[k], grads[k] * scale, 0.0, 0.0, 1,
                                             hp["learning_rate"], hp["beta1"], hp["beta2"],
                                             hp["eps"], hp["weight_decay"])
            np.testing.assert_allclose(now[k], expected, rtol=1e-6, atol=1e-12)
        results[clip] = now
    for k in results[0.0]:
        assert np.array_equal(results[0.0][k], results[1e9][k])
    assert any(not np.allclose(results[0.0][k], results["quarter"][k]) for k in results[0.0])


def test_opt_4_no_gradients(mock, run):
    expect_error(run.post("optim_step", {"adamw": ADAMW}), 409, "no_gradients")
    run.ok("forward_backward", ce_body(TEXTS))
    run.ok("optim_step", {"adamw": ADAMW})
    before = state_snapshot(mock.backend, run.run_id)
    expect_error(run.post("optim_step", {"adamw": ADAMW}), 409, "no_gradients")
    after = state_snapshot(mock.backend, run.run_id)
    after["next_seq"], after["ops"] = before["next_seq"], before["ops"]
    assert_same_state(before, after)
