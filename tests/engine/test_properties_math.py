"""The caller's and the server's math for Hypothesis-generated inputs.

- Advantage helpers: the identities that define mean-centring and std-normalisation (a
  projection, so idempotent; equivariant to scaling; order-preserving; Σ A·r = G·var(r)), and
  the policy-gradient identity they exist for: on-policy datums built with ``rl_datum`` make
  every RL loss's gradient the advantage-weighted cross-entropy gradient (LOSS-1..5).
  ``tests/grpo/test_grpo_helpers.py`` covers the formulas, zero mean, unit std, shifts,
  permutations.
- ``forward_backward`` over HTTP against central finite differences of the contract formulas
  (LOSS-1..5, written out here), for random datums, configs, adapters and ratios, along random
  directions in each LoRA matrix (the model is float64).
- GRAD-1: accumulation is additive, across datums and across losses; ``forward`` never
  touches the buffer; two calls then ``optim_step`` equal one call on the union.
- CKPT-1: ``load_state`` then the same steps reproduces the same weights bit for bit (with the
  optimizer), or the steps of a fresh AdamW computed here (without).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import ADAMW, API, MODEL, module_mock
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from grpo.helpers import group_mean_advantages, is_uniform, rl_datum
from mock_server.engine.model import get_base_model
from mock_server.engine.optim import AdamWState, adamw_step
from mock_server.engine.specs import Lora

BASE = get_base_model(MODEL)
LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
REWARDS = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=16)


# -- advantage helpers --------------------------------------------------------------------------
def close(a: list[float], b: list[float], tol: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=False))


@given(REWARDS, st.booleans())
def test_advantages_are_a_projection_applying_them_twice_changes_nothing(rewards, normalize):
    assume(statistics.pstdev(rewards) >= 1e-3)
    once = group_mean_advantages(rewards, normalize_std=normalize)
    twice = group_mean_advantages(once, normalize_std=normalize)
    assert close(twice, once, 1e-9 * (1 + max(map(abs, once))))


@given(REWARDS, st.floats(1e-3, 1e3), st.sampled_from([-1.0, 1.0]))
def test_advantages_scale_with_rewards_and_normalised_ones_only_flip_sign(rewards, size, sign):
    c = sign * size
    assume(statistics.pstdev(rewards) >= 1e-3)
    scale = 1e-9 * (1 + abs(c)) * (1 + max(map(abs, rewards)))
    scaled = group_mean_advantages([c * r for r in rewards])
    assert close(scaled, [c * a for a in group_mean_advantages(rewards)], scale * 10)
    normalised = group_mean_advantages([c * r for r in rewards], normalize_std=True)
    assert close(normalised, [math.copysign(1.0, c) * a for a in
                              group_mean_advantages(rewards, normalize_std=True)], 1e-6)


@given(REWARDS, st.booleans())
def test_advantages_preserve_the_order_of_rewards(rewards, normalize):
    """Weakly always; strictly when two rewards differ by more than float rounding of the
    mean can hide."""
    advantages = group_mean_advantages(rewards, normalize_std=normalize)
    resolution = 1e-12 * max(map(abs, rewards))
    for i in range(len(rewards)):
        for j in range(len(rewards)):
            if rewards[i] < rewards[j]:
                assert advantages[i] <= advantages[j]
                if rewards[j] - rewards[i] > resolution and not is_uniform(rewards):
                    assert advantages[i] < advantages[j]
            elif rewards[i] == rewards[j]:
                assert advantages[i] == advantages[j]


@given(REWARDS)
def test_advantage_weighted_rewards_sum_to_group_variance(rewards):
    """Σ A_i·r_i = G·var(r) (centred) and = G·std(r), Σ A_i² = G (normalised): the policy
    gradient's expected improvement direction is the reward's spread, nothing else."""
    assume(statistics.pstdev(rewards) >= 1e-2)
    size, std = len(rewards), statistics.pstdev(rewards)
    centred = group_mean_advantages(rewards)
    normalised = group_mean_advantages(rewards, normalize_std=True)
    assert math.isclose(math.fsum(a * r for a, r in zip(centred, rewards, strict=True)),
                        size * std**2,
                        rel_tol=1e-6)
    assert math.isclose(math.fsum(a * r for a, r in zip(normalised, rewards, strict=True)),
                        size * std,
                        rel_tol=1e-6)
    assert math.isclose(math.fsum(a * a for a in normalised), size, rel_tol=1e-9)


def perturbed_lora(seed: int, rank: int, alpha: float) -> Lora:
    lora = BASE.init_lora(rank, alpha, seed)
    rng = np.random.default_rng(seed)
    return Lora({k: a + (0.2 * rng.standard_normal(a.shape) if ".lora_B." in k else 0.0)
                 for k, a in lora.params.items()}, rank, alpha)


TOKEN = st.integers(0, 257)


@settings(max_examples=examples(30, 500))
@given(seed=st.integers(0, 2**32), prompt=st.lists(TOKEN, min_size=1, max_size=4),
       completions=st.lists(st.lists(TOKEN, min_size=1, max_size=5), min_size=2, max_size=5),
       rewards=st.data(), normalize=st.booleans())
def test_on_policy_rl_losses_are_advantage_weighted_cross_entropy(seed, prompt, completions,
                                                                  rewards, normalize):
    """With q = p (on-policy, the seed's loop), every RL loss built with ``rl_datum`` has the
    gradient of cross-entropy weighted by mask·A, and importance_sampling's loss is
    -Σ_i A_i·len_i: 0 when the completions have equal length, because Σ A_i = 0."""
    lora = perturbed_lora(seed % 1000, 2, 4.0)
    rewards_G = rewards.draw(st.lists(st.floats(-10, 10), min_size=len(completions),
                                      max_size=len(completions)))
    assume(statistics.pstdev(rewards_G) >= 1e-3)
    advantages_G = group_mean_advantages(rewards_G, normalize_std=normalize)
    p_list = BASE.forward(lora, [np.array(prompt + c)[:-1] for c in completions],
                          [np.array(prompt + c)[1:] for c in completions])
    data = [rl_datum(prompt, c, p[len(prompt) - 1:].tolist(), a)
            for c, p, a in zip(completions, p_list, advantages_G, strict=False)]
    token_ids = [np.array(d["model_input"]["token_ids"]) for d in data]
    inputs = [{k: np.array(v, dtype=np.float64) for k, v in d["loss_inputs"].items()}
              for d in data]
    weighted = [{"target_tokens": i["target_tokens"], "weights": i["mask"] * i["advantages"]}
                for i in inputs]
    reference = BASE.loss_and_grad(lora, token_ids, weighted, "cross_entropy", {}, True)
    for loss in LOSSES[1:]:
        result = BASE.loss_and_grad(lora, token_ids, inputs, loss, {}, True)
        for key in lora.params:
            np.testing.assert_allclose(result.grads[key], reference.grads[key], rtol=1e-9,
                                       atol=1e-12 * (1 + np.abs(reference.grads[key]).max()))
    is_loss = BASE.loss_and_grad(lora, token_ids, inputs, "importance_sampling", {}, False).loss
    expected = -math.fsum(a * len(c) for a, c in zip(advantages_G, completions, strict=False))
    assert math.isclose(is_loss, expected, rel_tol=1e-9, abs_tol=1e-9)
    if len({len(c) for c in completions}) == 1:
        assert abs(is_loss) <= 1e-9 * len(completions[0]) * max(1.0, *map(abs, advantages_G))


# -- forward_backward over HTTP -------------------------------------------------------------------
@pytest.fixture(scope="module")
def mock() -> Iterator[tuple[httpx.Client, Any]]:
    """One mock for the module (each example opens and closes its own session)."""
    yield from module_mock()


class Session:
    """A session with runs of one adapter seed, each with its own seq counter."""

    def __init__(self, http: httpx.Client, backend: Any, rank: int, alpha: float, seed: int):
        self.http, self.backend = http, backend
        self.session_id = http.post(f"{API}/sessions", json={}).json()["session_id"]
        self.lora = {"rank": rank, "alpha": alpha, "seed": seed}
        self.seqs: dict[str, int] = {}

    def new_run(self) -> str:
        response = self.http.post(f"{API}/sessions/{self.session_id}/runs", json={
            "base_model": MODEL, "lora": self.lora, "optimizer": "adamw"})
        assert response.status_code == 201, response.text
        self.seqs[response.json()["run_id"]] = 0
        return response.json()["run_id"]

    def post(self, run_id: str, primitive: str, body: dict[str, Any]) -> Any:
        self.seqs[run_id] += 1
        response = self.http.post(f"{API}/runs/{run_id}/{primitive}",
                                  json={"seq": self.seqs[run_id], **body})
        assert response.status_code == 200, response.text
        return response.json()

    def fb(self, run_id: str, loss: str, config: dict, data: list, primitive: str =
           "forward_backward") -> Any:
        return self.post(run_id, primitive, {"loss_function": loss, "loss_config": config,
                                             "data": data})

    def grads(self, run_id: str) -> dict[str, np.ndarray]:
        return {k: g.copy() for k, g in self.backend.runs[run_id].grads.items()}

    def weights(self, run_id: str) -> dict[str, np.ndarray]:
        return {k: a.copy() for k, a in self.backend.runs[run_id].lora.params.items()}

    def close(self) -> None:
        for run_id in self.seqs:
            self.http.post(f"{API}/runs/{run_id}/finish", json={})
        assert self.http.post(f"{API}/sessions/{self.session_id}/close",
                              json={}).status_code == 200


WARM_UP = [{"model_input": {"token_ids": [256, 104, 101, 108]},
            "loss_inputs": {"target_tokens": [104, 101, 108, 108]}}]


def warmed_up(session: Session) -> str:
    """A run whose lora_B is non-zero (one step), so dL/dA is non-trivial too."""
    run_id = session.new_run()
    session.fb(run_id, "cross_entropy", {}, WARM_UP)
    session.post(run_id, "optim_step", {"adamw": {**ADAMW, "learning_rate": 0.05}})
    return run_id


@st.composite
def loss_case(draw: Any) -> dict[str, Any]:
    """A loss, its config, and datums whose ratios r = exp(p - q) are chosen (q is derived from
    the current p by the test), away from PPO's kinks at lo and hi."""
    loss = draw(st.sampled_from(LOSSES))
    config: dict[str, float] = {}
    lo, hi = 0.8, 1.2
    if loss in ("ppo", "cispo") and draw(st.booleans()):
        lo, hi = draw(st.floats(0.5, 0.95)), draw(st.floats(1.05, 2.0))
        config = {"clip_low_threshold": lo, "clip_high_threshold": hi}
    if loss == "dro" and draw(st.booleans()):
        config = {"beta": draw(st.floats(0.0, 2.0))}
    datums = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 5))
        datum: dict[str, Any] = {"tokens": draw(st.lists(TOKEN, min_size=n, max_size=n)),
                                 "targets": draw(st.lists(TOKEN, min_size=n, max_size=n))}
        if loss == "cross_entropy":
            if draw(st.booleans()):
                datum["weights"] = draw(st.lists(st.floats(-1, 2), min_size=n, max_size=n))
        else:
            band = st.one_of(st.floats(0.5, 0.97).map(lambda u: u * lo),
                             st.floats(0.03, 0.97).map(lambda u: lo + u * (hi - lo)),
                             st.floats(1.03, 2.0).map(lambda u: u * hi))
            datum["ratios"] = draw(st.lists(band, min_size=n, max_size=n))
            datum["advantages"] = draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n))
            if draw(st.booleans()):
                datum["mask"] = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n,
                                              max_size=n))
        datums.append(datum)
    return {"loss": loss, "config": config, "lo": lo, "hi": hi, "datums": datums,
            "beta": config.get("beta", 0.05)}


