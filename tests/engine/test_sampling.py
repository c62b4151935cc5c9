"""SAMPLE-1, VER-3, VER-4: sampling against next-token distributions computed with ``forward``
and an independent temperature / top-k / top-p filter written here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sampling_reference import chi_square, reference_filter

from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_ID, BOS_TOKEN, EOS_TOKEN, VOCAB_SIZE, Lora

MODEL = get_base_model(BASE_MODEL_ID)
PROMPT = np.array([BOS_TOKEN] + list(b"The quick brown fox "), dtype=np.int64)


def trained_like_lora(seed: int = 0) -> Lora:
    lora = MODEL.init_lora(4, 8.0, seed)
    rng = np.random.default_rng(seed + 50)
    return Lora(params={k: (a + 0.2 * rng.standard_normal(a.shape) if ".lora_B." in k else a)
                        for k, a in lora.params.items()}, rank=4, alpha=8.0)


LORA = trained_like_lora()


def next_token_logprobs(lora: Lora, prefix: np.ndarray) -> np.ndarray:
    """log P(v | prefix) for every v, from ``forward`` (one datum per candidate token)."""
    targets = np.zeros((VOCAB_SIZE, len(prefix)), dtype=np.int64)
    targets[:, -1] = np.arange(VOCAB_SIZE)
    out = MODEL.forward(lora, [prefix] * VOCAB_SIZE, list(targets))
    return np.array([row[-1] for row in out])


def draw(**overrides):
    prompt = overrides.pop("prompt", PROMPT)
    kwargs = dict(num_samples=32, max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, seed=7,
                  stop_token_ids=[EOS_TOKEN])
    kwargs.update(overrides)
    return MODEL.sample(LORA, prompt, **kwargs)


def test_ver4_same_seed_same_tokens_different_seed_different_tokens():
    a = draw(seed=123, temperature=0.8, top_k=40, top_p=0.95)
    b = draw(seed=123, temperature=0.8, top_k=40, top_p=0.95)
    c = draw(seed=124, temperature=0.8, top_k=40, top_p=0.95)
    assert [s.tokens.tolist() for s in a] == [s.tokens.tolist() for s in b]
    assert [s.stop_reason for s in a] == [s.stop_reason for s in b]
    assert [s.tokens.tolist() for s in a] != [s.tokens.tolist() for s in c]
    huge_seed = draw(seed=2**70 + 5)
    assert len(huge_seed) == 32


def test_sample1_stop_token_ends_row_and_is_included():
    sequences = draw(num_samples=64, max_tokens=20)
    reasons = {s.stop_reason for s in sequences}
    assert reasons == {"stop", "length"}  # the prior makes both common at this length
    for s in sequences:
        assert s.tokens.dtype == np.int64 and s.logprobs.dtype == np.float64
        assert len(s.tokens) == len(s.logprobs)
        eos_at = np.flatnonzero(s.tokens == EOS_TOKEN)
        if s.stop_reason == "stop":
            assert eos_at.tolist() == [len(s.tokens) - 1] and len(s.tokens) <= 20
            np.testing.assert_allclose(s.logprobs[-1], MODEL.score(
                LORA, np.concatenate([PROMPT, s.tokens]))[-1], atol=1e-9)
        else:
            assert len(s.tokens) == 20 and eos_at.size == 0


def test_sample1_any_stop_set_first_occurrence_wins():
    stops = [ord(" "), ord("e")]
    for s in draw(num_samples=64, max_tokens=12, stop_token_ids=stops):
        hits = np.flatnonzero(np.isin(s.tokens, stops))
        if s.stop_reason == "stop":
            assert hits.tolist() == [len(s.tokens) - 1]
        else:
            assert hits.size == 0 and len(s.tokens) == 12


def test_empty_stop_list_runs_to_max_tokens():
    sequences = draw(num_samples=64, max_tokens=30, stop_token_ids=[])
    assert all(s.stop_reason == "length" and len(s.tokens) == 30 for s in sequences)
    assert any(EOS_TOKEN in s.tokens[:-1].tolist() for s in sequences)  # EOS did not stop it


@settings(max_examples=8, deadline=None)
@given(temperature=st.sampled_from([0.3, 1.0, 2.5]), top_k=st.sampled_from([0, 1, 5, 50]),
       top_p=st.sampled_from([1.0, 0.9, 0.3]), prompt_len=st.integers(1, 150),
       seed=st.integers(0, 2**32))
def test_ver3_logprobs_are_temperature_one_policy_logprobs(temperature, top_k, top_p,
                                                           prompt_len, seed):
    """Whatever the truncation, reported logprobs equal score() and forward() (1e-9)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB_SIZE, prompt_len)
    sequences = MODEL.sample(LORA, prompt, num_samples=4, max_tokens=40,
                             temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                             stop_token_ids=[EOS_TOKEN])
    for s in sequences:
        full = np.concatenate([prompt, s.tokens])
        np.testing.assert_allclose(s.logprobs, MODEL.score(LORA, full)[prompt_len:], atol=1e-9)
        fwd = MODEL.forward(LORA, [full[:-1]], [full[1:]])[0][prompt_len - 1:]
        np.testing.assert_allclose(s.logprobs, fwd, atol=1e-9)


