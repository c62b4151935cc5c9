"""EXPORT-1: the exported adapter is a real PEFT LoRA adapter.

Downloaded over HTTP, checked against its announced size and sha256, loaded with the reference
``safetensors`` loader, and put back into the base model: it must reproduce the run's own
``logprobs`` (VER-2) at the step it was exported, within float32 rounding of the weights.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import API, RunHandle, ce_datum, new_run, text_tokens
from safetensors.numpy import load_file

from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_SPECS, Lora

MODEL = "whitney-mock/tiny-byte"
RANK, ALPHA = 4, 8.0
TEXT = text_tokens("adapters travel as safetensors")
PROBE = text_tokens("the exported weights score this line")
# Large enough steps that the trained adapter moves logprobs far beyond float32 rounding.
ADAMW = {"learning_rate": 0.05, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "weight_decay": 0.0, "grad_clip_norm": 0.0}
# float32 weights (relative rounding 6e-8) through two small layers: well under 1e-5 in logprob.
FLOAT32_ATOL = 1e-5


def train(run: RunHandle, steps: int) -> None:
    for _ in range(steps):
        run.ok("forward_backward", {"loss_function": "cross_entropy", "loss_config": {},
                                    "data": [ce_datum(TEXT)]})
        run.ok("optim_step", {"adamw": ADAMW})


def download(run: RunHandle, tmp_path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``export_lora``, then fetch every announced file and check its size and sha256."""
    export = run.ok("export_lora", {})
    assert export["format"] == "peft"
    assert {f["name"] for f in export["files"]} == {"adapter_model.safetensors",
                                                    "adapter_config.json"}
    blobs = {}
    for file in export["files"]:
        response = run.client.get(f"{API}/runs/{run.run_id}/exports/{export['export_id']}/"
                                  f"{file['name']}")
        assert response.status_code == 200
        blobs[file["name"]] = response.content
        assert len(response.content) == file["bytes"]
        assert hashlib.sha256(response.content).hexdigest() == file["sha256"]
    path = tmp_path / f"{export['export_id']}.safetensors"
    path.write_bytes(blobs["adapter_model.safetensors"])
    return load_file(str(path)), json.loads(blobs["adapter_config.json"])


def rebuilt_logprobs(tensors: dict[str, np.ndarray], config: dict[str, Any]) -> np.ndarray:
    """Score PROBE with the base model named by the config plus the downloaded adapter."""
    lora = Lora(params={k: v.astype(np.float64) for k, v in tensors.items()},
                rank=config["r"], alpha=config["lora_alpha"])
    return get_base_model(config["base_model_name_or_path"]).score(lora, np.array(PROBE))


def served_logprobs(run: RunHandle, version: int) -> np.ndarray:
    values = run.ok("logprobs", {"version": version, "token_ids": PROBE})["logprobs"]
    assert values[0] is None
    return np.array(values[1:], dtype=np.float64)


def test_export_1_files_have_peft_keys_shapes_and_config(whitney_mock, tmp_path) -> None:
    run = new_run(whitney_mock.client, rank=RANK, alpha=ALPHA)
    train(run, 2)
    tensors, config = download(run, tmp_path)
    spec = BASE_MODEL_SPECS[MODEL]
    vocab = whitney_mock.client.get(f"{API}/capabilities").json()["base_models"][0]["vocab_size"]
    # PEFT: lora_A is (r, in_features), lora_B is (out_features, r), torch's (out, in) layout.
    module_dims = {"mixer": (spec.hidden_dim, 3 * spec.embed_dim), "lm_head": (vocab,
                                                                               spec.hidden_dim)}
    expected = {}
    for module, (out_features, in_features) in module_dims.items():
        expected[f"base_model.model.{module}.lora_A.weight"] = (RANK, in_features)
        expected[f"base_model.model.{module}.lora_B.weight"] = (out_features, RANK)
    assert {k: v.shape for k, v in tensors.items()} == expected
    assert all(v.dtype == np.float32 for v in tensors.values())
    assert config["peft_type"] == "LORA"
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    assert sorted(config["target_modules"]) == sorted(module_dims)
    assert config["base_model_name_or_path"] == MODEL


@pytest.mark.parametrize("steps", [1, 3])
def test_export_1_adapter_reproduces_the_runs_logprobs(whitney_mock, tmp_path, steps) -> None:
    run = new_run(whitney_mock.client, rank=RANK, alpha=ALPHA)
    run.ok("save_weights_for_sampler", {"version": 0})  # the untrained adapter (B = 0)
    train(run, steps)
    run.ok("save_weights_for_sampler", {"version": 1})
    tensors, config = download(run, tmp_path)
    trained = served_logprobs(run, 1)
    rebuilt = rebuilt_logprobs(tensors, config)[1:]
    np.testing.assert_allclose(rebuilt, trained, rtol=0, atol=FLOAT32_ATOL)
    # The check has teeth: the untrained weights are far outside that tolerance.
    assert np.max(np.abs(served_logprobs(run, 0) - trained)) > 1000 * FLOAT32_ATOL


def test_export_1_a_later_export_follows_training(whitney_mock, tmp_path) -> None:
    run = new_run(whitney_mock.client, rank=RANK, alpha=ALPHA)
    train(run, 1)
    run.ok("save_weights_for_sampler", {"version": 1})
    first = rebuilt_logprobs(*download(run, tmp_path))[1:]
    train(run, 1)
    run.ok("save_weights_for_sampler", {"version": 2})
    second = rebuilt_logprobs(*download(run, tmp_path))[1:]
    np.testing.assert_allclose(first, served_logprobs(run, 1), rtol=0, atol=FLOAT32_ATOL)
    np.testing.assert_allclose(second, served_logprobs(run, 2), rtol=0, atol=FLOAT32_ATOL)
    assert np.max(np.abs(first - second)) > 1000 * FLOAT32_ATOL


def test_export_1_download_over_a_real_socket(whitney_server, tmp_path) -> None:
    run = new_run(whitney_server.client, rank=RANK, alpha=ALPHA)
    train(run, 1)
    run.ok("save_weights_for_sampler", {"version": 1})
    tensors, config = download(run, tmp_path)
    np.testing.assert_allclose(rebuilt_logprobs(tensors, config)[1:], served_logprobs(run, 1),
                               rtol=0, atol=FLOAT32_ATOL)
