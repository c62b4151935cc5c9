"""Request bodies of the contract: strict pydantic v2 models, JSON parsing, and ORD-3's digest.

Every model forbids unknown fields (ERR-4) and is strict: a float field accepts integers,
booleans are never numbers, strings are never numbers, and non-finite numbers are refused
(ERR-2). An integer field accepts any JSON number whose value is an integer (contract 1.1, as
JSON Schema counts integers: ``565``, ``565.0`` and ``5.65e2`` alike); ``1.5`` stays 422.
``tests/conformance/test_schema_drift.py`` proves these models and ``openapi.yaml`` agree.

Two paths read a body, with one result (:func:`decode`):

- the exact path, for every body: :func:`parse_json` (orjson; 400 ``malformed_json``),
  :func:`validate` (pydantic; 422) and :func:`canonical_digest` (ORD-3, the JSON value).
- the one-pass path, for ``forward`` / ``forward_backward`` bodies (the large ones): simdjson
  parses the document natively and every array goes straight into numpy, checked, hashed and
  handed to the model without a Python object per number. It never decides an error: any body
  it does not accept whole (an error of any kind, or a case it leaves to the exact path, such
  as ``3.0`` among token ids or a number beyond 2**53 in a float field) is read again by the
  exact path, which gives every message.

``tests/backend/test_decode.py`` checks that both paths agree on every body it generates.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
import typing
from typing import Annotated, Any, Literal

import numpy as np
import orjson
import simdjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError

from .errors import MalformedJSON, ValidationFailed

__all__ = ["INT64_MAX", "Body", "Decoded", "canonical_digest", "decode", "field_path",
           "forward_arrays", "parse_json", "validate"]

INT64_MAX = 2**63 - 1
_EXACT = float(2**53)  # a double above this may stand for an integer literal it rounded


def _integral(value: Any) -> Any:
    """Contract 1.1: a number whose value is an integer is that integer (``3.0`` -> ``3``)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


#: Marks an integer field: any JSON number with an integral value (bools, strings and
#: fractions are still refused by the strict ``int`` it precedes).
INTEGRAL = BeforeValidator(_integral)
Integer = Annotated[int, INTEGRAL]
Seq = Annotated[int, Field(ge=1, le=INT64_MAX), INTEGRAL]
VersionNumber = Annotated[int, Field(ge=0, le=INT64_MAX), INTEGRAL]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX), INTEGRAL]
Seed = Annotated[int, Field(ge=0, le=INT64_MAX), INTEGRAL]


class Body(BaseModel):
    """A request body: strict, closed (unknown fields are 422 ``unknown_field``), immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Empty(Body):
    """Body of close, heartbeat, finish and cancel: ``{}`` (an empty body is read as ``{}``)."""


class CreateSession(Body):
    ttl_seconds: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    metadata: dict[str, str] | None = None


class LoraConfig(Body):
    rank: Annotated[int, Field(ge=1), INTEGRAL]
    alpha: Annotated[float, Field(gt=0)]
    seed: Seed | None = None


class CreateRun(Body):
    base_model: str
    lora: LoraConfig
    optimizer: Literal["adamw"]


class ModelInput(Body):
    token_ids: Annotated[list[TokenId], Field(min_length=1)]


class Datum(Body):
    model_input: ModelInput
    loss_inputs: dict[str, list[float]]


class Forward(Body):
    """Body of ``forward`` and ``forward_backward``."""

    seq: Seq
    loss_function: str
    loss_config: dict[str, float]
    data: Annotated[list[Datum], Field(min_length=1)]
    # (token_ids, loss_inputs) per datum as numpy arrays, when decode() has built them.
    _arrays: Any = PrivateAttr(default=None)


class AdamW(Body):
    """OPT-1: all six hyper-parameters are required; the server has no defaults."""

    learning_rate: Annotated[float, Field(ge=0)]
    beta1: Annotated[float, Field(ge=0, lt=1)]
    beta2: Annotated[float, Field(ge=0, lt=1)]
    eps: Annotated[float, Field(gt=0)]
    weight_decay: Annotated[float, Field(ge=0)]
    grad_clip_norm: Annotated[float, Field(ge=0)]


class OptimStep(Body):
    seq: Seq
    adamw: AdamW


class SaveWeightsForSampler(Body):
    seq: Seq
    version: VersionNumber


class Prompt(Body):
    token_ids: Annotated[list[TokenId], Field(min_length=1)]


class Sampling(Body):
    max_tokens: Annotated[int, Field(ge=1), INTEGRAL]
    temperature: Annotated[float, Field(gt=0, le=100)]
    top_k: Annotated[int, Field(ge=0), INTEGRAL]
    top_p: Annotated[float, Field(gt=0, le=1)]
    seed: Seed | None = None
    stop_token_ids: list[TokenId] | None = None


class Sample(Body):
    seq: Seq
    version: VersionNumber
    prompt: Prompt
    num_samples: Annotated[int, Field(ge=1), INTEGRAL]
    sampling: Sampling


class Logprobs(Body):
    seq: Seq
    version: VersionNumber
    token_ids: Annotated[list[TokenId], Field(min_length=1)]


class SaveState(Body):
    seq: Seq
    name: Annotated[str, Field(min_length=1, max_length=256)]


class LoadState(Body):
    seq: Seq
    checkpoint_id: str
    with_optimizer: bool


class ExportLora(Body):
    seq: Seq


# -- the exact path -------------------------------------------------------------------------
class _Constant(ValueError):
    """A NaN / Infinity literal met by the standard library's parser."""


