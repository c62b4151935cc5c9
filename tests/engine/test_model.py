"""The tiny byte model against a plain per-position reference implementation.

The reference below re-derives the architecture documented in ``mock_server/model.py`` with a
scalar loop over positions (no blocked EMA, no batching, no padding) from the frozen base
arrays and the LoRA factors, so batching, the EMA scan and the LoRA merge are all checked.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mock_server.engine.model import BaseModel, get_base_model
from mock_server.engine.specs import (
    BASE_MODEL_ID,
    BASE_MODEL_SPECS,
    BOS_TOKEN,
    EOS_TOKEN,
    VOCAB_SIZE,
    Lora,
    lora_key,
)

MODEL = get_base_model(BASE_MODEL_ID)
REPO = Path(__file__).resolve().parents[2]


def perturbed_lora(rank: int = 4, alpha: float = 8.0, seed: int = 3, scale: float = 0.2) -> Lora:
    """A LoRA whose B is non-zero, so the adapter actually changes the model."""
    lora = MODEL.init_lora(rank, alpha, seed)
    rng = np.random.default_rng(seed + 100)
    params = {k: (a + scale * rng.standard_normal(a.shape) if ".lora_B." in k else a)
              for k, a in lora.params.items()}
    return Lora(params=params, rank=rank, alpha=alpha)


def reference_log_softmax_T_V(lora: Lora | None, tokens_T: np.ndarray) -> np.ndarray:
    """Log-softmax over the vocabulary after each prefix tokens_T[:t+1], one position at a time."""
    emb = MODEL.embed_ext[:VOCAB_SIZE]
    w_mix, w_head = MODEL.mixer_weight.copy(), MODEL.head_weight.copy()
    if lora is not None:
        s = lora.alpha / lora.rank
        for name, w in (("mixer", w_mix), ("lm_head", w_head)):
            w += s * lora.params[f"base_model.model.{name}.lora_B.weight"] @ \
                lora.params[f"base_model.model.{name}.lora_A.weight"]
    decay = MODEL.spec.ema_decay
    ema = np.zeros(emb.shape[1])
    prev = np.zeros(emb.shape[1])
    out = np.empty((len(tokens_T), VOCAB_SIZE))
    for t, tok in enumerate(tokens_T):
        ema = decay * ema + (1 - decay) * emb[tok]
        x = np.concatenate([emb[tok], prev, ema])
        h = np.tanh(w_mix @ x + MODEL.mixer_bias)
        logits = w_head @ h + MODEL.head_bias
        out[t] = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        prev = emb[tok]
    return out


def random_tokens(rng: np.random.Generator, length: int) -> np.ndarray:
    return rng.integers(0, VOCAB_SIZE, length)


def test_spec_and_constants():
    spec = MODEL.spec
    assert (BOS_TOKEN, EOS_TOKEN, VOCAB_SIZE) == (256, 257, 258)
    assert spec.id == BASE_MODEL_ID and spec.vocab_size == 258
    assert spec.eos_token_id == EOS_TOKEN and spec.bos_token_id == BOS_TOKEN
    assert spec.max_context == 2048 and spec.max_lora_rank == 64
    assert spec.capabilities_entry() == {"id": BASE_MODEL_ID, "vocab_size": 258,
                                         "max_context": 2048, "eos_token_id": 257,
                                         "max_lora_rank": 64, "bos_token_id": 256}
    assert MODEL.target_modules == ("mixer", "lm_head")


def test_get_base_model_is_cached_and_rejects_unknown_ids():
    assert get_base_model(BASE_MODEL_ID) is MODEL
    with pytest.raises(KeyError):
        get_base_model("whitney-mock/unknown")


def test_init_lora_peft_shapes_zero_b_and_seeded_a():
    lora = MODEL.init_lora(5, 10.0, 7)
    d, h = MODEL.spec.embed_dim, MODEL.spec.hidden_dim
    expected = {
        lora_key("mixer", "A"): (5, 3 * d), lora_key("mixer", "B"): (h, 5),
        lora_key("lm_head", "A"): (5, h), lora_key("lm_head", "B"): (VOCAB_SIZE, 5),
    }
    assert {k: a.shape for k, a in lora.params.items()} == expected
    assert lora_key("lm_head", "A") == "base_model.model.lm_head.lora_A.weight"
    for key, a in lora.params.items():
        assert a.dtype == np.float64
        if ".lora_B." in key:
            assert not a.any()
        else:
            assert np.abs(a).max() <= 1 / np.sqrt(a.shape[1]) and a.std() > 0
    again = MODEL.init_lora(5, 10.0, 7)
    other = MODEL.init_lora(5, 10.0, 8)
    for key in lora.params:
        np.testing.assert_array_equal(lora.params[key], again.params[key])
    assert not np.array_equal(lora.params[lora_key("mixer", "A")],
                              other.params[lora_key("mixer", "A")])
    assert lora.scale == 2.0


@pytest.mark.parametrize("rank, alpha", [(0, 1.0), (65, 1.0), (4, 0.0)])
def test_init_lora_rejects_bad_rank_or_alpha(rank, alpha):
    with pytest.raises(ValueError):
        MODEL.init_lora(rank, alpha, 0)


def test_lora_copy_is_deep():
    lora = perturbed_lora()
    clone = lora.copy()
    key = lora_key("lm_head", "B")
    clone.params[key][0, 0] += 1.0
    assert lora.params[key][0, 0] != clone.params[key][0, 0]
    assert (clone.rank, clone.alpha) == (lora.rank, lora.alpha)


def test_fresh_lora_equals_base_model():
    rng = np.random.default_rng(0)
    tokens_T = random_tokens(rng, 40)
    targets_T = random_tokens(rng, 40)
    got = MODEL.forward(MODEL.init_lora(8, 16.0, 1), [tokens_T], [targets_T])[0]
    want = reference_log_softmax_T_V(None, tokens_T)[np.arange(40), targets_T]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(0, 150), min_size=1, max_size=5), seed=st.integers(0, 999))
def test_forward_matches_reference_for_ragged_batches(lengths, seed):
    """Padding, the blocked EMA (blocks of 64) and the LoRA merge against the scalar loop."""
    rng = np.random.default_rng(seed)
    lora = perturbed_lora(rank=int(rng.integers(1, 9)), seed=seed)
    tokens = [random_tokens(rng, n) for n in lengths]
    targets = [random_tokens(rng, n) for n in lengths]
    got = MODEL.forward(lora, tokens, targets)
    assert len(got) == len(lengths)
    for toks, tgts, lp in zip(tokens, targets, got, strict=False):
        assert lp.dtype == np.float64 and lp.shape == (len(toks),)
        if len(toks):
            want = reference_log_softmax_T_V(lora, toks)[np.arange(len(toks)), tgts]
            np.testing.assert_allclose(lp, want, rtol=0, atol=1e-11)


def test_merged_weights_match_w_plus_scaled_ba():
    lora = perturbed_lora(rank=3, alpha=5.0)
    merged = MODEL.merged_weights(lora)
    s = 5.0 / 3
    for name, base in (("mixer", MODEL.mixer_weight), ("lm_head", MODEL.head_weight)):
        b = lora.params[f"base_model.model.{name}.lora_B.weight"]
        a = lora.params[f"base_model.model.{name}.lora_A.weight"]
        np.testing.assert_allclose(merged[f"{name}.weight"], base + s * b @ a, atol=1e-14)
    np.testing.assert_array_equal(merged["lm_head.bias"], MODEL.head_bias)
    assert merged["embed_tokens.weight"].shape == (VOCAB_SIZE, MODEL.spec.embed_dim)


def test_base_weights_are_identical_across_instances_and_read_only():
    other = BaseModel(BASE_MODEL_SPECS[BASE_MODEL_ID])
    assert other is not MODEL
    for name in ("embed_ext", "mixer_weight", "mixer_bias", "head_weight", "head_bias"):
        np.testing.assert_array_equal(getattr(other, name), getattr(MODEL, name))
    with pytest.raises(ValueError):
        MODEL.head_bias[0] = 1.0


def _digest_script() -> str:
    return (
        "import hashlib, numpy as np\n"
        "from mock_server.engine.model import get_base_model\n"
        "from mock_server.engine.specs import BASE_MODEL_ID\n"
        "m = get_base_model(BASE_MODEL_ID)\n"
        "lora = m.init_lora(4, 8.0, 11)\n"
        "toks = np.arange(0, 258, 3)\n"
        "print(hashlib.sha256(m.score(lora, toks)[1:].tobytes()).hexdigest())\n"
    )


def test_logprobs_are_bit_identical_in_a_fresh_process():
    """Base weights derive from SHA-256 of the id, not from Python's randomised hash().

    The child keeps our environment: OpenBLAS picks its kernels from it (OPENBLAS_CORETYPE),
    and a different kernel may round matmuls differently in the last bit.
    """
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run([sys.executable, "-c", _digest_script()], cwd=REPO,
                            capture_output=True, text=True, check=True, env=env)
    here = MODEL.score(MODEL.init_lora(4, 8.0, 11), np.arange(0, 258, 3))[1:]
    assert result.stdout.strip() == hashlib.sha256(here.tobytes()).hexdigest()


def test_logits_depend_on_context_beyond_last_token():
    lora = MODEL.init_lora(4, 8.0, 0)
    last = ord("e")
    # same last token, different previous token
    a = MODEL.score(lora, np.array([ord("t"), ord("h"), last, ord("x")]))
    b = MODEL.score(lora, np.array([ord("t"), ord("q"), last, ord("x")]))
    assert abs(a[-1] - b[-1]) > 1e-3
    # same last two tokens, difference only three positions back (the EMA carries it)
    c = MODEL.score(lora, np.array([ord("a"), ord("z"), ord("h"), last, ord("x")]))
    d = MODEL.score(lora, np.array([ord("k"), ord("z"), ord("h"), last, ord("x")]))
    assert abs(c[-1] - d[-1]) > 1e-4


def test_score_matches_forward_on_shifted_targets():
    rng = np.random.default_rng(5)
    lora = perturbed_lora()
    tokens_T = random_tokens(rng, 77)
    scores_T = MODEL.score(lora, tokens_T)
    assert scores_T.shape == (77,) and np.isnan(scores_T[0])
    fwd = MODEL.forward(lora, [tokens_T[:-1]], [tokens_T[1:]])[0]
    np.testing.assert_array_equal(scores_T[1:], fwd)
    assert np.isnan(MODEL.score(lora, tokens_T[:1])).all()


def test_prior_favours_printable_ascii_and_eos():
    """The base prior is text-like: printable bytes and EOS dominate, BOS is never predicted."""
    rng = np.random.default_rng(9)
    printable = np.arange(32, 127)
    tokens_T = rng.choice(printable, 300)
    lsm_T_V = reference_log_softmax_T_V(None, tokens_T)
    probs_T_V = np.exp(lsm_T_V)
    assert probs_T_V[:, printable].sum(axis=1).mean() > 0.9
    assert 0.01 < probs_T_V[:, EOS_TOKEN].mean() < 0.1
    assert probs_T_V[:, BOS_TOKEN].max() < 1e-4
    entropy_T = -(probs_T_V * lsm_T_V).sum(axis=1)
    assert entropy_T.mean() > 2.5  # enough diversity for RL to have signal


def test_target_tokens_as_floats_are_accepted_and_bad_tokens_rejected():
    lora = MODEL.init_lora(2, 4.0, 0)
    toks = np.array([1, 2, 3])
    as_int = MODEL.forward(lora, [toks], [np.array([4, 5, 6])])[0]
    as_float = MODEL.forward(lora, [toks], [np.array([4.0, 5.0, 6.0])])[0]
    np.testing.assert_array_equal(as_int, as_float)
    for bad in ([4.5, 5.0, 6.0], [4, 5, 258], [-1, 5, 6]):
        with pytest.raises(ValueError):
            MODEL.forward(lora, [toks], [np.array(bad)])
    with pytest.raises(ValueError):
        MODEL.forward(lora, [toks], [np.array([1, 2])])
    with pytest.raises(ValueError):
        MODEL.score(lora, np.array([0, 300]))


def test_huge_adapter_weights_stay_exact_and_finite():
    """Logits far from the prior (|W_head|_1 in the hundreds) take the per-row max path of
    the softmax and still match the reference."""
    rng = np.random.default_rng(21)
    lora = perturbed_lora(rank=4, alpha=8.0, seed=21, scale=30.0)
    assert MODEL._compile(lora).row_max  # the static logit bound is too loose here
    tokens_T, targets_T = random_tokens(rng, 50), random_tokens(rng, 50)
    got = MODEL.forward(lora, [tokens_T], [targets_T])[0]
    want = reference_log_softmax_T_V(lora, tokens_T)[np.arange(50), targets_T]
    assert np.isfinite(got).all() and got.min() < -100  # far from a uniform-ish model
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    assert not MODEL._compile(perturbed_lora()).row_max  # ordinary adapters: static bound
