"""Sampling at every vocabulary size (SAMPLE-1, VER-3, VER-4): reported logprobs equal scored
ones, ids are reached across the whole range, frequencies follow the token-level distribution
enumerated through ``forward``, and top-k / top-p follow the token rules (ties kept) computed
here independently, over every id of the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import BIG, CASES, next_token_logprobs, perturbed_lora
from sampling_reference import chi_square, reference_filter

from mock_server.engine.head import BucketMap
from mock_server.engine.sampling import sample_rows, truncated_weights

BY_LABEL = {c.label: c for c in CASES}


def full_distribution(case, lora, prompt) -> np.ndarray:
    """log P(v | prompt) for every id v, with ids of one bucket exactly tied: one ``forward``
    datum per bucket (its first id), spread over the bucket's ids."""
    buckets = case.model.buckets
    firsts = buckets.token_of(np.arange(buckets.count), np.zeros(buckets.count))
    logp_K = next_token_logprobs(case.model, lora, prompt, firsts)
    return logp_K[buckets.bucket_of(np.arange(case.vocab))]


SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.8, 40, 0.9), (2.5, 0, 0.3),
            (1.0, 1, 1.0)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_ver3_sampled_logprobs_equal_scored_logprobs(case):
    model = case.model
    lora = perturbed_lora(model, 3)
    rng = np.random.default_rng(0)
    for i, (temperature, top_k, top_p) in enumerate(SETTINGS):
        prompt = rng.integers(0, case.vocab, 1 + 30 * i)
        sequences = model.sample(lora, prompt, num_samples=5, max_tokens=25,
                                 temperature=temperature, top_k=min(top_k, case.vocab),
                                 top_p=top_p, seed=i, stop_token_ids=[case.spec.eos_token_id])
        for s in sequences:
            assert len(s.tokens) == len(s.logprobs) >= 1
            assert s.tokens.min() >= 0 and s.tokens.max() < case.vocab
            full = np.concatenate([prompt, s.tokens])
            np.testing.assert_allclose(s.logprobs, model.score(lora, full)[len(prompt):],
                                       rtol=0, atol=1e-9)
            fwd = model.forward(lora, [full[:-1]], [full[1:]])[0][len(prompt) - 1:]
            np.testing.assert_allclose(s.logprobs, fwd, rtol=0, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_ver4_same_seed_same_tokens(case):
    model = case.model
    lora = perturbed_lora(model, 4)
    kwargs = dict(num_samples=8, max_tokens=20, temperature=0.9, top_k=min(50, case.vocab),
                  top_p=0.95, stop_token_ids=[case.spec.eos_token_id])
    a = model.sample(lora, np.array([0]), seed=11, **kwargs)
    b = model.sample(lora, np.array([0]), seed=11, **kwargs)
    assert [s.tokens.tolist() for s in a] == [s.tokens.tolist() for s in b]
    assert [s.stop_reason for s in a] == [s.stop_reason for s in b]
    if case.vocab >= 32:
        c = model.sample(lora, np.array([0]), seed=12, **kwargs)
        assert [s.tokens.tolist() for s in a] != [s.tokens.tolist() for s in c]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_sample1_first_stop_token_ends_the_row(case):
    model = case.model
    lora = perturbed_lora(model, 5)
    stops = sorted({case.spec.eos_token_id, case.vocab // 2, case.vocab - 1})
    rows = model.sample(lora, np.array([case.vocab // 3]), num_samples=64, max_tokens=30,
                        temperature=1.0, top_k=0, top_p=1.0, seed=2, stop_token_ids=stops)
    for s in rows:
        hits = np.flatnonzero(np.isin(s.tokens, stops))
        if s.stop_reason == "stop":
            assert hits.tolist() == [len(s.tokens) - 1]
        else:
            assert s.stop_reason == "length" and len(s.tokens) == 30 and hits.size == 0
    assert {s.stop_reason for s in rows} == {"stop", "length"} or case.vocab <= 3
    free = model.sample(lora, np.array([0]), num_samples=8, max_tokens=30, temperature=1.0,
                        top_k=0, top_p=1.0, seed=2, stop_token_ids=[])
    assert all(s.stop_reason == "length" and len(s.tokens) == 30 for s in free)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_samples_reach_ids_across_the_whole_range(case):
    """At a flattening temperature 16 x 64 samples land in every tenth of the vocabulary,
    the bottom and top deciles included."""
    model = case.model
    rows = model.sample(model.init_lora(4, 8.0, 0), np.array([case.vocab - 1]), num_samples=16,
                        max_tokens=64, temperature=4.0, top_k=0, top_p=1.0, seed=9,
                        stop_token_ids=[])
    tokens = np.concatenate([s.tokens for s in rows])
    deciles = np.unique(tokens * 10 // case.vocab)
    if case.vocab >= 10:
        assert deciles.tolist() == list(range(10))
    assert tokens.min() < max(1, case.vocab // 10) and tokens.max() >= case.vocab * 9 // 10
    if case.vocab > 1000:
        assert len(np.unique(tokens)) > 900  # ids within buckets differ too


@pytest.mark.parametrize("label", ["v1000-k7", "v258-generic", "v32"])
def test_temperature_one_frequencies_match_the_enumerated_distribution(label):
    case = BY_LABEL[label]
    lora = perturbed_lora(case.model, 6)
    prompt = np.array([1, 2, 3]) % case.vocab
    rows = case.model.sample(lora, prompt, num_samples=20_000, max_tokens=1, temperature=1.0,
                             top_k=0, top_p=1.0, seed=2024, stop_token_ids=[])
    counts = np.bincount([int(s.tokens[0]) for s in rows], minlength=case.vocab)
    probs = np.exp(next_token_logprobs(case.model, lora, prompt, np.arange(case.vocab)))
    stat, dof = chi_square(counts, probs)
    assert stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


@pytest.mark.parametrize("label, temperature, top_k, top_p", [
    ("v1000-k7", 0.7, 250, 0.8),   # k-th id inside the second bucket: that whole bucket stays
    ("v1000-k7", 1.5, 0, 0.5),
    ("v1000-k7", 1.0, 3, 1.0),     # EOS (alone), then a bucket of ~200 tied ids: all kept
    ("v1000", 0.8, 10, 0.9),       # buckets of 3-4 ids, k cuts inside one
    ("v258-generic", 1.2, 30, 0.6),
])
def test_truncated_frequencies_match_the_token_level_reference(label, temperature, top_k,
                                                               top_p):
    case = BY_LABEL[label]
    lora = perturbed_lora(case.model, 8)
    for first in range(5, 50):  # a prompt whose truncated set holds several ids
        prompt = np.array([first, first + 1]) % case.vocab
        probs = reference_filter(full_distribution(case, lora, prompt), temperature, top_k,
                                 top_p)
        if 1 < np.count_nonzero(probs) < case.vocab:
            break
    else:
        raise AssertionError("no prompt gives a truncated set of several ids")
    rows = case.model.sample(lora, prompt, num_samples=20_000, max_tokens=1,
                             temperature=temperature, top_k=top_k, top_p=top_p, seed=99,
                             stop_token_ids=[])
    counts = np.bincount([int(s.tokens[0]) for s in rows], minlength=case.vocab)
    assert not counts[probs == 0].any()
    stat, dof = chi_square(counts, probs)
    assert stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


@pytest.mark.parametrize("seed", range(12))
def test_truncated_weights_equal_the_token_level_rules(seed):
    """Bucket-space top-k / top-p with id counts against the reference over every id, on
    random logits with ties between buckets of equal size."""
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(20, 400))
    buckets = BucketMap(vocab, tuple(rng.integers(0, vocab, 2).tolist()),
                        int(rng.integers(3, 12)))
    logits_S_K = rng.integers(-3, 3, (4, buckets.count)).astype(np.float64)  # many ties
    logits_S_K += np.log(buckets.sizes_K) * rng.integers(0, 2)  # sometimes tie token logits
    temperature = float(rng.choice([0.5, 1.0, 2.0]))
    top_k = int(rng.choice([0, 1, int(rng.integers(1, vocab))]))
    top_p = float(rng.choice([1.0, 0.5, 0.9, 0.2]))
    weights_S_K = truncated_weights(logits_S_K, temperature=temperature, top_k=top_k,
                                    top_p=top_p, buckets=buckets)
    of_V = buckets.bucket_of(np.arange(vocab))
    for logits_K, weights_K in zip(logits_S_K, weights_S_K, strict=False):
        logprobs_V = (logits_K - np.log(buckets.sizes_K))[of_V]
        want_V = reference_filter(logprobs_V, temperature, top_k, top_p)
        got_V = (weights_K / buckets.sizes_K)[of_V]
        got_V = got_V / got_V.sum()
        np.testing.assert_array_equal(got_V == 0, want_V == 0)
        np.testing.assert_allclose(got_V, want_V, rtol=1e-12, atol=1e-15)


def test_sample_rows_shifts_logits_outside_exps_range():
    """Logits far above or below exp's range (the model never returns such, a caller might)
    give the same samples and logprobs as the same logits shifted into range."""
    rng = np.random.default_rng(1)
    base_K = rng.standard_normal(300)
    buckets = BucketMap(5000, (4, 4999), 300)
    results = []
    for offset in (0.0, 900.0, -900.0):
        def step(tokens_S: np.ndarray, offset: float = offset) -> np.ndarray:
            return np.tile(base_K + offset + tokens_S[:, None] % 7, 1)
        results.append(sample_rows(base_K + offset, step, num_samples=6, max_tokens=5,
                                   temperature=1.0, top_k=0, top_p=1.0, seed=3,
                                   stop_token_ids=[], buckets=buckets))
    for rows in results[1:]:
        for got, want in zip(rows, results[0], strict=False):
            np.testing.assert_array_equal(got.tokens, want.tokens)
            np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-9)
    first = results[0][0]
    log_z = np.log(np.exp(base_K).sum())
    bucket = int(buckets.bucket_of(first.tokens[:1])[0])
    assert first.logprobs[0] == pytest.approx(base_K[bucket] - log_z
                                              - np.log(buckets.sizes_K[bucket]), abs=1e-12)


@pytest.mark.parametrize("case", BIG, ids=str)
def test_huge_adapter_weights_keep_sampling_exact(case):
    """An adapter that moves logits by hundreds takes the per-row max path of the model."""
    model = case.model
    lora = perturbed_lora(model, 21, rank=4, alpha=8.0, scale=30.0)
    assert model._compile(lora).row_max
    prompt = np.array([0, case.vocab - 1])
    for s in model.sample(lora, prompt, num_samples=4, max_tokens=10, temperature=1.0,
                          top_k=0, top_p=1.0, seed=1, stop_token_ids=[]):
        np.testing.assert_allclose(s.logprobs, model.score(lora, np.concatenate(
            [prompt, s.tokens]))[2:], rtol=1e-12, atol=1e-9)
        assert np.isfinite(s.logprobs).all()