def test_top_k_one_is_greedy():
    sequences = draw(num_samples=3, max_tokens=8, top_k=1, temperature=0.7, stop_token_ids=[])
    prefix = PROMPT.copy()
    greedy = []
    for _ in range(8):
        nxt = int(np.argmax(next_token_logprobs(LORA, prefix)))
        greedy.append(nxt)
        prefix = np.append(prefix, nxt)
    for s in sequences:
        assert s.tokens.tolist() == greedy


def test_temperature_one_frequencies_match_softmax():
    n = 20_000
    sequences = draw(num_samples=n, max_tokens=1, seed=2024)
    counts = np.bincount([int(s.tokens[0]) for s in sequences], minlength=VOCAB_SIZE)
    probs = np.exp(next_token_logprobs(LORA, PROMPT))
    stat, dof = chi_square(counts, probs)
    assert stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


def test_truncated_frequencies_match_reference_filter():
    n = 20_000
    temperature, top_k, top_p = 0.7, 30, 0.8
    sequences = draw(num_samples=n, max_tokens=1, seed=99, temperature=temperature,
                     top_k=top_k, top_p=top_p)
    counts = np.bincount([int(s.tokens[0]) for s in sequences], minlength=VOCAB_SIZE)
    probs = reference_filter(next_token_logprobs(LORA, PROMPT), temperature, top_k, top_p)
    assert 1 < np.count_nonzero(probs) < top_k  # top-p really cut below top-k here
    assert not counts[probs == 0].any()
    stat, dof = chi_square(counts, probs)
    assert stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


def test_second_step_is_conditioned_on_the_first_token():
    """The incremental state after a sampled token gives the distribution of prompt + token."""
    sequences = draw(num_samples=20_000, max_tokens=2, seed=5, stop_token_ids=[])
    firsts = np.array([int(s.tokens[0]) for s in sequences])
    top = int(np.bincount(firsts).argmax())
    seconds = np.array([int(s.tokens[1]) for s in sequences if s.tokens[0] == top])
    probs = np.exp(next_token_logprobs(LORA, np.append(PROMPT, top)))
    stat, dof = chi_square(np.bincount(seconds, minlength=VOCAB_SIZE), probs)
    assert stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


def test_seedless_sampling_and_bad_arguments():
    assert len(draw(seed=None, num_samples=2)) == 2
    with pytest.raises(ValueError):
        draw(prompt=np.zeros(0, dtype=np.int64))
    with pytest.raises(ValueError):
        draw(temperature=0.0)
    with pytest.raises(ValueError):
        draw(max_tokens=0)
    for bad in (dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)):
        with pytest.raises(ValueError):
            draw(**bad)
