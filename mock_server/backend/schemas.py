"""Request bodies of the contract as strict pydantic v2 models, and JSON parsing.

Every model forbids unknown fields (ERR-4) and is strict: ``seq`` must be a JSON integer, a
float field accepts integers, booleans are never numbers, and non-finite numbers are refused
(ERR-2). ``tests/test_schema_drift.py`` proves these models and ``openapi.yaml`` agree.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import MalformedJSON, ValidationFailed

INT64_MAX = 2**63 - 1

Seq = Annotated[int, Field(ge=1, le=INT64_MAX)]
VersionNumber = Annotated[int, Field(ge=0, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Body(BaseModel):
    """A request body: strict, closed (unknown fields are 422 ``unknown_field``), immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Empty(Body):
    """Body of close, heartbeat, finish and cancel: ``{}`` (an empty body is read as ``{}``)."""


class CreateSession(Body):
    ttl_seconds: Annotated[int, Field(ge=1)] | None = None
    metadata: dict[str, str] | None = None


class LoraConfig(Body):
    rank: Annotated[int, Field(ge=1)]
    alpha: Annotated[float, Field(gt=0)]
    seed: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None


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
    max_tokens: Annotated[int, Field(ge=1)]
    temperature: Annotated[float, Field(gt=0, le=100)]
    top_k: Annotated[int, Field(ge=0)]
    top_p: Annotated[float, Field(gt=0, le=1)]
    seed: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    stop_token_ids: list[TokenId] | None = None


class Sample(Body):
    seq: Seq
    version: VersionNumber
    prompt: Prompt
    num_samples: Annotated[int, Field(ge=1)]
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


def parse_json(raw: bytes) -> Any:
    """Parse a strict RFC 8259 document (ERR-2).

    NaN/Infinity literals and invalid UTF-8 are 400 ``malformed_json``. A valid document whose
    numbers overflow a double (``1e999``) parses to ``inf`` and then fails validation with 422.
    """
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        orjson_error = str(exc)
    if "number" not in orjson_error:  # only an overflowing number is valid JSON orjson refuses
        raise MalformedJSON(f"request body is not valid JSON: {orjson_error}")
    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedJSON(f"request body is not valid JSON: {orjson_error}") from None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def validate(model: type[Body], payload: Any) -> Any:
    """Validate a parsed body; unknown fields give 422 ``unknown_field`` (ERR-4)."""
    if not isinstance(payload, dict):
        raise ValidationFailed("request body must be a JSON object",
                               details={"errors": [{"loc": [], "msg": "expected an object"}]})
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        unknown = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            raise ValidationFailed(f"unknown field(s): {', '.join(unknown)}", type="unknown_field",
                                   details={"fields": unknown}) from None
        listed = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in errors[:20]]
        first = listed[0]
        where = ".".join(map(str, first["loc"])) or "body"
        raise ValidationFailed(f"{where}: {first['msg']}", details={"errors": listed}) from None


def canonical_digest(payload: Any) -> bytes:
    """Digest of a parsed body for ORD-3: key order and whitespace ignored, 1 and 1.0 differ."""
    try:
        canonical = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # integers beyond 64 bits: rare, and exact in the stdlib
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).digest()