def _refuse_constant(name: str) -> float:
    raise _Constant(name)


def parse_json(raw: bytes) -> Any:
    """Parse a strict RFC 8259 document (ERR-2).

    NaN/Infinity literals (named in the message) and invalid UTF-8 are 400 ``malformed_json``.
    A valid document whose numbers overflow a double (``1e999``) parses to ``inf`` and then
    fails validation with 422.
    """
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        error = exc
    try:  # the standard library reads what orjson refuses only for its size (1e999)
        value = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except _Constant as constant:
        raise MalformedJSON(
            f"request body is not valid JSON: {constant} is not a JSON number (JSON has no "
            f"NaN or Infinity; send a finite number) at line {error.lineno} column "
            f"{error.colno}", details={"line": error.lineno, "column": error.colno}) from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        value = error
    if value is error or "number" not in str(error):  # e.g. a lone surrogate: not RFC 8259
        raise MalformedJSON(f"request body is not valid JSON: {error}",
                            details={"line": error.lineno, "column": error.colno})
    return value


def field_path(loc: Any) -> str:
    """The one field-path style of messages and ``details.fields``: ``data[0].loss_inputs.mask``
    (``body`` for the body itself)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


#: pydantic's messages in JSON's words, without Python class names ("instance of Prompt").
_MESSAGES = {
    "model_type": "Input should be an object", "model_attributes_type": "Input should be an object",
    "dict_type": "Input should be an object", "list_type": "Input should be an array",
    "int_type": "Input should be an integer", "int_from_float": "Input should be an integer",
    "int_parsing": "Input should be an integer", "float_type": "Input should be a number",
    "float_parsing": "Input should be a number", "string_type": "Input should be a string",
    "bool_type": "Input should be a boolean (true or false)", "missing": "Field required",
    "finite_number": "Input should be a finite number",
}


def _message(error: Any) -> str:
    kind = error["type"]
    if kind in ("less_than_equal", "greater_than_equal", "less_than", "greater_than") \
            and isinstance(error.get("ctx"), dict):
        bound = error["ctx"].get({"less_than_equal": "le", "greater_than_equal": "ge",
                                  "less_than": "lt", "greater_than": "gt"}[kind])
        if bound == INT64_MAX:
            return f"{error['msg']} (2**63 - 1: integers are at most 64-bit)"
    if kind == "int_from_float":
        return "Input should be an integer (a number with an integral value)"
    return str(_MESSAGES.get(kind, error["msg"]))


def validate(model: type[Body], payload: Any) -> Any:
    """Validate a parsed body; unknown fields give 422 ``unknown_field`` (ERR-4)."""
    if not isinstance(payload, dict):
        raise ValidationFailed("request body must be a JSON object",
                               details={"errors": [{"loc": [], "msg": "expected an object"}]})
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        unknown = [field_path(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            raise ValidationFailed(f"unknown field(s): {', '.join(unknown)}", type="unknown_field",
                                   details={"fields": unknown}) from None
        listed = [{"loc": list(e["loc"]), "msg": _message(e)} for e in errors[:20]]
        first = listed[0]
        raise ValidationFailed(f"{field_path(first['loc'])}: {first['msg']}",
                               details={"errors": listed}) from None


# -- ORD-3: the digest of a JSON value (contract 1.1) ---------------------------------------
# Two bodies are JSON-equal when their values are: object keys in any order, numbers by value
# (1 == 1.0 == 1e0; -0 == 0), null distinct from an absent key. The digest hashes a canonical
# stream: objects with sorted keys, integral numbers as exact integers, other numbers as IEEE
# doubles, and an array of numbers as one typed block (int64 when every value is an integer
# within 64 bits, else float64 when every value is exactly a double), so that the large arrays
# of a forward body hash as memory, whichever path produced them.
_LEN = struct.Struct("<Q")


def _str_part(parts: list[Any], text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    parts += (b"s", _LEN.pack(len(data)), data)


def _number_part(value: int | float) -> bytes:
    if type(value) is int:
        return b"I%d;" % value
    if float(value).is_integer():
        return b"I%d;" % int(value)
    return b"F" + struct.pack("<d", value)


def _block(parts: list[Any], tag: bytes, array: np.ndarray) -> None:
    parts += (tag, _LEN.pack(len(array)), np.ascontiguousarray(array))


def _float_block(parts: list[Any], values: np.ndarray) -> None:
    """A float64 array (every value a double the JSON text meant exactly) as its block."""
    values = values + 0.0  # -0.0 is 0
    integral = np.trunc(values) == values
    if integral.all() and (len(values) == 0 or np.abs(values).max() < 2.0**63):
        _block(parts, b"A", values.astype(np.int64))
    else:
        _block(parts, b"D", values)


_NUMBER_TYPES = frozenset((int, float))


def _numbers_block(parts: list[Any], values: list[Any]) -> bool:
    """An array of JSON numbers (exact Python values) as its block; False if not all numbers.
    ``struct`` writes the same little-endian int64 / float64 bytes numpy does."""
    kinds = set(map(type, values))
    if not kinds <= _NUMBER_TYPES:
        return False
    count = len(values)
    if float in kinds:
        if all(type(v) is int or v.is_integer() for v in values):
            values = [v if type(v) is int else int(v) for v in values]
        else:
            try:
                if int in kinds and any(float(v) != v for v in values if type(v) is int):
                    return False  # an integer no double holds exactly
                parts += (b"D", _LEN.pack(count), struct.pack(f"<{count}d",
                                                               *[v + 0.0 for v in values]))
                return True
            except OverflowError:
                return False
    try:
        parts += (b"A", _LEN.pack(count), struct.pack(f"<{count}q", *values))
        return True
    except struct.error:  # beyond 64 bits
        pass
    try:
        if all(float(v) == v for v in values):
            parts += (b"D", _LEN.pack(count), struct.pack(f"<{count}d", *map(float, values)))
            return True
    except OverflowError:
        pass
    return False


def _value_parts(parts: list[Any], value: Any) -> None:
    """The canonical stream of a parsed JSON value (the exact path)."""
    kind = type(value)
    if kind is dict:
        parts.append(b"{")
        for key in sorted(value):
            parts.append(_key_bytes(key))
            _value_parts(parts, value[key])
        parts.append(b"}")
    elif kind is int:
        parts.append(b"I%d;" % value)
    elif kind is list:
        if not value:
            parts += (b"A", _LEN.pack(0))
        elif not _numbers_block(parts, value):
            parts.append(b"[")
            for item in value:
                _value_parts(parts, item)
            parts.append(b"]")
    elif kind is str:
        _str_part(parts, value)
    elif value is None:
        parts.append(b"n")
    elif kind is bool:
        parts.append(b"t" if value else b"f")
    elif kind is float:
        parts.append(_number_part(value))
    else:
        raise TypeError(f"not a JSON value: {kind.__name__}")


def _digest(parts: list[Any]) -> bytes:
    """SHA-256 of the stream; runs of small parts are joined first (fewer update calls)."""
    if all(type(part) is bytes for part in parts):
        return hashlib.sha256(b"".join(parts)).digest()
    h = hashlib.sha256()
    small: list[bytes] = []
    for part in parts:
        if type(part) is bytes:
            small.append(part)
        else:
            if small:
                h.update(b"".join(small))
                small.clear()
            h.update(part)
    if small:
        h.update(b"".join(small))
    return h.digest()


def canonical_digest(payload: Any) -> bytes:
    """Digest of a parsed body for ORD-3 (contract 1.1): JSON values compared as values."""
    parts: list[Any] = []
    _value_parts(parts, payload)
    return _digest(parts)


# -- the one-pass path for forward bodies -----------------------------------------------------
class _Fallback(Exception):
    """The fast path leaves this body to the exact path."""


_ARRAY: Any = simdjson.Array
_OBJECT: Any = simdjson.Object
_FORWARD_KEYS = frozenset(("seq", "loss_function", "loss_config", "data"))
_DATUM_KEYS = frozenset(("model_input", "loss_inputs"))
_BOM = b"\xef\xbb\xbf"


def _object(value: Any, keys: frozenset[str] | None = None) -> list[str]:
    """The keys of a parsed object: all distinct (a repeated key goes to the exact path, where
    the last one wins) and, with ``keys``, exactly those."""
    if type(value) is not _OBJECT:
        raise _Fallback
    names = list(value.keys())
    if len(set(names)) != len(names) or (keys is not None and set(names) != keys):
        raise _Fallback
    return names


_PARSERS = threading.local()


def _parse(raw: bytes) -> Any:
    """simdjson's document of ``raw``, by this thread's parser (a new parser per body costs
    its buffers anew: ~4 ms on 3 MB). A parser whose previous document is still referenced
    (a traceback holding a proxy) refuses to parse: it is then replaced."""
    parser = getattr(_PARSERS, "parser", None)
    if parser is not None:
        try:
            return parser.parse(raw)
        except RuntimeError:  # still in use: a fresh one below
            pass
    _PARSERS.parser = parser = simdjson.Parser()
    return parser.parse(raw)


def _forward_fast(raw: bytes) -> Decoded:
    """A ``forward`` body with simdjson: the document is parsed once, natively, and every
    array goes straight into numpy (``as_buffer``) without a Python object per number; the
    model's rules are checked on the arrays, the digest hashes them. Raises ``_Fallback`` for
    anything it does not accept whole."""
    if raw.startswith(_BOM):
        raise _Fallback  # simdjson skips a BOM, RFC 8259 parsers refuse it
    try:
        doc: Any = _parse(raw)
        _object(doc, _FORWARD_KEYS)
        seq, loss_function = doc["seq"], doc["loss_function"]
        if type(seq) is not int or not 1 <= seq <= INT64_MAX or type(loss_function) is not str:
            raise _Fallback
        config_doc = doc["loss_config"]
        loss_config = {name: config_doc[name] for name in _object(config_doc)}
        if not all(type(v) is int or type(v) is float for v in loss_config.values()):
            raise _Fallback
        data_doc = doc["data"]
        if type(data_doc) is not _ARRAY or len(data_doc) == 0:
            raise _Fallback
        token_arrays: list[np.ndarray] = []
        input_arrays: list[dict[str, np.ndarray]] = []
        arrays = 1
        for datum in data_doc:
            _object(datum, _DATUM_KEYS)
            model_input = datum["model_input"]
            _object(model_input, _TOKEN_KEYS)
            ids_doc = model_input["token_ids"]
            if type(ids_doc) is not _ARRAY:
                raise _Fallback
            ids = np.frombuffer(ids_doc.as_buffer(of_type="i"), dtype=np.int64)
            inputs_doc = datum["loss_inputs"]
            inputs = {}
            for name in _object(inputs_doc):  # the document's order, as the exact path
                values_doc = inputs_doc[name]
                if type(values_doc) is not _ARRAY:
                    raise _Fallback
                inputs[name] = np.frombuffer(values_doc.as_buffer(of_type="d"), dtype=np.float64)
            arrays += 1 + len(inputs)
            token_arrays.append(ids)
            input_arrays.append(inputs)
        del doc, config_doc, data_doc, datum, model_input, ids_doc, inputs_doc
    except (ValueError, TypeError, RuntimeError, KeyError):
        raise _Fallback from None
    # as_buffer flattens nested arrays: every "[" of the text must be one of the arrays read
    # (a bracket inside a string also sends the body to the exact path).
    if raw.count(b"[") != arrays:
        raise _Fallback
    lengths = [len(ids) for ids in token_arrays]
    if min(lengths) == 0:
        raise _Fallback
    ids_flat = np.concatenate(token_arrays)
    if ids_flat.min() < 0:
        raise _Fallback
    flat_inputs = [values for inputs in input_arrays for values in inputs.values()]
    blocks: list[Any] = []
    if flat_inputs:
        sizes = [len(values) for values in flat_inputs]
        if min(sizes) == 0:
            raise _Fallback
        flat = np.concatenate(flat_inputs)
        flat += 0.0  # -0.0 is 0 (a copy: the body keeps what was sent)
        if np.abs(flat).max() >= _EXACT:  # may stand for an integer literal it rounded
            raise _Fallback
        # Each array's block at once: int64 where every value is integral, else float64.
        starts = np.cumsum([0, *sizes[:-1]]).tolist()
        whole = np.logical_and.reduceat(np.trunc(flat) == flat, starts).tolist()
        as_ints = flat.astype(np.int64) if any(whole) else flat
        blocks = [(b"A", as_ints[a:a + n]) if w else (b"D", flat[a:a + n])
                  for a, n, w in zip(starts, sizes, whole, strict=False)]
    parts: list[Any] = [_FORWARD_HEAD]
    at = 0
    for ids, inputs in zip(token_arrays, input_arrays, strict=False):
        parts.append(_DATUM_HEAD)
        mine = dict(zip(inputs, blocks[at:at + len(inputs)], strict=False))
        at += len(inputs)
        for name in sorted(mine):
            tag, values = mine[name]
            parts += (_key_bytes(name), tag + _LEN.pack(len(values)), values)
        parts += (_DATUM_MIDDLE, b"A" + _LEN.pack(len(ids)), ids, b"}}")
    parts.append(b"]")
    _str_part(parts, "loss_config")
    _value_parts(parts, loss_config)
    _str_part(parts, "loss_function")
    _str_part(parts, loss_function)
    _str_part(parts, "seq")
    parts += (_number_part(seq), b"}")
    data = [_construct(Datum, model_input=_construct(ModelInput, token_ids=ids),
                       loss_inputs=inputs)
            for ids, inputs in zip(token_arrays, input_arrays, strict=False)]
    body = _construct(Forward, seq=seq, loss_function=loss_function, loss_config=loss_config,
                      data=data)
    body._arrays = (token_arrays, input_arrays)
    return Decoded(body, _digest(parts))


_TOKEN_KEYS = frozenset(("token_ids",))


def _stream(*pieces: str | bytes) -> bytes:
    """Constant pieces of the canonical stream: strings as :func:`_str_part` writes them."""
    parts: list[Any] = []
    for piece in pieces:
        if isinstance(piece, str):
            _str_part(parts, piece)
        else:
            parts.append(piece)
    return b"".join(parts)


_FORWARD_HEAD = _stream(b"{", "data", b"[")
_DATUM_HEAD = _stream(b"{", "loss_inputs", b"{")
_DATUM_MIDDLE = _stream(b"}", "model_input", b"{", "token_ids")
_KEYS: dict[str, bytes] = {}


def _key_bytes(name: str) -> bytes:
    """A loss input's name as the stream writes it (the few names there are, kept)."""
    found = _KEYS.get(name)
    if found is None:
        found = _stream(name)
        if len(_KEYS) < 64:
            _KEYS[name] = found
    return found


