"""ModelSpec.declare: any vocabulary from 2 to 2**20 ids, EOS/BOS anywhere in it, and one-line
errors for declarations the mock cannot serve."""

from __future__ import annotations

import numpy as np
import pytest

from mock_server.engine.model import get_base_model
from mock_server.engine.specs import (
    BASE_MODEL_ID,
    BASE_MODEL_SPECS,
    BUCKET_ARCHITECTURE,
    BYTE_ARCHITECTURE,
    MAX_BUCKETS,
    MAX_VOCAB,
    ModelSpec,
)


@pytest.mark.parametrize("vocab, eos, bos", [
    (2, 0, None), (2, 1, 0), (3, 2, 2), (32, 0, 31), (258, 257, 256), (1000, 500, None),
    (151936, 151645, 151643), (262144, 262143, 0), (MAX_VOCAB, 7, None),
])
def test_declare_accepts_any_vocabulary_and_special_ids(vocab, eos, bos):
    spec = ModelSpec.declare("org/model", vocab, eos, bos, max_context=131072,
                             max_lora_rank=128)
    assert (spec.vocab_size, spec.eos_token_id, spec.bos_token_id) == (vocab, eos, bos)
    assert (spec.max_context, spec.max_lora_rank) == (131072, 128)
    assert spec.architecture == BUCKET_ARCHITECTURE
    assert spec.num_buckets == min(vocab, MAX_BUCKETS)
    assert spec.special_token_ids == tuple(sorted({eos} | ({bos} if bos is not None else set())))
    assert spec.capabilities_entry() == {"id": "org/model", "vocab_size": vocab,
                                         "max_context": 131072, "eos_token_id": eos,
                                         "max_lora_rank": 128,
                                         **({} if bos is None else {"bos_token_id": bos})}


def test_declare_defaults_and_numpy_integers():
    spec = ModelSpec.declare("m", np.int64(40), np.int32(3))
    assert type(spec.vocab_size) is int and type(spec.eos_token_id) is int
    assert (spec.max_context, spec.max_lora_rank, spec.bos_token_id) == (2048, 64, None)


def test_specs_are_values_that_key_the_model_cache():
    a = ModelSpec.declare("org/m", 5000, 1, 2)
    b = ModelSpec.declare("org/m", 5000, 1, 2)
    c = ModelSpec.declare("org/m", 5001, 1, 2)
    assert a == b and hash(a) == hash(b) and a != c
    assert get_base_model(a) is get_base_model(b)
    assert get_base_model(a) is not get_base_model(c)
    assert get_base_model(BASE_MODEL_SPECS[BASE_MODEL_ID]) is get_base_model(BASE_MODEL_ID)


def test_byte_model_spec_is_unchanged():
    spec = BASE_MODEL_SPECS[BASE_MODEL_ID]
    assert spec.architecture == BYTE_ARCHITECTURE and spec.num_buckets == 258
    assert (spec.vocab_size, spec.eos_token_id, spec.bos_token_id) == (258, 257, 256)


@pytest.mark.parametrize("changes, words", [
    ({"vocab_size": 1}, "vocab_size"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"vocab_size": -5}, "vocab_size"),
    ({"vocab_size": MAX_VOCAB + 1}, "vocab_size"),
    ({"vocab_size": True}, "vocab_size"),
    ({"vocab_size": 100.0}, "vocab_size"),
    ({"vocab_size": "100"}, "vocab_size"),
    ({"eos_token_id": 100}, "eos_token_id 100 outside the vocabulary [0, 100)"),
    ({"eos_token_id": -1}, "eos_token_id -1 outside"),
    ({"eos_token_id": None}, "eos_token_id None outside"),
    ({"bos_token_id": 100}, "bos_token_id 100 outside"),
    ({"max_context": 0}, "max_context"),
    ({"max_lora_rank": 0}, "max_lora_rank"),
    ({"id": ""}, "id"),
    ({"id": " padded "}, "id"),
    ({"id": "two\nlines"}, "id"),
])
def test_declare_rejects_bad_declarations_with_one_line(changes, words):
    kwargs = {"id": "org/model", "vocab_size": 100, "eos_token_id": 5, "bos_token_id": None,
              "max_context": 2048, "max_lora_rank": 8} | changes
    with pytest.raises(ValueError) as caught:
        ModelSpec.declare(**kwargs)
    message = str(caught.value)
    assert words in message and "\n" not in message, message


def test_byte_architecture_needs_the_byte_numbers():
    with pytest.raises(ValueError, match="tiny-byte"):
        ModelSpec(id="x", vocab_size=300, max_context=8, eos_token_id=1, bos_token_id=None,
                  max_lora_rank=4, architecture=BYTE_ARCHITECTURE)
    with pytest.raises(ValueError, match="architecture"):
        ModelSpec(id="x", vocab_size=300, max_context=8, eos_token_id=1, bos_token_id=None,
                  max_lora_rank=4, architecture="dense")