def wire_data(case: dict[str, Any], lora: Lora) -> list[dict[str, Any]]:
    """The contract's Datums: q = p_now - log(r) for the chosen ratios."""
    p_now = BASE.forward(lora, [np.array(d["tokens"]) for d in case["datums"]],
                         [np.array(d["targets"]) for d in case["datums"]])
    data = []
    for d, p in zip(case["datums"], p_now, strict=False):
        inputs: dict[str, Any] = {"target_tokens": d["targets"]}
        for name in ("weights", "advantages", "mask"):
            if name in d:
                inputs[name] = d[name]
        if "ratios" in d:
            inputs["logprobs"] = (p - np.log(d["ratios"])).tolist()
        data.append({"model_input": {"token_ids": d["tokens"]}, "loss_inputs": inputs})
    return data


def reference_loss(case: dict[str, Any], data: list[dict[str, Any]], lora: Lora,
                   frozen: list[np.ndarray] | None = None) -> float:
    """LOSS-1..5 from the contract text; for cispo sg(clip(r)) is ``frozen`` when given."""
    p_list = BASE.forward(lora, [np.array(d["model_input"]["token_ids"]) for d in data],
                          [np.array(d["loss_inputs"]["target_tokens"]) for d in data])
    total, loss, lo, hi = 0.0, case["loss"], case["lo"], case["hi"]
    for i, (d, p) in enumerate(zip(data, p_list, strict=False)):
        inputs = {k: np.array(v, dtype=np.float64) for k, v in d["loss_inputs"].items()}
        if loss == "cross_entropy":
            total -= np.sum(inputs.get("weights", 1.0) * p)
            continue
        q, a, m = inputs["logprobs"], inputs["advantages"], inputs.get("mask", 1.0)
        r = np.exp(p - q)
        if loss == "importance_sampling":
            total -= np.sum(m * r * a)
        elif loss == "ppo":
            total -= np.sum(m * np.minimum(r * a, np.clip(r, lo, hi) * a))
        elif loss == "cispo":
            total -= np.sum(m * (np.clip(r, lo, hi) if frozen is None else frozen[i]) * p * a)
        else:
            total -= np.sum(m * (p * a - case["beta"] / 2 * (p - q) ** 2))
    return float(total)