def _construct(model: type[Body], **values: Any) -> Any:
    """``model.model_construct`` of values already validated, without its per-call work: the
    fields given are all the model has (every field of the forward models is required)."""
    body = model.__new__(model)
    object.__setattr__(body, "__dict__", values)
    object.__setattr__(body, "__pydantic_fields_set__", set(values))
    object.__setattr__(body, "__pydantic_extra__", None)
    object.__setattr__(body, "__pydantic_private__",
                       {"_arrays": None} if model.__private_attributes__ else None)
    return body


class Decoded(typing.NamedTuple):
    """A request body read once: the validated model and its ORD-3 digest."""

    body: Any
    digest: bytes


def decode(raw: bytes, model: type[Body]) -> Decoded:
    """Read a request body: the model (ERR-2 / ERR-4 exactly as :func:`parse_json` and
    :func:`validate` give them) and its ORD-3 digest (:func:`canonical_digest`).

    A ``forward`` body goes through :func:`_forward_fast` first: one native parse, arrays
    without Python numbers. Its ``token_ids`` and loss inputs are then read-only numpy arrays
    (int64, float64) holding the values the model describes; :func:`forward_arrays` hands them
    to the primitive. Any body it does not accept whole is read by the exact path, which
    decides every error and its message.
    """
    if model is Forward:
        try:
            return _forward_fast(raw)
        except _Fallback:
            pass
    payload = parse_json(raw)
    return Decoded(validate(model, payload), canonical_digest(payload))


def forward_arrays(body: Forward) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]]]:
    """Per datum: ``token_ids`` as int64 and every loss input as float64 arrays, from the
    decoding pass when there was one."""
    arrays: Any = body._arrays
    if arrays is not None:
        return arrays  # type: ignore[no-any-return,unused-ignore]
    token_ids = [np.array(d.model_input.token_ids, dtype=np.int64) for d in body.data]
    inputs = [{name: np.array(values, dtype=np.float64) for name, values in d.loss_inputs.items()}
              for d in body.data]
    return token_ids, inputs

