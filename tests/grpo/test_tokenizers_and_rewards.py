"""grpo.tokenizers (BOS from the tokenizer, else capabilities; EOS from capabilities; ids the
tokenizer cannot decode as ``<id:N>``), grpo.rewards (the accepted signatures), and the loop's
checkpoint before a caller-side stop. References: the ``tokenizers`` library itself, and ids
written by the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_folders import train_tokenizer, write_model_folder
from tokenizers import Tokenizer, processors

from grpo.algorithms import get_algorithm
from grpo.client import WhitneyClient
from grpo.config import LoopConfig
from grpo.errors import RewardError, TrainingError
from grpo.rewards import UserReward
from grpo.tokenizers import ByteTokenizer, HFTokenizer, load_tokenizer

MODEL = {"id": "m", "vocab_size": 200, "eos_token_id": 1, "max_context": 64,
         "max_lora_rank": 8}


def test_bos_comes_from_tokenizer_config(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "m")
    tokenizer = load_tokenizer(str(folder.path)).bind({**MODEL, "bos_token_id": 7})
    library = Tokenizer.from_file(str(folder.path / "tokenizer.json"))
    ids = tokenizer.encode("the cat")
    assert ids == [folder.bos_token_id] + library.encode("the cat").ids
    assert tokenizer.decode(ids + [folder.eos_token_id, 5, 6]) == "the cat"


def test_add_bos_token_false_means_no_bos_even_if_capabilities_name_one(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "m")
    config = json.loads((folder.path / "tokenizer_config.json").read_text())
    config["add_bos_token"] = False
    (folder.path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(folder.path)).bind({**MODEL, "bos_token_id": 0})
    assert tokenizer.bos_token_id is None
    assert tokenizer.encode("a") == Tokenizer.from_file(
        str(folder.path / "tokenizer.json")).encode("a").ids


def test_a_bare_tokenizer_json_uses_its_post_processor_else_capabilities(tmp_path: Path) -> None:
    library = train_tokenizer()
    library.save(str(tmp_path / "plain.json"))
    plain = HFTokenizer(tmp_path / "plain.json")
    assert plain.bind({**MODEL, "bos_token_id": 0}).bos_token_id == 0  # from capabilities
    assert plain.bind(MODEL).bos_token_id is None
    library.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", library.token_to_id("<s>"))])
    library.save(str(tmp_path / "templated.json"))
    templated = HFTokenizer(tmp_path / "templated.json").bind({**MODEL, "bos_token_id": 1})
    assert templated.bos_token_id == library.token_to_id("<s>")
    assert templated.encode("a").count(templated.bos_token_id) == 1  # not twice


def test_undecodable_ids_and_eos(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "m")
    tokenizer = load_tokenizer(str(folder.path)).bind({**MODEL, "vocab_size": 1000})
    cat = Tokenizer.from_file(str(folder.path / "tokenizer.json")).encode("the cat").ids
    assert tokenizer.decode([999] + cat + [500]) == "<id:999>the cat<id:500>"
    assert tokenizer.decode(cat + [folder.eos_token_id, 999]) == "the cat"


def test_byte_tokenizer_takes_the_servers_numbers() -> None:
    byte = ByteTokenizer().bind({**MODEL, "vocab_size": 300, "eos_token_id": 299})
    assert (byte.bos_token_id, byte.eos_token_id) == (None, 299)
    assert byte.encode("hi") == [104, 105]
    assert byte.decode([104, 270, 105, 299, 104]) == "h<id:270>i"
    with_bos = ByteTokenizer().bind({**MODEL, "vocab_size": 300, "eos_token_id": 4,
                                     "bos_token_id": 280})
    assert with_bos.encode("hi") == [280, 104, 105] and with_bos.decode([280, 104, 4]) == "h"
    with pytest.raises(ValueError, match="at least 256 ids, base model 'm' has 32"):
        ByteTokenizer().bind({**MODEL, "vocab_size": 32})


def test_bad_tokenizer_paths_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    for path, problem in ((tmp_path / "none.json", "no such file"),
                          (tmp_path, "no tokenizer.json in this folder"),
                          (tmp_path / "bad.json", "not a tokenizer.json")):
        with pytest.raises(ValueError, match=problem) as caught:
            load_tokenizer(str(path))
        assert "\n" not in str(caught.value)


def test_reward_signatures() -> None:
    byte = ByteTokenizer()
    tokens, prompt = [104, 105, 257], [256, 97]

    def seed(tokens):  # noqa: ANN001, ANN202
        return len(tokens)

    def with_prompt(completion, prompt):  # noqa: ANN001, ANN202
        return len(prompt)

    def text_only(text):  # noqa: ANN001, ANN202
        return len(text)

    def everything(**kwargs):  # noqa: ANN003, ANN202
        return len(kwargs)

    def keyword_mix(*, prompt_text, tokens):  # noqa: ANN001, ANN202
        return len(prompt_text) * 10 + len(tokens)

    assert UserReward.of(seed)(tokens, prompt) == 3.0
    assert UserReward.of(with_prompt)(tokens, prompt) == 2.0
    assert UserReward.of(text_only).with_tokenizer(byte)(tokens, prompt) == 2.0
    assert UserReward.of(everything).with_tokenizer(byte)(tokens, prompt) == 4.0
    assert UserReward.of(everything)(tokens, prompt) == 2.0  # no tokenizer: no text
    assert UserReward.of(keyword_mix).with_tokenizer(byte)(tokens, prompt) == 13.0
    with pytest.raises(ValueError, match="needs a tokenizer"):
        UserReward.of(text_only).with_tokenizer(None)
    with pytest.raises(RewardError, match="returned nan"):
        UserReward.of(lambda tokens: float("nan"), "r")(tokens, prompt)


def test_a_uniform_group_after_a_step_saves_a_checkpoint_first(whitney_mock) -> None:  # noqa: ANN001
    calls = []

    def reward(tokens, prompt_tokens):  # noqa: ANN001, ANN202
        calls.append(1)
        return float(len(calls)) if len(calls) <= 8 else 1.0  # informative, then flat

    client = WhitneyClient(whitney_mock.client)
    with pytest.raises(TrainingError) as caught:
        from grpo.loop import train

        train(client, [[256, 104]], reward, get_algorithm("grpo"),
              LoopConfig(cycles=3, prompts_per_cycle=1))
    error = caught.value
    assert error.cycle == 1 and error.checkpoint is not None and error.checkpoint["step"] == 1
    assert "saved before the cancel" in str(error)
    primitives = whitney_mock.primitives(error.run_id)
    assert primitives[-1] == "save_state" and primitives.count("optim_step") == 1
    assert whitney_mock.client.get(f"/v1/training/runs/{error.run_id}").json()["state"] \
        == "cancelled"