def shifted(lora: Lora, direction: dict[str, np.ndarray], h: float) -> Lora:
    return Lora({k: a + h * direction.get(k, 0.0) for k, a in lora.params.items()}, lora.rank,
                lora.alpha)


@settings(max_examples=examples(50, 1000))
@given(case=loss_case(), rank=st.integers(1, 4), alpha=st.floats(1.0, 16.0),
       seed=st.integers(0, 2**32), direction_seed=st.integers(0, 2**32))
def test_forward_backward_gradient_equals_finite_differences(mock, case, rank, alpha, seed,
                                                             direction_seed):
    """LOSS-1..5: the buffer after one forward_backward is the gradient of the contract's loss
    (cispo: with its stop-gradient), along a random direction in each LoRA matrix."""
    session = Session(*mock, rank, alpha, seed)
    try:
        run_id = warmed_up(session)
        lora = Lora(session.weights(run_id), rank, alpha)
        data = wire_data(case, lora)
        result = session.fb(run_id, case["loss"], case["config"], data)
        grads = session.grads(run_id)
    finally:
        session.close()
    assert result["loss"] == pytest.approx(reference_loss(case, data, lora), rel=1e-9, abs=1e-9)
    frozen = None
    if case["loss"] == "cispo":
        p_list = [np.array(o["logprobs"]) for o in result["outputs"]]
        frozen = [np.clip(np.exp(p - np.array(d["loss_inputs"]["logprobs"])), case["lo"],
                          case["hi"]) for d, p in zip(data, p_list, strict=False)]
    rng = np.random.default_rng(direction_seed)
    h = 1e-5
    for key, param in lora.params.items():
        direction = {key: rng.standard_normal(param.shape) / math.sqrt(param.size)}
        numeric = (reference_loss(case, data, shifted(lora, direction, h), frozen)
                   - reference_loss(case, data, shifted(lora, direction, -h), frozen)) / (2 * h)
        analytic = float(np.sum(grads[key] * direction[key]))
        assert abs(numeric - analytic) <= 1e-6 * (1 + abs(analytic)), (key, numeric, analytic)


