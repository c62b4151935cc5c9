"""DISC: the capabilities document (DISC-1) and the server side of DISC-2."""

from __future__ import annotations

from typing import Any, TypeGuard

from ..context import Ctx, expect_status
from ..payloads import ce_datum
from ..reference import DEFAULT_CONFIG
from ..registry import CheckFailed, check
from ..wire import NO_AUTH

CONTRACT_PRIMITIVES = ("forward", "forward_backward", "optim_step", "save_weights_for_sampler",
                       "sample", "logprobs", "save_state", "load_state", "export_lora")
# The seed's prerequisite list: "confirm forward_backward, optim_step, save_weights_for_sampler,
# sample, and optionally logprobs". forward is what every loss check scores with.
REQUIRED_PRIMITIVES = ("forward", "forward_backward", "optim_step", "save_weights_for_sampler",
                       "sample")
CONTRACT_INPUTS = {
    "cross_entropy": (["target_tokens"], ["weights"]),
    "importance_sampling": (["target_tokens", "logprobs", "advantages"], ["mask"]),
    "ppo": (["target_tokens", "logprobs", "advantages"], ["mask"]),
    "cispo": (["target_tokens", "logprobs", "advantages"], ["mask"]),
    "dro": (["target_tokens", "logprobs", "advantages"], ["mask"]),
}
#: ``contract_version`` values a server may announce: a "1.0" server is held to 1.0's rules where
#: 1.1 changed them (numbers by value) and declares none of 1.1's optional features.
CONTRACT_VERSIONS = ("1.0", "1.1")
#: Contract 1.1's optional features (booleans; absent means false).
OPTIONAL_FEATURES = ("idempotent_create", "session_listing", "seq_error_details",
                     "exports_after_close")
LIMIT_KEYS = ("max_body_bytes", "max_datums_per_request", "max_tokens_per_request",
              "max_num_samples", "max_sample_tokens", "order_wait_ms", "max_sessions",
              "max_runs_per_session", "max_versions_per_run", "min_ttl_seconds",
              "max_ttl_seconds")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def capabilities_problem(caps: Any) -> str | None:
    """Why ``caps`` cannot drive the suite at all (the preflight), or None. Only what every
    check builds on: the first base model's id and sizes, and the maps the checks read; the
    rest of DISC-1 is the ``DISC-1`` check's job."""
    if not isinstance(caps, dict):
        return "the body is not a JSON object"
    models = caps.get("base_models")
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        return "no base_models[]"
    model = models[0]
    if not isinstance(model.get("id"), str):
        return "base_models[0].id is not a string"
    for key in ("vocab_size", "max_context", "eos_token_id", "max_lora_rank"):
        if not _is_int(model.get(key)):
            return f"base_models[0].{key} is {model.get(key)!r}, not an integer"
    for key, kind in (("limits", dict), ("loss_functions", dict), ("features", dict),
                      ("primitives", list)):
        if not isinstance(caps.get(key), kind):
            return f"{key} is missing or not a JSON {'object' if kind is dict else 'array'}"
    return None


def validate_capabilities(caps: Any) -> list[str]:
    """Every DISC-1 problem of a capabilities document."""
    if not isinstance(caps, dict):
        return ["capabilities body is not a JSON object"]
    problems: list[str] = []
    if caps.get("contract_version") not in CONTRACT_VERSIONS:
        problems.append(f"contract_version is {caps.get('contract_version')!r}, expected one of "
                        f"{', '.join(repr(v) for v in CONTRACT_VERSIONS)}")
    primitives = caps.get("primitives")
    if not isinstance(primitives, list):
        problems.append("primitives is not a list")
        primitives = []
    for name in REQUIRED_PRIMITIVES:
        if name not in primitives:
            problems.append(f"primitives lacks {name!r}")
    for name in primitives:
        if name not in CONTRACT_PRIMITIVES:
            problems.append(f"primitives lists {name!r}, not a contract primitive")
    if caps.get("optimizers") != ["adamw"]:
        problems.append(f"optimizers is {caps.get('optimizers')!r}, expected ['adamw']")
    losses = caps.get("loss_functions")
    if not isinstance(losses, dict) or not losses:
        problems.append("loss_functions is not a non-empty object")
        losses = {}
    for name, spec in losses.items():
        problems += _loss_problems(name, spec)
    models = caps.get("base_models")
    if not isinstance(models, list) or not models:
        problems.append("base_models is not a non-empty list")
        models = []
    for model in models:
        if not isinstance(model, dict):
            problems.append(f"base_models entry {model!r} is not an object")
            continue
        if not isinstance(model.get("id"), str) or not model.get("id"):
            problems.append(f"base model without id: {model!r}")
        for key in ("vocab_size", "max_context", "max_lora_rank"):
            size = model.get(key)
            if not _is_int(size) or size < 1:
                problems.append(f"base model {model.get('id')}: {key} {model.get(key)!r}")
        eos, vocab = model.get("eos_token_id"), model.get("vocab_size")
        if not _is_int(eos) or not _is_int(vocab) or not 0 <= eos < vocab:
            problems.append(f"base model {model.get('id')}: eos_token_id {eos!r} not in "
                            f"[0, vocab_size)")
    limits = caps.get("limits")
    if not isinstance(limits, dict):
        problems.append("limits is not an object")
        limits = {}
    for key in LIMIT_KEYS:
        value = limits.get(key)
        low = 0 if key == "order_wait_ms" else 1
        if not _is_int(value) or value < low:
            problems.append(f"limits.{key} is {value!r}, expected an integer >= {low}")
    low_ttl, high_ttl = limits.get("min_ttl_seconds"), limits.get("max_ttl_seconds")
    if _is_int(low_ttl) and _is_int(high_ttl) and low_ttl > high_ttl:
        problems.append("limits.min_ttl_seconds > limits.max_ttl_seconds")
    features = caps.get("features")
    if not isinstance(features, dict):
        problems.append("features is not an object")
        features = {}
    for key in ("deterministic_sampling", "session_ttl"):
        if not isinstance(features.get(key), bool):
            problems.append(f"features.{key} is {features.get(key)!r}, expected a boolean")
    for key in OPTIONAL_FEATURES:  # contract 1.1: absent means false
        if key in features and not isinstance(features[key], bool):
            problems.append(f"features.{key} is {features[key]!r}, expected a boolean")
    if caps.get("contract_version") == "1.0" and any(features.get(k) for k in OPTIONAL_FEATURES):
        problems.append("contract_version '1.0' with a feature of contract 1.1 declared")
    tol = features.get("logprob_tolerance")
    if not _is_number(tol) or not tol >= 0:
        problems.append(f"features.logprob_tolerance is {tol!r}, expected a number >= 0")
    return problems


