"""``schemas.decode`` (the one-pass path for forward bodies) against the exact path
(``parse_json`` -> ``validate`` -> ``canonical_digest``): same body, same digest, same error
(status, type, message, details) for every body, and the ORD-3 digest of contract 1.1 (JSON
values: numbers by value, key order ignored, null distinct from absent)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mock_server.backend import schemas
from mock_server.backend.errors import WhitneyError


def _plain(value: Any) -> Any:
    """A body as plain JSON-like values (arrays as lists, numbers as floats where a float
    field holds them), so both paths' models compare."""
    if isinstance(value, np.ndarray):
        return [float(v) if value.dtype.kind == "f" else int(v) for v in value.tolist()]
    if isinstance(value, schemas.Body):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _exact(raw: bytes, model: type[schemas.Body]) -> Any:
    try:
        payload = schemas.parse_json(raw)
        body = schemas.validate(model, payload)
        return ("ok", _normalise(model, _plain(body)), schemas.canonical_digest(payload))
    except WhitneyError as exc:
        return ("error", exc.status, exc.type, exc.message, exc.details)


def _decoded(raw: bytes, model: type[schemas.Body]) -> Any:
    try:
        body, digest = schemas.decode(raw, model)
        return ("ok", _normalise(model, _plain(body)), digest)
    except WhitneyError as exc:
        return ("error", exc.status, exc.type, exc.message, exc.details)


def _normalise(model: type[schemas.Body], plain: Any) -> Any:
    """Float fields hold floats on both paths (pydantic keeps a float field's int as int)."""
    if model is schemas.Forward and isinstance(plain, dict):
        plain["loss_config"] = {k: float(v) for k, v in plain["loss_config"].items()}
        for datum in plain["data"]:
            datum["loss_inputs"] = {k: [float(x) for x in v]
                                    for k, v in datum["loss_inputs"].items()}
    return plain


def _assert_same(raw: bytes, model: type[schemas.Body] = schemas.Forward) -> Any:
    exact, decoded = _exact(raw, model), _decoded(raw, model)
    assert decoded == exact, raw[:300]
    return decoded


def forward(n: int = 2, tokens: int = 4, **changes: Any) -> dict[str, Any]:
    data = []
    for i in range(n):
        ids = [256] + [97 + (i + t) % 26 for t in range(tokens)]
        data.append({"model_input": {"token_ids": ids[:-1]},
                     "loss_inputs": {"target_tokens": ids[1:],
                                     "logprobs": [-1.5 - 0.25 * t for t in range(tokens)],
                                     "advantages": [0.5 - t for t in range(tokens)],
                                     "mask": [1.0] * tokens}})
    return {"seq": 3, "loss_function": "importance_sampling", "loss_config": {}, "data": data,
            **changes}


def test_the_fast_path_takes_an_ordinary_forward_body() -> None:
    raw = orjson.dumps(forward())
    body, digest = schemas._forward_fast(raw)
    assert isinstance(body.data[0].model_input.token_ids, np.ndarray)
    assert schemas.forward_arrays(body)[0][0].dtype == np.int64
    assert _assert_same(raw)[0] == "ok"


CASES = [
    b"", b"   ", b"{}", b"[]", b"null", b"{", b"\xef\xbb\xbf" + orjson.dumps(forward()),
    orjson.dumps(forward()) + b" x", orjson.dumps(forward(seq=0)), orjson.dumps(forward(seq=2**63)),
    orjson.dumps(forward(seq=True)), orjson.dumps(forward(seq="3")), orjson.dumps(forward(data=[])),
    orjson.dumps(forward(loss_config={"beta": True})), orjson.dumps(forward(extra=1)),
    orjson.dumps(forward(loss_config=[])), orjson.dumps(forward(loss_function=7)),
    orjson.dumps(forward(loss_config={"clip_low_threshold": 0.5, "clip_high_threshold": 2})),
]


@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_whole_body_cases_agree(raw: bytes) -> None:
    _assert_same(raw)


