"""The sampler's step (the mixer as gathers from projected per-token tables) against plain-numpy
references: the per-position reference of ``engine_cases`` and ``score``; the projected lookup
against ``lookup(ids) @ W``; the draw against a counted inverse CDF."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import CASES, perturbed_lora, reference_bucket_logprobs

from mock_server.engine.model import _Stepper, get_base_model
from mock_server.engine.sampling import draw
from mock_server.engine.specs import BASE_MODEL_ID

LABELS = ["byte", "v258-generic", "v1000", "v262144"]
BY_LABEL = {c.label: c for c in CASES}


def model_of(label: str):
    return get_base_model(BASE_MODEL_ID) if label == "byte" else BY_LABEL[label].model


@pytest.mark.parametrize("label", LABELS)
def test_projected_step_equals_the_matmul_reference(label):
    """Rows fed different tokens give, at every step, the log-softmax the plain per-position
    reference computes for prompt + those tokens (rounding only), and ``score`` agrees."""
    model = model_of(label)
    lora = perturbed_lora(model, 31)
    vocab = model.spec.vocab_size
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, vocab, 9)
    fed_S_T = rng.integers(0, vocab, (3, 12))
    stepper = _Stepper(model, model._compile(lora), model._features([prompt])[-1], 3)
    stepped_T = []
    for t in range(fed_S_T.shape[1]):
        logits_S_K = stepper.step(fed_S_T[:, t]).copy()
        got_S_K = logits_S_K - np.log(np.exp(logits_S_K).sum(axis=1, keepdims=True))
        for s in range(3):
            tokens = np.concatenate([prompt, fed_S_T[s, : t + 1]])
            want_K = reference_bucket_logprobs(model, lora, tokens)[-1]
            np.testing.assert_allclose(got_S_K[s], want_K, rtol=0, atol=1e-12)
        if t + 1 < fed_S_T.shape[1]:
            bucket = int(model.buckets.bucket_of(fed_S_T[0, t + 1 : t + 2])[0])
            stepped_T.append(got_S_K[0, bucket] - model.buckets.log_sizes_K[bucket])
    scored_T = model.score(lora, np.concatenate([prompt, fed_S_T[0]]))[len(prompt) + 1 :]
    np.testing.assert_allclose(stepped_T, scored_T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("label", LABELS)
def test_projected_lookup_equals_lookup_times_weight(label):
    model = model_of(label)
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((model.spec.embed_dim, 7))
    tables = model.embedding.project(weight)
    assert max(len(t) for t in tables) <= max(1025, model.spec.vocab_size + 1)
    ids = rng.integers(0, model.spec.vocab_size, 50)
    got = model.embedding.lookup_projected(tables, ids, out=np.empty((50, 7)))
    np.testing.assert_allclose(got, model.embed(ids) @ weight, rtol=0, atol=1e-12)


def test_hashed_projection_has_no_vocabulary_sized_table():
    model = BY_LABEL["v262144"].model
    tables = model._step_tables(model._compile(model.init_lora(2, 4.0, 0)))
    assert all(len(t) <= 1025 for t in tables)


@pytest.mark.parametrize("rows", [1, 2, 16])
def test_draw_is_the_counted_inverse_cdf(rows):
    """draw picks, per row, the number of running sums below u·total (plain numpy here);
    zero-weight columns (inner, leading, trailing) are never chosen, u = 1 included."""
    rng = np.random.default_rng(rows)
    for _ in range(200):
        weights_S_K = rng.random((rows, 40)) * (rng.random((rows, 40)) < 0.3)
        weights_S_K[:, 0] = 0.0
        weights_S_K[:, -3:] = 0.0
        weights_S_K[:, 5] += 1e-300  # a tiny but positive weight
        uniform_S = 1.0 - rng.random(rows)
        uniform_S[0] = 1.0 if rng.random() < 0.2 else uniform_S[0]
        got_S = draw(weights_S_K, uniform_S)
        for s in range(rows):
            running = np.add.accumulate(weights_S_K[s])
            want = int(np.sum(running < uniform_S[s] * running[-1]))
            assert got_S[s] == want
            assert weights_S_K[s, got_S[s]] > 0
