"""OPT-2 / OPT-3: ``adamw_step`` against a plain scalar AdamW written from torch's documented
algorithm (and against torch itself when it happens to be installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mock_server.engine.optim import AdamWState, adamw_step

SHAPES = {"base_model.model.mixer.lora_A.weight": (3, 5),
          "base_model.model.mixer.lora_B.weight": (4, 3),
          "base_model.model.lm_head.lora_B.weight": (2,)}


def reference_adamw(params, grads_per_step, hp):
    """Scalar AdamW: clip_grad_norm_ over all params, then torch.optim.AdamW per element.

    Returns the parameter, moment and step history plus (grad_norm, update_norm) per step.
    """
    names = list(params)
    theta = {k: [float(x) for x in params[k].ravel()] for k in names}
    m = {k: [0.0] * len(theta[k]) for k in names}
    v = {k: [0.0] * len(theta[k]) for k in names}
    reports = []
    for t, grads in enumerate(grads_per_step, start=1):
        flat = {k: [float(x) for x in grads[k].ravel()] for k in names}
        norm = math.sqrt(sum(g * g for k in names for g in flat[k]))
        coef = 1.0
        if hp["grad_clip_norm"] > 0:
            coef = min(1.0, hp["grad_clip_norm"] / (norm + 1e-6))
        change_sq = 0.0
        for k in names:
            for i, g in enumerate(flat[k]):
                g *= coef
                old = theta[k][i]
                p = old * (1 - hp["learning_rate"] * hp["weight_decay"])
                m[k][i] = hp["beta1"] * m[k][i] + (1 - hp["beta1"]) * g
                v[k][i] = hp["beta2"] * v[k][i] + (1 - hp["beta2"]) * g * g
                m_hat = m[k][i] / (1 - hp["beta1"] ** t)
                v_hat = v[k][i] / (1 - hp["beta2"] ** t)
                p -= hp["learning_rate"] * m_hat / (math.sqrt(v_hat) + hp["eps"])
                theta[k][i] = p
                change_sq += (p - old) ** 2
        reports.append((norm, math.sqrt(change_sq)))
    as_arrays = lambda d: {k: np.array(d[k]).reshape(params[k].shape) for k in names}  # noqa
    return as_arrays(theta), as_arrays(m), as_arrays(v), reports


def random_problem(seed: int, steps: int, grad_scale: float = 1.0):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    grads = [{k: grad_scale * rng.standard_normal(s) for k, s in SHAPES.items()}
             for _ in range(steps)]
    return params, grads


def run_ours(params, grads_per_step, hp, state=None):
    state = state or AdamWState()
    reports = []
    for grads in grads_per_step:
        params, state, grad_norm, update_norm = adamw_step(params, grads, state, **hp)
        reports.append((grad_norm, update_norm))
    return params, state, reports


def assert_matches_reference(params0, grads, hp):
    ours, state, our_reports = run_ours(params0, grads, hp)
    theta, m, v, ref_reports = reference_adamw(params0, grads, hp)
    assert state.t == len(grads)
    for k in params0:
        np.testing.assert_allclose(ours[k], theta[k], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(state.m[k], m[k], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(state.v[k], v[k], rtol=1e-12, atol=1e-12)
    for (gn, un), (ref_gn, ref_un) in zip(our_reports, ref_reports, strict=False):
        assert gn == pytest.approx(ref_gn, rel=1e-12)
        assert un == pytest.approx(ref_un, rel=1e-10, abs=1e-15)
    return our_reports


HP = dict(learning_rate=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
          grad_clip_norm=1.0)


def test_opt2_opt3_several_steps_with_weight_decay_and_clipping():
    params, grads = random_problem(0, steps=6, grad_scale=3.0)
    reports = assert_matches_reference(params, grads, HP)
    assert all(gn > HP["grad_clip_norm"] for gn, _ in reports)  # clipping was active


def test_opt3_zero_grad_clip_norm_means_no_clipping():
    params, grads = random_problem(1, steps=4, grad_scale=50.0)
    hp = {**HP, "grad_clip_norm": 0.0}
    assert_matches_reference(params, grads, hp)
    # After one step m = (1 - beta1)·g: unscaled without clipping, scaled to the norm with it.
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads[0].values()))
    _, off, _, _ = adamw_step(params, grads[0], AdamWState(), **hp)
    _, on, _, _ = adamw_step(params, grads[0], AdamWState(), **{**HP, "grad_clip_norm": 1.0})
    for k, g in grads[0].items():
        np.testing.assert_allclose(off.m[k], 0.1 * g, rtol=1e-14)
        np.testing.assert_allclose(on.m[k], 0.1 * g * (1.0 / (norm + 1e-6)), rtol=1e-14)


@settings(max_examples=25, deadline=None)
@given(lr=st.floats(0, 0.5), beta1=st.floats(0, 0.99), beta2=st.floats(0, 0.9999),
       eps=st.floats(1e-10, 1e-2), wd=st.floats(0, 1), clip=st.sampled_from([0.0, 0.5, 5.0]),
       seed=st.integers(0, 1000), steps=st.integers(1, 4))
def test_matches_reference_for_any_hyperparameters(lr, beta1, beta2, eps, wd, clip, seed, steps):
    params, grads = random_problem(seed, steps)
    hp = dict(learning_rate=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd,
              grad_clip_norm=clip)
    assert_matches_reference(params, grads, hp)


def test_step_is_pure_and_state_copy_is_deep():
    params, grads = random_problem(2, steps=2)
    _, state1, _ = run_ours(params, grads[:1], HP)
    snapshot_params = {k: a.copy() for k, a in params.items()}
    snapshot_grads = {k: a.copy() for k, a in grads[1].items()}
    snapshot_state = state1.copy()
    new_params, state2, _, _ = adamw_step(params, grads[1], state1, **HP)
    for k in params:
        np.testing.assert_array_equal(params[k], snapshot_params[k])
        np.testing.assert_array_equal(grads[1][k], snapshot_grads[k])
        np.testing.assert_array_equal(state1.m[k], snapshot_state.m[k])
        np.testing.assert_array_equal(state1.v[k], snapshot_state.v[k])
        assert new_params[k] is not params[k]
    assert state1.t == 1 and state2.t == 2
    clone = state2.copy()
    key = next(iter(params))
    clone.m[key][...] = 0.0
    assert state2.m[key].any()


def test_zeros_like_state_equals_fresh_state():
    params, grads = random_problem(3, steps=3)
    a, sa, ra = run_ours(params, grads, HP, AdamWState())
    b, sb, rb = run_ours(params, grads, HP, AdamWState.zeros_like(params))
    assert ra == rb and sa.t == sb.t
    for k in params:
        np.testing.assert_array_equal(a[k], b[k])


def test_resuming_from_a_copied_state_continues_bit_for_bit():
    """CKPT-1 relies on this: a checkpointed (params, state) pair continues identically."""
    params, grads = random_problem(4, steps=5)
    straight, _, _ = run_ours(params, grads, HP)
    mid, mid_state, _ = run_ours(params, grads[:2], HP)
    resumed, _, _ = run_ours({k: a.copy() for k, a in mid.items()}, grads[2:], HP,
                             mid_state.copy())
    for k in params:
        np.testing.assert_array_equal(straight[k], resumed[k])


def test_mismatched_keys_or_shapes_raise():
    params, grads = random_problem(5, steps=1)
    with pytest.raises(ValueError):
        adamw_step(params, {k: g for k, g in list(grads[0].items())[1:]}, AdamWState(), **HP)
    bad = {**grads[0], "base_model.model.lm_head.lora_B.weight": np.zeros(3)}
    with pytest.raises(ValueError):
        adamw_step(params, bad, AdamWState(), **HP)


def test_matches_torch_adamw_when_available():
    torch = pytest.importorskip("torch")
    params, grads = random_problem(6, steps=5, grad_scale=3.0)
    tensors = {k: torch.tensor(a, dtype=torch.float64, requires_grad=True)
               for k, a in params.items()}
    opt = torch.optim.AdamW(list(tensors.values()), lr=HP["learning_rate"], betas=(HP["beta1"],
                            HP["beta2"]), eps=HP["eps"], weight_decay=HP["weight_decay"])
    torch_norms = []
    for step_grads in grads:
        for k, t in tensors.items():
            t.grad = torch.tensor(step_grads[k], dtype=torch.float64)
        torch_norms.append(float(torch.nn.utils.clip_grad_norm_(list(tensors.values()),
                                                                HP["grad_clip_norm"])))
        opt.step()
    ours, _, reports = run_ours(params, grads, HP)
    for k, t in tensors.items():
        np.testing.assert_allclose(ours[k], t.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose([gn for gn, _ in reports], torch_norms, rtol=1e-12)
