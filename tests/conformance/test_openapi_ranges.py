"""The request and response schemas of ``openapi.yaml`` behave as the contract says: the
section 4 / 4a ranges (OPT-1, OPT-3, ERR-4) edge by edge, closed empty bodies, ORD-5's
operation record, ERR-1's error details by type, logprobs and the LIFE-1 session view.

The references are the contract's ranges typed out below and JSON Schema 2020-12 semantics
(``jsonschema``) applied to hand-built bodies; no server is involved. The shared fixtures are in
``openapi_support.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_support import (  # noqa: F401
    pointer,
    registry,
    spec,
    spec_text,
    strict_registry,
    strict_spec,
    validator_at,
)
from referencing import Registry


# ------------------------------------------------------------ schemas behave as the contract says
def body_validator(registry: Registry, path: str) -> Draft202012Validator:
    return validator_at(registry, pointer("paths", path, "post", "requestBody", "content",
                                          "application/json", "schema"))


def example_body(spec: dict[str, Any], path: str) -> dict[str, Any]:
    media = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return copy.deepcopy(next(iter(media["examples"].values()))["value"])


def with_value(body: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    *parents, leaf = dotted.split(".")
    node = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return body


DELETE = object()
R = "/v1/training/runs/{run_id}/"
# (path, dotted field, value, accepted?) from section 4 / 4a of the contract.
RANGE_CASES = [
    (R + "sample", "sampling.top_p", 0, False), (R + "sample", "sampling.top_p", 1.0, True),
    (R + "sample", "sampling.top_p", 1.001, False),
    (R + "sample", "sampling.temperature", 0, False),
    (R + "sample", "sampling.temperature", 100, True),
    (R + "sample", "sampling.temperature", 100.01, False),
    (R + "sample", "sampling.top_k", -1, False), (R + "sample", "sampling.top_k", 0, True),
    (R + "sample", "sampling.max_tokens", 0, False),
    (R + "sample", "sampling.max_tokens", 1, True),
    (R + "sample", "sampling.stop_token_ids", [], True),
    (R + "sample", "sampling.seed", DELETE, True),
    (R + "sample", "sampling.top_k", DELETE, False),
    (R + "sample", "num_samples", 0, False), (R + "sample", "num_samples", 1, True),
    (R + "sample", "version", -1, False), (R + "sample", "version", 0, True),
    (R + "sample", "prompt.token_ids", [-1], False),
    (R + "optim_step", "adamw.beta1", 1, False), (R + "optim_step", "adamw.beta1", 0, True),
    (R + "optim_step", "adamw.beta2", 1.0, False),
    (R + "optim_step", "adamw.beta2", 0.9999, True),
    (R + "optim_step", "adamw.eps", 0, False), (R + "optim_step", "adamw.eps", 1e-12, True),
    (R + "optim_step", "adamw.learning_rate", -0.001, False),
    (R + "optim_step", "adamw.learning_rate", 0, True),
    (R + "optim_step", "adamw.weight_decay", -1, False),
    (R + "optim_step", "adamw.grad_clip_norm", 0, True),  # OPT-3: 0 means off
    (R + "optim_step", "adamw.grad_clip_norm", -1, False),
    (R + "optim_step", "adamw.grad_clip", 1.0, False),  # ERR-4
    (R + "optim_step", "seq", 0, False), (R + "optim_step", "seq", 1, True),
    (R + "optim_step", "seq", 1.5, False), (R + "optim_step", "seq", "1", False),
    (R + "optim_step", "seq", True, False),
    (R + "save_weights_for_sampler", "version", -1, False),
    (R + "forward_backward", "loss_config", {}, True),
    (R + "forward_backward", "loss_config", DELETE, False),
    (R + "forward_backward", "loss_config", {"beta": "0.1"}, False),
    (R + "forward_backward", "data", [], False),
    (R + "forward_backward", "data.0.loss_inputs.mask", ["1"], False),
    (R + "forward_backward", "data.0.model_input.token_ids", [256, 1.5], False),
    (R + "forward_backward", "data.0.extra", {}, False),
    (R + "load_state", "with_optimizer", DELETE, False),
    (R + "load_state", "with_optimizer", 1, False),
    ("/v1/training/sessions/{session_id}/runs", "lora.rank", 0, False),
    ("/v1/training/sessions/{session_id}/runs", "lora.alpha", 0, False),
    ("/v1/training/sessions/{session_id}/runs", "lora.seed", DELETE, True),
    ("/v1/training/sessions/{session_id}/runs", "optimizer", "sgd", False),
    ("/v1/training/sessions/{session_id}/runs", "optimizer", DELETE, False),
    ("/v1/training/sessions", "ttl_seconds", 1.5, False),
    ("/v1/training/sessions", "ttl_seconds", 1, True),
    ("/v1/training/sessions", "metadata", {"k": 1}, False),
]


@pytest.mark.parametrize("field", ["learning_rate", "beta1", "beta2", "eps", "weight_decay",
                                   "grad_clip_norm"])
def test_opt_1_every_adamw_field_is_required(spec: dict[str, Any], registry: Registry,
                                             field: str) -> None:
    path = R + "optim_step"
    validator = body_validator(registry, path)
    body = example_body(spec, path)
    assert validator.is_valid(body)
    assert not validator.is_valid(with_value(body, f"adamw.{field}", DELETE))


def test_request_ranges_follow_section_4a(spec: dict[str, Any], registry: Registry) -> None:
    wrong = []
    for path, field, value, accepted in RANGE_CASES:
        validator = body_validator(registry, path)
        body = example_body(spec, path)
        assert validator.is_valid(body), path
        if validator.is_valid(with_value(body, field, value)) != accepted:
            wrong.append((path.rsplit("/", 1)[-1], field, value, accepted))
    assert wrong == []


def test_empty_bodies_accept_only_the_empty_object(registry: Registry) -> None:
    validator = body_validator(registry, "/v1/training/runs/{run_id}/cancel")
    assert validator.is_valid({})
    assert not validator.is_valid({"force": True})  # ERR-4
    assert not validator.is_valid([])


def test_operation_record_pairs_result_with_its_primitive(spec: dict[str, Any],
                                                          registry: Registry) -> None:
    """ORD-5: completed -> the primitive's own result; failed -> the inner error object."""
    validator = validator_at(registry, "/components/schemas/OperationRecord")
    step = {"step": 1, "grad_norm": 0.5, "update_norm": 0.01}
    error = {"type": "no_gradients", "message": "m", "details": {}}
    assert validator.is_valid({"seq": 4, "primitive": "optim_step", "status": "completed",
                               "result": step})
    assert validator.is_valid({"seq": 4, "primitive": "optim_step", "status": "failed",
                               "error": error})
    assert not validator.is_valid({"seq": 4, "primitive": "sample", "status": "completed",
                                   "result": step})
    assert not validator.is_valid({"seq": 4, "primitive": "optim_step", "status": "completed",
                                   "result": step, "error": error})
    assert not validator.is_valid({"seq": 4, "primitive": "optim_step", "status": "failed",
                                   "result": step})
    # save_state and load_state results share a shape; the primitive disambiguates
    ckpt = {"checkpoint_id": "c", "step": 0}
    assert validator.is_valid({"seq": 1, "primitive": "load_state", "status": "completed",
                               "result": ckpt})


