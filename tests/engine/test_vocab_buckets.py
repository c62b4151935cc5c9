"""The vocabulary ends of the bucketed architecture, checked by enumeration: the bucket map
(every id in exactly one bucket, sizes summing to V, EOS/BOS alone, uniform ids within a
bucket) and the hashed embedding (distinct ids, distinct rows; "no token" is zero)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import CASES, reference_bucket
from hypothesis import given, settings
from hypothesis import strategies as st

from mock_server.engine.embedding import HashedEmbedding
from mock_server.engine.head import BucketMap
from mock_server.engine.specs import MAX_BUCKETS, ModelSpec


def check_partition(vocab: int, specials: tuple[int, ...], max_buckets: int) -> BucketMap:
    buckets = BucketMap(vocab, specials, max_buckets)
    ids = np.arange(vocab)
    of = buckets.bucket_of(ids)
    assert buckets.count == min(vocab, max_buckets)
    assert of.min() >= 0 and of.max() < buckets.count
    np.testing.assert_array_equal(np.bincount(of, minlength=buckets.count), buckets.sizes_K)
    assert buckets.sizes_K.sum() == vocab and buckets.sizes_K.min() >= 1
    np.testing.assert_allclose(buckets.log_sizes_K, np.log(buckets.sizes_K))
    if vocab <= max_buckets:
        np.testing.assert_array_equal(of, ids)  # one id per bucket
    else:
        for s in set(specials):
            assert buckets.sizes_K[of[s]] == 1, "EOS/BOS share their bucket"
        regular = np.setdiff1d(ids, specials)
        sizes = buckets.sizes_K[np.unique(of[regular])]
        assert sizes.max() - sizes.min() <= 1
        assert np.all(np.diff(of[regular]) >= 0)  # contiguous runs of ids
    for bucket in range(buckets.count):
        members = buckets.members(bucket)
        np.testing.assert_array_equal(members, ids[of == bucket])
    # token_of spreads a uniform u over the members: a grid of u hits every member equally.
    size = int(buckets.sizes_K.max())
    grid = (np.arange(3 * size) + 0.5) / (3 * size)
    for bucket in range(0, buckets.count, max(1, buckets.count // 9)):
        got = buckets.token_of(np.full(len(grid), bucket), grid)
        members, counts = np.unique(got, return_counts=True)
        np.testing.assert_array_equal(members, ids[of == bucket])
        assert counts.max() - counts.min() <= 1
    return buckets


@pytest.mark.parametrize("vocab, specials, max_buckets", [
    (2, (1,), 256), (3, (0, 2), 256), (256, (255,), 256), (257, (0,), 256),
    (258, (256, 257), 256), (1000, (3, 999), 256), (1000, (500,), 7), (1000, (0, 999), 3),
    (5000, (4999, 0), 256), (4096, (17, 17), 64),
])
def test_bucket_map_partitions_the_vocabulary(vocab, specials, max_buckets):
    check_partition(vocab, specials, max_buckets)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), vocab=st.integers(2, 3000), max_buckets=st.integers(3, 300))
def test_bucket_map_property(data, vocab, max_buckets):
    specials = tuple(data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2)))
    check_partition(vocab, specials, max_buckets)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_engine_bucket_map_matches_the_documented_layout(case):
    """The model's map at every test size against a scalar restatement of the layout; for
    the big vocabularies the sizes still sum to V, and ids at both ends, around EOS/BOS and at
    random are where the layout puts them."""
    spec, buckets = case.spec, case.model.buckets
    assert buckets.count == spec.num_buckets
    assert buckets.sizes_K.sum() == spec.vocab_size
    rng = np.random.default_rng(1)
    probes = {0, spec.vocab_size - 1, *spec.special_token_ids}
    probes |= {t + d for t in spec.special_token_ids for d in (-1, 1)
               if 0 <= t + d < spec.vocab_size}
    probes |= set(rng.integers(0, spec.vocab_size, 300).tolist())
    probes_T = np.array(sorted(probes))
    got = buckets.bucket_of(probes_T)
    for token, bucket in zip(probes_T.tolist(), got.tolist(), strict=False):
        want_bucket, want_size = reference_bucket(spec, token)
        assert (bucket, int(buckets.sizes_K[bucket])) == (want_bucket, want_size), token
    # ... and back: a uniform draw inside the bucket of t lands in the same bucket.
    back = buckets.token_of(got, rng.random(len(got)))
    np.testing.assert_array_equal(buckets.bucket_of(back), got)


def test_big_vocabularies_use_a_fixed_number_of_buckets():
    for vocab in (257, 1000, 151936, 262144, 1 << 20):
        spec = ModelSpec.declare("size/probe", vocab, vocab - 1)
        assert spec.num_buckets == MAX_BUCKETS
        sizes = BucketMap(vocab, spec.special_token_ids, spec.max_buckets).sizes_K
        assert sizes.shape == (MAX_BUCKETS,) and sizes.sum() == vocab


@pytest.mark.parametrize("vocab", [2, 3, 5, 32, 258, 1000, 4096, 262144])
def test_hashed_embedding_rows_are_distinct_and_padding_is_zero(vocab):
    embedding = HashedEmbedding(vocab, 8, np.random.default_rng(vocab))
    mixed = embedding.mix(np.arange(1 << embedding.bits))
    assert len(np.unique(mixed)) == 1 << embedding.bits  # a bijection of [0, 2**bits)
    ids = np.arange(vocab)
    low, high = embedding.rows(ids)
    pairs = low * len(embedding.high_ext) + high
    assert len(np.unique(pairs)) == vocab  # distinct ids, distinct (low, high) rows
    rows = embedding.lookup(ids)
    np.testing.assert_allclose(rows, embedding.low_ext[low] + embedding.high_ext[high])
    if vocab <= 4096:
        assert len(np.unique(rows.round(12), axis=0)) == vocab
    assert not embedding.lookup(np.array([vocab])).any()  # the "no token" id
    assert max(len(embedding.low_ext), len(embedding.high_ext)) <= 1025
    out = np.empty((2, 8))
    np.testing.assert_array_equal(embedding.lookup(ids[-2:], out=out), rows[-2:])