def _text_cases() -> list[bytes]:
    base = json.dumps(forward())
    swaps = [
        ('"token_ids": [256', '"token_ids": [256.0'),        # contract 1.1: an integer
        ('"token_ids": [256', '"token_ids": [256.5'),        # a fraction: 422
        ('"token_ids": [256', '"token_ids": [-1'),
        ('"token_ids": [256', '"token_ids": [true'),
        ('"token_ids": [256', '"token_ids": [[256]'),        # nested: as_buffer would flatten
        ('"token_ids": [256', '"token_ids": [null'),
        ('"token_ids": [256', '"token_ids": [9223372036854775808'),
        ('"token_ids": [256', '"token_ids": [123456789012345678901234567890'),
        ('"token_ids": [256', '"token_ids": []'.rstrip("]") + ' ['),
        ('"mask": [1.0', '"mask": [1'),                       # an int in a float field
        ('"mask": [1.0', '"mask": [-0.0'),
        ('"mask": [1.0', '"mask": [9007199254740993'),      # beyond 2**53: exact path
        ('"mask": [1.0', '"mask": [1e999'),                  # overflow: 422
        ('"mask": [1.0', '"mask": [NaN'),                    # 400, named
        ('"mask": [1.0', '"mask": [-Infinity'),
        ('"mask": [1.0', '"mask": ["1"'),
        ('"mask": [1.0', '"mask": [[1.0]'),
        ('"mask": [1.0, 1.0, 1.0, 1.0]', '"mask": []'),
        ('"mask": [1.0, 1.0, 1.0, 1.0]', '"mask": [1.0, 1.0]'),
        ('"mask": [1.0', '"mask": [1.0], "mask": [1.0'),     # a repeated key: the last wins
        ('"advantages"', '"weights"'),
        ('"loss_function": "importance_sampling"', '"loss_function": "a[b"'),
        ('"loss_config": {}', '"loss_config": {"beta": 1e-3, "beta": 2}'),
        ('"loss_config": {}', '"loss_config": {"beta": 9007199254740993}'),
        ('"loss_config": {}', '"loss_config": {"k": "\\ud800"}'),
        ('"model_input": {', '"model_input": {"attention_mask": [1], '),
        ('"seq": 3', '"seq": 3.0'),
        ('"seq": 3', '"seq": 3, "seq": 4'),
        ('"seq": 3', '"seq": 18446744073709551615'),
        ('{"model_input"', '{"extra": 1, "model_input"'),
    ]
    out = []
    for old, new in swaps:
        assert old in base, old
        out.append(base.replace(old, new, 1).encode())
    return out


@pytest.mark.parametrize("raw", _text_cases(), ids=range(len(_text_cases())))
def test_text_cases_agree(raw: bytes) -> None:
    _assert_same(raw)


def test_nan_is_named_in_the_400() -> None:
    error = _exact(json.dumps(forward()).replace("[1.0", "[NaN", 1).encode(), schemas.Forward)
    assert error[:3] == ("error", 400, "malformed_json")
    assert "NaN is not a JSON number" in error[3] and "column" in error[3]


def test_int64_messages_say_the_bound() -> None:
    for raw in (b'{"seq": 123456789012345678901234567890}', b'{"seq": 18446744073709551616}',
                b'{"seq": 9223372036854775808}'):
        error = _exact(raw, schemas.ExportLora)
        assert error[:3] == ("error", 422, "validation_error")
        assert "9223372036854775807" in error[3] and "64-bit" in error[3], error[3]


def test_one_field_path_style_and_no_class_names() -> None:
    body = forward(extra=None)
    del body["extra"]
    body["data"][1]["loss_inputs"]["mask"] = "no"
    error = _exact(orjson.dumps(body), schemas.Forward)
    assert error[3].startswith("data[1].loss_inputs.mask: "), error[3]
    body["data"][1]["weight"] = 1
    unknown = _exact(orjson.dumps(body), schemas.Forward)
    assert unknown[2] == "unknown_field" and unknown[4]["fields"] == ["data[1].weight"]
    prompt = _exact(b'{"seq": 1, "version": 0, "prompt": 5, "num_samples": 1, "sampling": '
                    b'{"max_tokens": 1, "temperature": 1, "top_k": 0, "top_p": 1}}', schemas.Sample)
    assert prompt[3] == "prompt: Input should be an object", prompt[3]
    assert "Prompt" not in json.dumps(prompt[4])


