"""Hugging Face model folders written by tests: a BPE tokenizer trained here with the
``tokenizers`` library on a small corpus, saved as ``tokenizer.json``, beside a
``config.json``, ``generation_config.json`` and ``tokenizer_config.json`` that agree with it
(the same special token ids; ``vocab_size`` the tokenizer's, or more, as real models pad it).

``write_model_folder(tmp_path / "tiny-bpe")`` -> :class:`ModelFolder` (path, ids, sizes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

#: Sentences over a small alphabet: enough for a few dozen merges, all lower-case letters.
CORPUS = (
    "the cat sat on the mat and the dog ate a bone",
    "a bird sang in a tree by the river at dawn",
    "we hope to see you soon over the open sea",
    "old oak trees grow slowly on the quiet hill",
    "i ate an apple a banana and an orange today",
    "you will hear music in the audio of the video",
    "rain fell upon our roof all through the night",
    "queen eve made jam from ripe figs and kiwi",
)
BOS, EOS = "<s>", "</s>"


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    tokenizer_size: int  # ids the tokenizer knows (added tokens included)
    vocab_size: int  # the model's (config.json), >= tokenizer_size
    bos_token_id: int
    eos_token_id: int
    max_context: int


def train_tokenizer(vocab_size: int = 96) -> Tokenizer:
    """A Metaspace BPE tokenizer (words keep their leading space as "▁"), specials first:
    ``<s>`` = 0, ``</s>`` = 1."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def write_model_folder(path: Path, *, tokenizer_vocab: int = 96, model_vocab: int | None = None,
                       max_context: int = 512, with_tokenizer_config: bool = True) -> ModelFolder:
    """Write the folder; ``model_vocab`` > the tokenizer's size pads the model's vocabulary."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(tokenizer_vocab)
    tokenizer.save(str(path / "tokenizer.json"))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    vocab = size if model_vocab is None else model_vocab
    assert vocab >= size
    (path / "config.json").write_text(json.dumps({
        "architectures": ["TinyBpeForCausalLM"], "model_type": "tiny-bpe", "vocab_size": vocab,
        "max_position_embeddings": max_context, "bos_token_id": bos, "eos_token_id": eos,
        "hidden_size": 64}))
    (path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": bos, "eos_token_id": eos, "do_sample": True}))
    if with_tokenizer_config:
        (path / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": BOS, "eos_token": EOS, "add_bos_token": True,
            "model_max_length": max_context,
            "added_tokens_decoder": {str(bos): {"content": BOS, "special": True},
                                     str(eos): {"content": EOS, "special": True}}}))
    return ModelFolder(path, size, vocab, bos, eos, max_context)
