"""spec_from_hf_folder: the numbers of a declared model read from a local Hugging Face folder
(config.json, generation_config.json, tokenizer_config.json), offline, json only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mock_server.engine.specs import HFFolderError, ModelSpec, spec_from_hf_folder

QWEN_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
               "max_position_embeddings": 40960, "bos_token_id": 151643,
               "eos_token_id": 151645, "hidden_size": 2560}


def folder(tmp_path: Path, name: str = "Qwen3-4B", **files: Any) -> Path:
    path = tmp_path / name
    path.mkdir()
    for filename, content in files.items():
        target = path / f"{filename}.json"
        target.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_qwen_like_folder(tmp_path):
    path = folder(tmp_path, config=QWEN_CONFIG,
                  generation_config={"bos_token_id": 151643,
                                     "eos_token_id": [151645, 151643], "do_sample": True},
                  tokenizer_config={"eos_token": "<|im_end|>", "model_max_length": 131072})
    spec = spec_from_hf_folder(path)
    assert spec == ModelSpec.declare("Qwen3-4B", 151936, 151645, 151643, max_context=40960)
    named = spec_from_hf_folder(str(path), model_id="Qwen/Qwen3-4B", max_lora_rank=32)
    assert (named.id, named.max_lora_rank) == ("Qwen/Qwen3-4B", 32)


def test_eos_from_the_tokenizer_config_text(tmp_path):
    path = folder(tmp_path, config={"vocab_size": 50, "n_positions": 512},
                  tokenizer_config={"eos_token": {"content": "</s>", "special": True},
                                    "bos_token": "<s>",
                                    "added_tokens_decoder": {
                                        "1": {"content": "<s>", "special": True},
                                        "2": {"content": "</s>", "special": True}}})
    spec = spec_from_hf_folder(path)
    assert (spec.eos_token_id, spec.bos_token_id, spec.max_context) == (2, 1, 512)


def test_eos_from_tokenizer_json_added_tokens(tmp_path):
    path = folder(tmp_path, config={"vocab_size": 50},
                  tokenizer_config={"eos_token": "<eos>", "model_max_length": 10**30},
                  tokenizer={"added_tokens": [{"id": 49, "content": "<eos>"}],
                             "model": {"vocab": {"a": 0}}})
    spec = spec_from_hf_folder(path)
    assert (spec.eos_token_id, spec.bos_token_id) == (49, None)
    assert spec.max_context == 2048  # model_max_length 1e30 is Hugging Face's "no limit"


def test_multimodal_text_config_and_config_eos(tmp_path):
    path = folder(tmp_path, config={"model_type": "gemma3",
                                    "text_config": {"vocab_size": 262208,
                                                    "max_position_embeddings": 131072},
                                    "eos_token_id": [1, 106]})
    spec = spec_from_hf_folder(path, max_context=4096)
    assert (spec.vocab_size, spec.eos_token_id, spec.max_context) == (262208, 1, 4096)


@pytest.mark.parametrize("files, words", [
    ({}, "config.json: missing"),
    ({"config": "{not json"}, "config.json: not valid JSON"),
    ({"config": "[1, 2]"}, "expected a JSON object"),
    ({"config": {"max_position_embeddings": 8}}, "no integer vocab_size"),
    ({"config": {"vocab_size": 10}}, "no eos_token_id"),
    ({"config": {"vocab_size": 10}, "tokenizer_config": {"eos_token": "</s>"}},
     "eos_token '</s>' (id not found)"),
    ({"config": {"vocab_size": 10, "eos_token_id": 12}}, "eos_token_id 12 outside the vocabulary"),
    ({"config": {"vocab_size": 1, "eos_token_id": 0}}, "vocab_size"),
    ({"config": {"vocab_size": 10, "eos_token_id": 2}, "generation_config": "{"},
     "generation_config.json: not valid JSON"),
])
def test_bad_folders_fail_with_one_line_naming_the_problem(tmp_path, files, words):
    path = folder(tmp_path, **files)
    with pytest.raises(HFFolderError) as caught:
        spec_from_hf_folder(path)
    message = str(caught.value)
    assert words in message and str(path) in message and "\n" not in message, message
    assert isinstance(caught.value, ValueError)


def test_missing_folder_file_instead_of_folder_and_unreadable_files(tmp_path):
    with pytest.raises(HFFolderError, match="no such folder"):
        spec_from_hf_folder(tmp_path / "nowhere")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    with pytest.raises(HFFolderError, match="not a folder"):
        spec_from_hf_folder(plain)
    path = folder(tmp_path, name="binary")
    (path / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(HFFolderError, match="config.json: unreadable"):
        spec_from_hf_folder(path)
    odd = folder(tmp_path, name="odd")
    (odd / "config.json").mkdir()  # a folder where a file should be
    with pytest.raises(HFFolderError, match="config.json: unreadable"):
        spec_from_hf_folder(odd)