def same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def assert_close(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12 * (1 + np.abs(b[k]).max()))


@settings(max_examples=examples(20, 400))
@given(first=loss_case(), second=loss_case(), split=st.integers(0, 3))
def test_grad_1_accumulation_is_additive_and_forward_leaves_the_buffer(mock, first, second,
                                                                       split):
    """GRAD-1: buffer(fb(L1, D1); forward(L2, D2); fb(L2, D2)) == buffer(fb(L1, D1)) +
    buffer(fb(L2, D2)), ``forward`` changing nothing; and for one loss, fb(D[:k]); fb(D[k:]);
    optim_step equals fb(D); optim_step."""
    session = Session(*mock, 4, 8.0, 3)
    try:
        runs = [warmed_up(session) for _ in range(5)]
        lora = Lora(session.weights(runs[0]), 4, 8.0)
        d1, d2 = wire_data(first, lora), wire_data(second, lora)
        session.fb(runs[0], first["loss"], first["config"], d1)
        before = session.grads(runs[0])
        session.fb(runs[0], second["loss"], second["config"], d2, primitive="forward")
        assert same_arrays(session.grads(runs[0]), before)  # forward: buffer untouched
        session.fb(runs[0], second["loss"], second["config"], d2)
        session.fb(runs[1], first["loss"], first["config"], d1)
        session.fb(runs[2], second["loss"], second["config"], d2)
        one, two = session.grads(runs[1]), session.grads(runs[2])
        assert_close(session.grads(runs[0]), {k: one[k] + two[k] for k in one})

        k = min(split, len(d1) - 1) if len(d1) > 1 else 0
        for part in (d1[:k], d1[k:]):
            if part:
                session.fb(runs[3], first["loss"], first["config"], part)
        session.fb(runs[4], first["loss"], first["config"], d1)
        assert_close(session.grads(runs[3]), session.grads(runs[4]))
        steps = [session.post(r, "optim_step", {"adamw": ADAMW}) for r in runs[3:]]
        assert steps[0]["grad_norm"] == pytest.approx(steps[1]["grad_norm"], rel=1e-9)
        assert_close(session.weights(runs[3]), session.weights(runs[4]))
    finally:
        session.close()


