"""The bucketed model at every vocabulary size: exact, normalised logprobs over the whole
vocabulary, agreement with a plain per-position reference, the same weights in every process,
and no array whose size grows with V."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_cases import (
    BIG,
    CASES,
    SMALL,
    next_token_logprobs,
    perturbed_lora,
    reference_bucket_logprobs,
    reference_token_logprob,
)

from mock_server.engine.model import BaseModel
from mock_server.engine.specs import ModelSpec, lora_key

REPO = Path(__file__).resolve().parents[2]


def prefix_for(case, seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, case.vocab, length)


@pytest.mark.parametrize("case", SMALL, ids=str)
def test_probabilities_sum_to_one_over_the_whole_vocabulary(case):
    """Enumerate every id as the next token after a few prefixes (base and trained adapter)."""
    model = case.model
    for seed, lora in ((0, model.init_lora(2, 4.0, 0)), (1, perturbed_lora(model, 5))):
        for length in (1, 7):
            prefix = prefix_for(case, seed + length, length)
            logp_V = next_token_logprobs(model, lora, prefix, np.arange(case.vocab))
            assert np.isfinite(logp_V).all()
            assert np.exp(logp_V).sum() == pytest.approx(1.0, abs=1e-12)
            reference = reference_bucket_logprobs(model, lora, prefix)[-1]
            want = [reference_token_logprob(case.spec, reference, t) for t in range(case.vocab)]
            np.testing.assert_allclose(logp_V, want, rtol=0, atol=1e-11)


@pytest.mark.parametrize("case", BIG, ids=str)
def test_big_vocabularies_normalise_through_their_buckets(case):
    """Too many ids to enumerate: one id per bucket times the bucket sizes (which sum to V)
    gives the total mass, and random ids anywhere in the range match the reference."""
    model = case.model
    lora = perturbed_lora(model, 2)
    prefix = prefix_for(case, 3, 9)
    buckets = model.buckets
    representatives = buckets.token_of(np.arange(buckets.count), np.zeros(buckets.count))
    logp_K = next_token_logprobs(model, lora, prefix, representatives)
    assert buckets.sizes_K.sum() == case.vocab
    assert float(np.sum(buckets.sizes_K * np.exp(logp_K))) == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(4)
    probes = np.concatenate([[0, case.vocab - 1], case.spec.special_token_ids,
                             rng.integers(0, case.vocab, 400)])
    got = next_token_logprobs(model, lora, prefix, probes)
    reference = reference_bucket_logprobs(model, lora, prefix)[-1]
    want = [reference_token_logprob(case.spec, reference, int(t)) for t in probes]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11)
    # Ids of one bucket are tied: the same probability for its first and last id.
    last = buckets.token_of(np.arange(buckets.count), np.full(buckets.count, 1 - 1e-12))
    np.testing.assert_allclose(next_token_logprobs(model, lora, prefix, last), logp_K,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_and_score_match_the_reference_on_ragged_batches(case):
    """Padding, the blocked EMA (sequences over 64 tokens) and the short-score path."""
    model = case.model
    lora = perturbed_lora(model, 7, rank=4)
    rng = np.random.default_rng(8)
    lengths = [0, 1, 5, 70, 150]
    tokens = [rng.integers(0, case.vocab, n) for n in lengths]
    targets = [rng.integers(0, case.vocab, n) for n in lengths]
    got = model.forward(lora, tokens, targets)
    for toks, tgts, lp in zip(tokens, targets, got, strict=False):
        assert lp.shape == (len(toks),) and lp.dtype == np.float64
        if len(toks):
            table = reference_bucket_logprobs(model, lora, toks)
            want = [reference_token_logprob(case.spec, table[i], int(t))
                    for i, t in enumerate(tgts)]
            np.testing.assert_allclose(lp, want, rtol=0, atol=1e-11)
    for toks in (tokens[2], tokens[3]):  # short path (<= 65 tokens) and forward path
        scores = model.score(lora, toks)
        assert np.isnan(scores[0])
        np.testing.assert_allclose(scores[1:], model.forward(lora, [toks[:-1]], [toks[1:]])[0],
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fresh_adapter_reproduces_the_base_model_and_context_matters(case):
    model = case.model
    prefix = prefix_for(case, 9, 12)
    fresh = model.score(model.init_lora(8, 16.0, 1), prefix)[1:]
    table = reference_bucket_logprobs(model, None, prefix)
    want = [reference_token_logprob(case.spec, table[i], int(t))
            for i, t in enumerate(prefix[1:])]
    np.testing.assert_allclose(fresh, want, rtol=0, atol=1e-12)
    if case.vocab > 2:
        other = prefix.copy()
        other[0] = (other[0] + 1) % case.vocab  # differs only 11 positions back
        assert abs(model.score(model.init_lora(8, 16.0, 1), other)[-1] - fresh[-1]) > 1e-9


@pytest.mark.parametrize("case", CASES, ids=str)
def test_nothing_scales_with_the_vocabulary(case):
    """Base model, adapter and optimizer-sized state: no array has a V-sized dimension
    (for V > 1024), and the adapter is the same size at every V above the bucket count."""
    model = case.model
    arrays = [v for v in vars(model).values() if isinstance(v, np.ndarray)]
    arrays += [v for v in vars(model.embedding).values() if isinstance(v, np.ndarray)]
    arrays += [v for v in vars(model.buckets).values() if isinstance(v, np.ndarray)]
    biggest_dim = max(max(a.shape) for a in arrays)
    assert biggest_dim <= max(1025, min(case.vocab, case.spec.max_buckets) + 1)
    lora = model.init_lora(8, 16.0, 0)
    k = case.spec.num_buckets
    assert lora.params[lora_key("lm_head", "B")].shape == (k, 8)
    assert lora.params[lora_key("lm_head", "A")].shape == (8, case.spec.hidden_dim)
    assert k == min(case.vocab, case.spec.max_buckets)
    merged = model.merged_weights(lora)
    assert merged["lm_head.weight"].shape == (k, case.spec.hidden_dim)
    assert all(max(a.shape) <= max(1024, k) for a in merged.values())
    with pytest.raises(AttributeError):
        model.embed_ext  # noqa: B018  (no dense table for a declared model)


def test_tokens_outside_the_declared_vocabulary_are_rejected():
    case = next(c for c in CASES if c.vocab == 151936)
    lora = case.model.init_lora(2, 4.0, 0)
    case.model.score(lora, np.array([0, 151935, 151645]))
    for bad in ([0, 151936], [-1, 3]):
        with pytest.raises(ValueError, match=r"\[0, 151936\)"):
            case.model.score(lora, np.array(bad))


def test_same_id_same_weights_different_id_different_weights():
    a = BaseModel(ModelSpec.declare("org/same", 70000, 3))
    b = BaseModel(ModelSpec.declare("org/same", 70000, 3))
    c = BaseModel(ModelSpec.declare("org/other", 70000, 3))
    for name in ("mixer_weight", "mixer_bias", "head_weight", "head_bias"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert not np.array_equal(getattr(a, name), getattr(c, name))
    np.testing.assert_array_equal(a.embed(np.arange(0, 70000, 7)), b.embed(np.arange(0, 70000, 7)))
    with pytest.raises(ValueError):
        a.head_bias[0] = 1.0  # read-only


def _digest_script(specs: list[tuple[str, int, int, int | None]]) -> str:
    return (
        "import hashlib, numpy as np\n"
        "from mock_server.engine.model import get_base_model\n"
        "from mock_server.engine.specs import ModelSpec\n"
        f"for name, vocab, eos, bos in {specs!r}:\n"
        "    m = get_base_model(ModelSpec.declare(name, vocab, eos, bos))\n"
        "    lora = m.init_lora(4, 8.0, 11)\n"
        "    toks = np.arange(0, vocab, max(1, vocab // 97))\n"
        "    lp = m.score(lora, toks)[1:]\n"
        "    s = m.sample(lora, toks[:3], num_samples=4, max_tokens=12, temperature=1.3,\n"
        "                 top_k=0, top_p=1.0, seed=5, stop_token_ids=[eos])\n"
        "    blob = lp.tobytes() + b''.join(x.tokens.tobytes() + x.logprobs.tobytes() for x in s)\n"
        "    print(hashlib.sha256(blob).hexdigest())\n"
    )


def test_declared_models_are_bit_identical_in_a_fresh_process():
    """Weights come from SHA-256 of the id, hashes of ids from integer arithmetic: a child
    process with another hash seed computes the same logprobs and samples, bit for bit."""
    specs = [("Qwen/Qwen3-4B", 151936, 151645, 151643), ("org/tiny", 3, 1, None),
             ("org/big", 262144, 17, None), ("org/mid", 1000, 999, 0)]
    env = dict(os.environ, PYTHONHASHSEED="4321")
    child = subprocess.run([sys.executable, "-c", _digest_script(specs)], cwd=REPO,
                           capture_output=True, text=True, check=True, env=env)
    here = subprocess.run([sys.executable, "-c", _digest_script(specs)], cwd=REPO,
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONHASHSEED="1"))
    assert child.stdout.split() == here.stdout.split() and len(here.stdout.split()) == 4
    # ... and the same as in this process.
    namespace: dict[str, object] = {}
    lines: list[str] = []
    namespace["print"] = lines.append
    exec(_digest_script(specs), namespace)  # noqa: S102  (our own script)
    assert lines == here.stdout.split()
    assert len(set(lines)) == 4
    assert all(len(line) == len(hashlib.sha256().hexdigest()) for line in lines)