def env(type_: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"type": type_, "message": "m", "details": details}}


def test_error_envelope_details_by_type(registry: Registry, strict_registry: Registry) -> None:
    """ERR-1 shape. Contract (EXT-1): ``details`` holds the keys a rule names (``expected_seq``
    of ``seq_gap``, ORD-2) and may hold more. Strict: the mock's conventions for
    ``validation_error``, ``unknown_field``, ``limit_exceeded`` and ``quota_exceeded`` too."""
    for validator in (validator_at(registry, "/components/schemas/Error"),
                      validator_at(strict_registry, "/components/schemas/Error")):
        assert validator.is_valid(env("run_not_active", {}))
        assert validator.is_valid(env("seq_gap", {"expected_seq": 3, "held_ms": 1000}))
        assert not validator.is_valid(env("seq_gap", {}))
        assert validator.is_valid(env("validation_error",
                                      {"errors": [{"loc": ["adamw", "eps"], "msg": "> 0"}]}))
        assert validator.is_valid(env("unknown_field", {"fields": ["adamw.grad_clip"]}))
        assert not validator.is_valid({"error": {"type": "x", "message": "m"}})
        assert not validator.is_valid({"error": {"type": 3, "message": "m", "details": {}}})
        # ORD-6 (contract 1.1): typed when present
        assert validator.is_valid(env("validation_error", {"errors": [{"loc": [], "msg": "x"}],
                                                           "next_seq": 4, "seq_consumed": False}))
        assert validator.is_valid(env("no_gradients", {"next_seq": 5, "seq_consumed": True}))
        for bad in ({"next_seq": 0}, {"next_seq": "4"}, {"next_seq": 4.5},
                    {"seq_consumed": "false"}, {"seq_consumed": 0}):
            assert not validator.is_valid(env("no_gradients", bad)), bad
    contract = validator_at(registry, "/components/schemas/Error")
    strict = validator_at(strict_registry, "/components/schemas/Error")
    for legal in (env("validation_error", {"loc": "adamw.eps"}), env("limit_exceeded", {}),
                  env("unknown_field", {"field": "ttl"}), env("Run-Not-Found", {}),
                  {"error": {"type": "x", "message": "m", "details": {}, "code": 17}},
                  {"error": {"type": "x", "message": "m", "details": {}}, "status": 409}):
        assert contract.is_valid(legal) and not strict.is_valid(legal), legal


def test_logprobs_result_only_the_first_entry_is_null(registry: Registry) -> None:
    validator = validator_at(registry, "/components/schemas/LogprobsResult")
    assert validator.is_valid({"version": 0, "step": 0, "logprobs": [None, -1.5, -0.2]})
    assert validator.is_valid({"version": 0, "step": 0, "logprobs": [None]})
    assert not validator.is_valid({"version": 0, "step": 0, "logprobs": [None, None]})
    assert not validator.is_valid({"version": 0, "step": 0, "logprobs": [-1.0, -2.0]})


def test_session_view_expires_at_is_nullable(registry: Registry,
                                             strict_registry: Registry) -> None:
    """LIFE-1: ``expires_at`` is null without TTL. The view has the contract's fields; a server
    may add more (EXT-1), the mock does not (strict)."""
    validator = validator_at(registry, "/components/schemas/Session")
    strict = validator_at(strict_registry, "/components/schemas/Session")
    view = {"session_id": "s", "state": "open", "created_at": "2025-06-01T12:00:00Z",
            "expires_at": None, "metadata": {}}
    assert validator.is_valid(view) and strict.is_valid(view)
    assert not validator.is_valid({**view, "expires_at": "soon"})
    assert not validator.is_valid({**view, "state": "active"})
    assert validator.is_valid({**view, "ttl_seconds": 60})
    assert not strict.is_valid({**view, "ttl_seconds": 60})
