"""Contract violations the mock can be built with, to prove the conformance suite can fail.

``create_app(violations=frozenset({...}))`` switches them on; they are reachable only
in-process (no HTTP route, no environment variable, no control-plane field). Each one breaks
one rule the way a real server plausibly would. ``tests/test_conformance_violations.py``
holds, for each switch, the exact set of rule ids the conformance suite must then fail, and
proves it.

The hooks in ``state.py`` and ``responses.py`` are one-line calls guarded by
``if self.violations`` (or the switch name), so a faithful mock never enters this module.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, get_args

import numpy as np
from pydantic import BaseModel

from ..backend.errors import WhitneyError

if TYPE_CHECKING:
    from ..backend.records import Run
    from ..backend.state import Backend

VIOLATIONS: dict[str, str] = {
    "replay_reexecutes":
        "ORD-3: a replayed seq (same body) returns the recorded response but applies its "
        "effect again (a retried forward_backward doubles the gradient).",
    "no_ordering_holds":
        "ORD-2: a seq above next_seq executes at once instead of being held (requests run in "
        "arrival order).",
    "sample_wrong_version":
        "VER-2: sample answers with the newest saved version and its step, not the one asked.",
    "snapshot_aliases_training":
        "VER-2: a saved version aliases the live adapter, so optim_step changes what "
        "sample/logprobs see at old versions.",
    "sampler_logprobs_low_precision":
        "VER-3: sequences[].logprobs come from a float16 sampler and drift from scoring.",
    "unknown_fields_ignored":
        "ERR-4: unknown request fields are dropped silently instead of 422 unknown_field.",
    "adamw_defaults":
        "OPT-1: missing AdamW fields get torch defaults (lr 1e-3, wd 0.01 ...) instead of 422.",
    "cancel_immediately_terminal":
        "LIFE-7: cancel answers 202 with state cancelled at once (no cancelling phase).",
    "close_with_active_runs":
        "LIFE-3: close succeeds while a run is still active (no 409 runs_not_terminal).",
    "foreign_403":
        "SEC-2: another key's session or run answers 403 forbidden instead of 404.",
    "loss_mean":
        "LOSS-1..5: the reported loss (and loss:sum) is the mean over positions, not the sum.",
    "grads_not_accumulated":
        "GRAD-1: forward_backward replaces the gradient buffer instead of adding to it.",
    "grad_clip_ignored":
        "OPT-3: grad_clip_norm is accepted but ignored (never clips).",
    "beta1_ignored":
        "OPT-2: beta1 is accepted but the optimizer always uses 0.9.",
    "expiry_keeps_runs":
        "LIFE-4: an expired session's active runs stay active instead of cancelled.",
    "terminal_finish_mutates":
        "LIFE-8: finish on a cancelled run turns it finished.",
    "export_sha_mismatch":
        "EXPORT-1: the export lists a wrong sha256 for adapter_config.json.",
    "load_state_keeps_optimizer":
        "CKPT-1: load_state restores the AdamW moments even when with_optimizer is false.",
    "heartbeat_no_extend":
        "LIFE-2: heartbeat answers 200 but does not move expires_at.",
    "seed_ignored":
        "VER-4: sampling.seed is ignored (every sample draws a fresh seed).",
    "stop_token_dropped":
        "SAMPLE-1: a sequence that stops omits its stop token (and its logprob).",
    "unauthorized_not_enveloped":
        "ERR-1: 401 bodies are a framework default {\"detail\": ...}, not the error envelope.",
    "failed_op_clears_gradients":
        "ERR-3: a primitive that fails at its turn (409 version_conflict, 404 "
        "version_not_found ...) empties the gradient buffer.",
    "failed_ops_unlogged":
        "ORD-4/ORD-5: failed operations consume their seq but GET operations/{seq} says 404.",
    "ppo_default_advertised_wrong":
        "DISC-1: capabilities advertise ppo clip_high_threshold default 1.3 (contract: 1.2).",
    "substitutes_unknown_loss":
        "DISC-2: an unsupported loss_function is silently run as importance_sampling "
        "(the seed's 'never silently substitute generic GRPO').",
    "accepts_any_bearer":
        "SEC-1: any non-empty bearer token is accepted as the first key.",
    "session_metadata_dropped":
        "LIFE-1: the session view drops the metadata it was created with.",
    "rank_limit_unvalidated":
        "LIFE-5: lora.rank above max_lora_rank is not validated; building the adapter then "
        "fails with 500 instead of 422.",
    "nan_accepted":
        "ERR-2: the JSON parser accepts NaN/Infinity literals (then 422, not 400).",
}

TORCH_ADAMW_DEFAULTS = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                        "weight_decay": 1e-2, "grad_clip_norm": 0.0}


def check_names(names: frozenset[str]) -> frozenset[str]:
    """Refuse unknown switch names (a typo must not silently test the faithful mock)."""
    unknown = sorted(set(names) - set(VIOLATIONS))
    if unknown:
        raise ValueError(f"unknown violation(s) {unknown}; known: {sorted(VIOLATIONS)}")
    return frozenset(names)


# -- request bodies (hook in responses._body) ------------------------------------------------
def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _strip_unknown(model: type[BaseModel], payload: Any) -> Any:
    if not isinstance(payload, dict):
        return payload
    out = {}
    for key, value in payload.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        sub = _submodel(field.annotation)
        if sub is not None and isinstance(value, list):
            value = [_strip_unknown(sub, item) for item in value]
        elif sub is not None:
            value = _strip_unknown(sub, value)
        out[key] = value
    return out


def _number_in(value: Any, low: float, high: float | None) -> bool:
    """A JSON number in [low, high) (high None: unbounded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return low <= value and (high is None or value < high)


def rewrite_body(violations: frozenset[str], model: type[BaseModel], payload: Any) -> Any:
    """Body-level violations, applied after parsing and before validation."""
    if not isinstance(payload, dict):
        return payload
    name = model.__name__
    if "unknown_fields_ignored" in violations:
        payload = _strip_unknown(model, payload)
    adamw = payload.get("adamw") if name == "OptimStep" else None
    if isinstance(adamw, dict):
        adamw = dict(adamw)
        if "adamw_defaults" in violations:
            adamw = {**TORCH_ADAMW_DEFAULTS, **adamw}
        # "Ignored" means accepted and validated, then not used: only valid values change.
        if "grad_clip_ignored" in violations and _number_in(adamw.get("grad_clip_norm"), 0, None):
            adamw["grad_clip_norm"] = 0.0
        if "beta1_ignored" in violations and _number_in(adamw.get("beta1"), 0, 1):
            adamw["beta1"] = 0.9
        payload = {**payload, "adamw": adamw}
    if name == "Forward" and "substitutes_unknown_loss" in violations:
        from ..engine.model import LOSS_SPECS

        if payload.get("loss_function") not in LOSS_SPECS:
            payload = {**payload, "loss_function": "importance_sampling"}
    if name == "LoadState" and "load_state_keeps_optimizer" in violations:
        payload = {**payload, "with_optimizer": True}
    if name == "Sample" and "seed_ignored" in violations and isinstance(payload.get("sampling"),
                                                                      dict):
        payload = {**payload, "sampling": {**payload["sampling"], "seed": None}}
    return payload


# -- execution (hooks in state.Backend.submit / _execute) ------------------------------------
def reexecute(backend: "Backend", run: "Run", primitive: str, body: Any) -> None:
    """replay_reexecutes: apply a replayed request's effect a second time."""
    from ..backend.primitives import PREPARERS

    try:
        PREPARERS[primitive](backend, run, body)()
    except WhitneyError:
        pass


def before_execute(backend: "Backend", run: "Run", primitive: str) -> None:
    if primitive == "forward_backward" and "grads_not_accumulated" in backend.violations:
        run.grads = None


def tamper_result(backend: "Backend", run: "Run", primitive: str,
                  result: dict[str, Any]) -> dict[str, Any]:
    """Result-level violations, applied to a primitive's successful result."""
    v = backend.violations
    if primitive in ("forward", "forward_backward") and "loss_mean" in v:
        tokens = max(1, int(result["metrics"]["tokens"]))
        result["loss"] = result["loss"] / tokens
        result["metrics"]["loss:sum"] = result["loss"]
    if primitive == "optim_step" and "snapshot_aliases_training" in v:
        for version in run.versions.values():
            version.lora = run.lora
    if primitive == "sample":
        if "sample_wrong_version" in v and run.versions:
            newest = max(run.versions)
            result["version"], result["step"] = newest, run.versions[newest].step
        for seq in result["sequences"]:
            if "sampler_logprobs_low_precision" in v:
                seq["logprobs"] = [float(np.float16(x)) for x in seq["logprobs"]]
            if "stop_token_dropped" in v and seq["stop_reason"] == "stop" \
                    and len(seq["tokens"]) > 1:
                seq["tokens"], seq["logprobs"] = seq["tokens"][:-1], seq["logprobs"][:-1]
    if primitive == "export_lora" and "export_sha_mismatch" in v:
        for entry in result["files"]:
            if entry["name"] == "adapter_config.json":
                entry["sha256"] = hashlib.sha256(b"").hexdigest()
    return result


def lenient_json(raw: bytes) -> Any:
    """nan_accepted: Python's json module, which reads NaN and Infinity literals."""
    import json

    from ..backend import schemas

    try:
        return json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError):
        return schemas.parse_json(raw)  # truly malformed: the normal 400


def tamper_capabilities(violations: frozenset[str], caps: dict[str, Any]) -> dict[str, Any]:
    """Capability-level violations (hook in state.Backend.capabilities)."""
    if "ppo_default_advertised_wrong" in violations and "ppo" in caps["loss_functions"]:
        import copy

        caps["loss_functions"] = copy.deepcopy(caps["loss_functions"])
        caps["loss_functions"]["ppo"]["config"]["clip_high_threshold"]["default"] = 1.3
    return caps


# -- errors (hooks in state._session / owned_run and responses.whitney_error) ----------------
def forbidden(what: str) -> WhitneyError:
    """foreign_403: the classic leak, 'this exists but is not yours'."""
    return WhitneyError(f"{what} belongs to another key", type="forbidden", status=403)


def bare_401_body(message: str) -> dict[str, Any]:
    """unauthorized_not_enveloped: a web framework's default 401 body."""
    return {"detail": message}