ADAMW_ST = st.builds(lambda lr, b1, b2, wd, clip: {"learning_rate": lr, "beta1": b1,
                                                   "beta2": b2, "eps": 1e-8,
                                                   "weight_decay": wd, "grad_clip_norm": clip},
                     st.floats(1e-4, 0.05), st.sampled_from([0.0, 0.5, 0.9]),
                     st.sampled_from([0.9, 0.999]), st.sampled_from([0.0, 0.1]),
                     st.sampled_from([0.0, 0.5]))
STEPS = st.lists(st.tuples(loss_case(), ADAMW_ST), min_size=1, max_size=3)


@settings(max_examples=examples(15, 300))
@given(before=STEPS, after=STEPS)
def test_ckpt_1_load_state_then_the_same_steps_reproduces_the_weights(mock, before, after):
    """CKPT-1 bit for bit: with_optimizer=true continues exactly as the first time; false
    continues as AdamW from zero moments would (computed here with the model's functions)."""
    session = Session(*mock, 4, 8.0, 5)
    try:
        run_id = warmed_up(session)

        def train(steps: list, record: list | None) -> list[dict[str, np.ndarray]]:
            weights = []
            for case, adamw in steps:
                data = wire_data(case, Lora(session.weights(run_id), 4, 8.0))
                if record is not None:
                    record.append((case, data, adamw))
                session.fb(run_id, case["loss"], case["config"], data)
                session.post(run_id, "optim_step", {"adamw": adamw})
                weights.append(session.weights(run_id))
            return weights

        train(before, None)
        saved = session.post(run_id, "save_state", {"name": "ckpt"})
        checkpoint = session.weights(run_id)
        replayed: list = []
        first = train(after, replayed)
        for with_optimizer in (True, False):
            loaded = session.post(run_id, "load_state", {"checkpoint_id": saved["checkpoint_id"],
                                                         "with_optimizer": with_optimizer})
            assert loaded["step"] == saved["step"] and session.weights(run_id).keys()
            assert same_arrays(session.weights(run_id), checkpoint)
            again = []
            for case, data, adamw in replayed:  # the same bodies, byte for byte
                session.fb(run_id, case["loss"], case["config"], data)
                session.post(run_id, "optim_step", {"adamw": adamw})
                again.append(session.weights(run_id))
            if with_optimizer:
                expected = first
            else:
                params, state, expected = checkpoint, AdamWState(), []
                for case, data, adamw in replayed:
                    grads = BASE.loss_and_grad(
                        Lora(params, 4, 8.0),
                        [np.array(d["model_input"]["token_ids"]) for d in data],
                        [{k: np.array(v, dtype=np.float64) for k, v in d["loss_inputs"].items()}
                         for d in data], case["loss"], case["config"], True).grads
                    params, state, _, _ = adamw_step(params, grads, state, **adamw)
                    expected.append(params)
            assert all(same_arrays(got, want) for got, want in zip(again, expected, strict=False))
            assert session.backend.runs[run_id].step == saved["step"] + len(after)
    finally:
        session.close()