def _loss_problems(name: str, spec: Any) -> list[str]:
    problems: list[str] = []
    if not isinstance(spec, dict):
        return [f"loss_functions.{name} is not an object"]
    inputs = spec.get("inputs")
    if (not isinstance(inputs, dict) or not isinstance(inputs.get("required"), list)
            or not isinstance(inputs.get("optional"), list)):
        problems.append(f"loss_functions.{name}.inputs lacks required/optional lists")
        inputs = {"required": [], "optional": []}
    config = spec.get("config")
    if not isinstance(config, dict):
        problems.append(f"loss_functions.{name}.config is not an object")
        config = {}
    for key, bounds in config.items():
        if not isinstance(bounds, dict) or not all(_is_number(bounds.get(b))
                                                   for b in ("default", "min", "max")):
            problems.append(f"loss_functions.{name}.config.{key} lacks numeric default/min/max")
        elif not bounds["min"] <= bounds["default"] <= bounds["max"]:
            problems.append(f"loss_functions.{name}.config.{key}: default outside [min, max]")
    if name in CONTRACT_INPUTS:
        required, optional = CONTRACT_INPUTS[name]
        if sorted(inputs["required"]) != sorted(required):
            problems.append(f"loss_functions.{name}.inputs.required is {inputs['required']}, "
                            f"the contract says {required}")
        if sorted(inputs["optional"]) != sorted(optional):
            problems.append(f"loss_functions.{name}.inputs.optional is {inputs['optional']}, "
                            f"the contract says {optional}")
        expected_config = DEFAULT_CONFIG[name]
        if sorted(config) != sorted(expected_config):
            problems.append(f"loss_functions.{name}.config keys {sorted(config)}, the contract "
                            f"says {sorted(expected_config)}")
        for key, default in expected_config.items():
            bounds = config.get(key)
            if isinstance(bounds, dict) and bounds.get("default") != default:
                problems.append(f"loss_functions.{name}.config.{key}.default is "
                                f"{bounds.get('default')!r}, the contract says {default}")
    return problems


@check("DISC-1", "capabilities", title="GET /capabilities needs auth and returns every "
       "field the contract lists, with contract defaults for the contract's losses")
def disc1_capabilities(ctx: Ctx) -> None:
    expect_status(ctx.wire.call("GET", "/capabilities", auth=NO_AUTH), 401,
                  what="GET /capabilities without a key")
    reply = expect_status(ctx.wire.call("GET", "/capabilities"), 200, what="GET /capabilities")
    problems = validate_capabilities(reply.body)
    if problems:
        raise CheckFailed("; ".join(problems[:8]))


@check("DISC-2", "no-substitution", title="every declared loss is accepted; a loss that is not "
       "declared (the contract's or generic 'grpo') is refused, never substituted")
def disc2_no_substitution(ctx: Ctx) -> None:
    run = ctx.run()
    datum_ce = ce_datum(ctx.tokens("Hi there"))
    p = run.forward([datum_ce])["outputs"][0]["logprobs"]
    rl_inputs = {"target_tokens": datum_ce["loss_inputs"]["target_tokens"], "logprobs": p,
                 "advantages": [1.0] * len(p)}
    for name in [*DEFAULT_CONFIG, "grpo"]:
        datum = datum_ce if name == "cross_entropy" else {
            "model_input": datum_ce["model_input"], "loss_inputs": rl_inputs}
        expected = (200, None) if ctx.has_loss(name) else (422, "unsupported_loss_function")
        reply = run.prim("forward", {"loss_function": name, "loss_config": {}, "data": [datum]},
                         expect=None)
        expect_status(reply, expected[0], expected[1],
                      what=f"forward with {'declared' if ctx.has_loss(name) else 'undeclared'} "
                           f"loss {name!r}")