@pytest.mark.parametrize("raw,model", [
    (b'{"seq": 5.0, "version": 0.0, "token_ids": [1, 2.0, 3e0]}', schemas.Logprobs),
    (b'{"ttl_seconds": 9051.0}', schemas.CreateSession),
    (b'{"seq": 565.0, "version": 0, "prompt": {"token_ids": [3.0]}, "num_samples": 2.0, '
     b'"sampling": {"max_tokens": 4.0, "temperature": 1, "top_k": 0.0, "top_p": 1, '
     b'"seed": 7.0, "stop_token_ids": [257.0]}}', schemas.Sample),
])
def test_integers_by_value_contract_1_1(raw: bytes, model: type[schemas.Body]) -> None:
    """Every integer field takes a number with an integral value, as that integer."""
    body = schemas.decode(raw, model).body
    for name, value in body:
        assert not isinstance(value, float) or name not in ("seq", "version", "num_samples")
    assert schemas.decode(raw, model).digest == schemas.canonical_digest(
        json.loads(raw.decode().replace(".0", "").replace("3e0", "3")))


def test_fractions_stay_422() -> None:
    for raw in (b'{"seq": 1.5}', b'{"seq": 15e-1}'):
        error = _exact(raw, schemas.ExportLora)
        assert error[:3] == ("error", 422, "validation_error")
        assert "integer" in error[3]


# -- ORD-3's digest: JSON values (contract 1.1) ----------------------------------------------
def test_digest_numbers_by_value_and_key_order() -> None:
    digest = schemas.canonical_digest
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1.0, 2e0], "a": 1.0})
    assert digest({"a": -0.0}) == digest({"a": 0})
    assert digest([0.5, 1]) == digest([0.5, 1.0])
    assert digest({"a": None}) != digest({})
    assert digest({"a": 1}) != digest({"a": 1.5})
    assert digest({"a": 2**63}) != digest({"a": 2**63 + 1})
    assert digest({"a": "1"}) != digest({"a": 1})
    assert digest({"a": True}) != digest({"a": 1})
    assert digest([1, [2]]) != digest([[1], 2])
    assert digest({"a": [1, "x"]}) != digest({"a": [1], "x": []})


JSON_NUMBERS = st.one_of(st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | JSON_NUMBERS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=4),
    max_leaves=20)


def _respell(value: Any) -> Any:
    """The same JSON value written differently: integral floats as ints and back, keys
    reversed."""
    if isinstance(value, dict):
        return {k: _respell(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_respell(v) for v in value]
    if type(value) is float and value.is_integer():
        return int(value)
    if type(value) is int and abs(value) <= 2**53:
        return float(value)
    return value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_VALUES)
def test_digest_ignores_spelling(value: Any) -> None:
    assert schemas.canonical_digest(_respell(value)) == schemas.canonical_digest(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), tokens=st.integers(1, 5), data=st.data())
def test_generated_forward_bodies_agree(n: int, tokens: int, data: st.DataObject) -> None:
    """Forward bodies with generated numbers (any JSON number where one goes, ints in float
    fields, token ids as ints or floats) read the same by both paths."""
    body = forward(n, tokens)
    for datum in body["data"]:
        for name in ("logprobs", "advantages", "mask"):
            datum["loss_inputs"][name] = data.draw(st.lists(JSON_NUMBERS, min_size=tokens,
                                                            max_size=tokens))
        if data.draw(st.booleans()):
            datum["model_input"]["token_ids"] = [
                data.draw(st.sampled_from([t, float(t), t + 0.5])) for t in
                datum["model_input"]["token_ids"]]
    body["loss_config"] = data.draw(st.dictionaries(st.sampled_from(["beta", "x"]),
                                                    JSON_NUMBERS, max_size=2))
    raw = json.dumps(body).encode()
    _assert_same(raw)
    respelled = json.dumps(_respell(body)).encode()
    exact, other = _exact(raw, schemas.Forward), _exact(respelled, schemas.Forward)
    if exact[0] == "ok" and other[0] == "ok":
        assert _decoded(respelled, schemas.Forward)[2] == exact[2]
