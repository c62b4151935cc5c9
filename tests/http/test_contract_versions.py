"""Contract rules VER-1..4, SAMPLE-1, CKPT-1, EXPORT-1 over HTTP (split from
test_contract_training.py, which keeps LOSS/GRAD/OPT and the shared helpers imported below).

References are independent of the mock's code: "the same weights" is checked against the
logprobs primitive or the backend's arrays, and a fresh-moment step against the AdamW formula.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from conftest import (
    ADAMW,
    API,
    EOS,
    MODEL,
    ce_datum,
    expect_error,
    new_run,
    params_of,
    text_tokens,
)
from test_contract_training import TEXTS, ce_body, reference_adamw


# -- VER-1..4, SAMPLE-1 -----------------------------------------------------------------------
def test_ver_1_versions_strictly_increase_with_gaps_allowed(run):
    assert run.ok("save_weights_for_sampler", {"version": 0}) == {"version": 0, "step": 0}
    run.ok("forward_backward", ce_body(TEXTS))
    run.ok("optim_step", {"adamw": ADAMW})
    assert run.ok("save_weights_for_sampler", {"version": 5}) == {"version": 5, "step": 1}
    expect_error(run.post("save_weights_for_sampler", {"version": 5}), 409, "version_conflict")
    expect_error(run.post("save_weights_for_sampler", {"version": 3}), 409, "version_conflict")
    assert run.ok("save_weights_for_sampler", {"version": 6})["version"] == 6
    versions = run.view()["versions"]
    assert [(v["version"], v["step"]) for v in versions] == [(0, 0), (5, 1), (6, 1)]


def test_ver_1_quota_on_versions(make_mock):
    handle = new_run(make_mock(limits={"max_versions_per_run": 2}).client())
    handle.ok("save_weights_for_sampler", {"version": 0})
    handle.ok("save_weights_for_sampler", {"version": 1})
    expect_error(handle.post("save_weights_for_sampler", {"version": 2}), 409, "quota_exceeded")
    assert [v["version"] for v in handle.view()["versions"]] == [0, 1]


def test_ver_2_version_is_immutable_after_further_training(mock, run):
    prompt = text_tokens("Once")
    scored = text_tokens("Once upon a time")
    run.ok("save_weights_for_sampler", {"version": 0})
    sample_before = run.sample(0, prompt, num_samples=3, max_tokens=12, seed=5)
    logprobs_before = run.logprobs(0, scored)
    assert (sample_before["version"], sample_before["step"]) == (0, 0)
    assert (logprobs_before["version"], logprobs_before["step"]) == (0, 0)

    params = params_of(mock.backend, run.run_id)  # sample/logprobs never touch training weights
    for _ in range(3):
        run.ok("forward_backward", ce_body(TEXTS))
        run.ok("optim_step", {"adamw": {**ADAMW, "learning_rate": 0.1}})
    assert not all(np.array_equal(params[k], a)
                   for k, a in params_of(mock.backend, run.run_id).items())

    assert run.sample(0, prompt, num_samples=3, max_tokens=12, seed=5) == sample_before
    assert run.logprobs(0, scored) == logprobs_before
    run.ok("save_weights_for_sampler", {"version": 1})
    trained = run.logprobs(1, scored)
    assert (trained["version"], trained["step"]) == (1, 3)
    assert trained["logprobs"][1:] != logprobs_before["logprobs"][1:]

    params = params_of(mock.backend, run.run_id)
    run.sample(1, prompt, num_samples=2, max_tokens=8)
    run.logprobs(1, scored)
    assert all(np.array_equal(params[k], a) for k, a in params_of(mock.backend, run.run_id).items())
    assert run.view()["step"] == 3


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9),
                                                     (2.5, 5, 0.5), (0.3, 0, 1.0)])
def test_ver_3_sample_logprobs_equal_logprobs_and_forward(run, temperature, top_k, top_p):
    tol = run.client.get(f"{API}/capabilities").json()["features"]["logprob_tolerance"]
    run.ok("forward_backward", ce_body(TEXTS))
    run.ok("optim_step", {"adamw": {**ADAMW, "learning_rate": 0.05}})
    run.ok("save_weights_for_sampler", {"version": 0})  # nothing trains after this save
    prompt = text_tokens("The ")
    result = run.sample(0, prompt, num_samples=4, max_tokens=16, temperature=temperature,
                        top_k=top_k, top_p=top_p, seed=123)
    for sequence in result["sequences"]:
        tokens, sampled = sequence["tokens"], np.asarray(sequence["logprobs"])
        full = prompt + tokens
        scored = np.asarray(run.logprobs(0, full)["logprobs"][len(prompt):])
        forward = run.ok("forward", {"loss_function": "cross_entropy", "loss_config": {},
                                     "data": [ce_datum(full)]})["outputs"][0]["logprobs"]
        forward = np.asarray(forward[len(prompt) - 1:])
        assert np.max(np.abs(sampled - scored)) <= tol
        assert np.max(np.abs(sampled - forward)) <= tol


def test_ver_4_same_seed_same_tokens_across_mock_instances(make_mock):
    results = []
    for _ in range(2):
        handle = new_run(make_mock().client(), lora_seed=21)
        handle.ok("save_weights_for_sampler", {"version": 0})
        prompt = text_tokens("Hi")
        results.append([handle.sample(0, prompt, num_samples=4, max_tokens=16, seed=s,
                                      temperature=0.9, top_k=40, top_p=0.95)
                        for s in (1, 1, 2)])
    assert results[0][0] == results[0][1] == results[1][0] == results[1][1]
    assert results[0][2] == results[1][2]
    tokens = lambda r: [s["tokens"] for s in r["sequences"]]  # noqa: E731
    assert tokens(results[0][0]) != tokens(results[0][2])


def test_sample_1_stop_and_length(run):
    run.ok("save_weights_for_sampler", {"version": 0})
    prompt = text_tokens("a")
    for stops, expected_stop_ids in ((None, [EOS]), ([32, 101], [32, 101]), ([], [])):
        extra = {} if stops is None else {"stop_token_ids": stops}
        result = run.sample(0, prompt, num_samples=24, max_tokens=30, seed=9, **extra)
        reasons = set()
        assert len(result["sequences"]) == 24
        for sequence in result["sequences"]:
            tokens, logprobs = sequence["tokens"], sequence["logprobs"]
            assert len(tokens) == len(logprobs) and 1 <= len(tokens) <= 30
            assert all(lp <= 0 for lp in logprobs)
            first_stop = next((i for i, t in enumerate(tokens) if t in expected_stop_ids), None)
            if sequence["stop_reason"] == "stop":
                assert first_stop == len(tokens) - 1  # included, and the first one
            else:
                assert sequence["stop_reason"] == "length"
                assert len(tokens) == 30 and first_stop is None
            reasons.add(sequence["stop_reason"])
        assert reasons == ({"length"} if not expected_stop_ids else {"stop", "length"})


# -- CKPT-1 -----------------------------------------------------------------------------------
def _train(handle, texts_list):
    for texts in texts_list:
        handle.ok("forward_backward", ce_body(texts))
        handle.ok("optim_step", {"adamw": ADAMW})


def test_ckpt_1_load_with_optimizer_continues_bit_for_bit(mock, run):
    live = lambda: mock.backend.runs[run.run_id]  # noqa: E731
    _train(run, [TEXTS])
    saved = run.ok("save_state", {"name": "after-1"})
    assert saved["step"] == 1 and saved["checkpoint_id"]
    at_save = params_of(mock.backend, run.run_id)
    _train(run, [TEXTS[:1], TEXTS[1:]])
    first_pass = params_of(mock.backend, run.run_id)
    moments = {k: a.copy() for k, a in live().optimizer.m.items()}

    run.ok("forward_backward", ce_body(TEXTS))  # a pending gradient, dropped by load_state
    loaded = run.ok("load_state", {"checkpoint_id": saved["checkpoint_id"],
                                   "with_optimizer": True})
    assert loaded == {"checkpoint_id": saved["checkpoint_id"], "step": 1}
    assert run.view()["step"] == 1
    assert all(np.array_equal(at_save[k], a) for k, a in params_of(mock.backend,
                                                                   run.run_id).items())
    expect_error(run.post("optim_step", {"adamw": ADAMW}), 409, "no_gradients")
    _train(run, [TEXTS[:1], TEXTS[1:]])
    assert run.view()["step"] == 3
    for k, a in params_of(mock.backend, run.run_id).items():
        assert np.array_equal(first_pass[k], a), k
        assert np.array_equal(moments[k], live().optimizer.m[k]), k


def test_ckpt_1_load_without_optimizer_resets_moments(mock, run):
    _train(run, [TEXTS, TEXTS[:2]])
    saved = run.ok("save_state", {"name": "s"})
    at_save = params_of(mock.backend, run.run_id)
    _train(run, [TEXTS[1:]])
    run.ok("load_state", {"checkpoint_id": saved["checkpoint_id"], "with_optimizer": False})
    assert run.view()["step"] == 2
    run.ok("forward_backward", ce_body(TEXTS[1:]))
    grads = {k: g.copy() for k, g in mock.backend.runs[run.run_id].grads.items()}
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    scale = min(1.0, ADAMW["grad_clip_norm"] / norm)
    run.ok("optim_step", {"adamw": ADAMW})
    hp = [ADAMW[k] for k in ("learning_rate", "beta1", "beta2", "eps", "weight_decay")]
    for k, value in params_of(mock.backend, run.run_id).items():
        fresh, _, _ = reference_adamw(at_save[k], grads[k] * scale, 0.0, 0.0, 1, *hp)
        np.testing.assert_allclose(value, fresh, rtol=1e-6, atol=1e-12)


def test_ckpt_1_checkpoint_loads_into_another_run_of_the_same_key(mock, client, run):
    _train(run, [TEXTS])
    saved = run.ok("save_state", {"name": "share"})
    other = new_run(client, lora_seed=99)
    assert other.ok("load_state", {"checkpoint_id": saved["checkpoint_id"],
                                   "with_optimizer": True})["step"] == 1
    for k, a in params_of(mock.backend, run.run_id).items():
        assert np.array_equal(a, mock.backend.runs[other.run_id].lora.params[k])


# -- EXPORT-1 ---------------------------------------------------------------------------------
def test_export_1_peft_files(mock, run):
    from safetensors.numpy import load

    _train(run, [TEXTS])
    export = run.ok("export_lora")
    assert export["format"] == "peft" and export["export_id"]
    files = {f["name"]: f for f in export["files"]}
    assert set(files) == {"adapter_model.safetensors", "adapter_config.json"}
    downloaded = {}
    for name, meta in files.items():
        response = run.client.get(run.url(f"exports/{export['export_id']}/{name}"))
        assert response.status_code == 200
        assert len(response.content) == meta["bytes"]
        assert hashlib.sha256(response.content).hexdigest() == meta["sha256"]
        downloaded[name] = response.content

    config = json.loads(downloaded["adapter_config.json"])
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["base_model_name_or_path"] == MODEL
    tensors = load(downloaded["adapter_model.safetensors"])
    expected_keys = {f"base_model.model.{module}.lora_{ab}.weight"
                     for module in config["target_modules"] for ab in "AB"}
    assert set(tensors) == expected_keys and len(config["target_modules"]) >= 1
    params = params_of(mock.backend, run.run_id)
    for key, tensor in tensors.items():
        assert tensor.shape == params[key].shape
        assert tensor.shape[0 if ".lora_A." in key else 1] == config["r"]
        np.testing.assert_array_equal(tensor, params[key].astype(tensor.dtype))

    _train(run, [TEXTS[:1]])  # an export is a snapshot
    again = run.client.get(run.url(f"exports/{export['export_id']}/adapter_model.safetensors"))
    assert hashlib.sha256(again.content).hexdigest() == files["adapter_model.safetensors"]["sha256"]
    expect_error(run.client.get(run.url(f"exports/{export['export_id']}/other.bin")), 404)
    expect_error(run.client.get(run.url("exports/exp_unknown/adapter_config.json")), 404)
