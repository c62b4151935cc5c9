"""Contract violations the mock can be built with, to prove the conformance suite can fail.

``create_app(violations={...})`` (or :func:`mock_server.testing.switches.create_app_with`)
switches them on; they are reachable only in-process (no HTTP route, no environment variable,
no control-plane field). Each one breaks one rule the way a real server plausibly would.
``tests/testing/test_conformance_violations.py`` holds, for each switch, the exact set of rule
ids the conformance suite must then fail, and proves it.

They are implemented here only, in three places a faithful mock has as trivial seams:

- :class:`ViolatingBackend` overrides the ``Backend`` seams (one rule each);
- :func:`violating_reader` wraps the app's request-body reader (parsing and body rewrites);
- :class:`BareUnauthorized` is ASGI middleware for the one response-level switch.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, get_args

import numpy as np
import orjson
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backend import schemas
from ..backend.errors import WhitneyError
from ..backend.records import Operation, Run, Session, Thunk
from ..backend.state import Backend
from ..engine.losses import LOSSES
from ..engine.peft import ADAPTER_CONFIG
from ..engine.specs import ModelSpec
from ..http.endpoints import BodyReader

__all__ = ["VIOLATIONS", "BareUnauthorized", "ViolatingBackend", "violating_middleware",
           "violating_reader"]

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
    # -- contract 1.1's optional features, each declared (capabilities) and then broken --------
    "idempotency_key_ignored":
        "LIFE-9: Idempotency-Key is accepted but ignored: a retried creation creates again "
        "(and another body under the same key is created too, never 409).",
    "idempotency_keys_global":
        "LIFE-9: Idempotency-Keys are not scoped to the API key: another key's identical key "
        "replays this key's creation (SEC-2 leak).",
    "listing_leaks_foreign":
        "LIFE-10: GET /sessions lists every tenant's sessions, not only the caller's.",
    "listing_pages_overlap":
        "LIFE-10: next_cursor points at the last session shown, so each page repeats the "
        "previous page's last session (an off-by-one).",
    "seq_details_missing":
        "ORD-6: primitive errors carry no details.next_seq / details.seq_consumed (only "
        "seq_gap's expected_seq), although seq_error_details is declared.",
    "exports_gone_after_close":
        "EXPORT-2: exports are freed when the session closes (404), although "
        "exports_after_close is declared.",
}

TORCH_ADAMW_DEFAULTS = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                        "weight_decay": 1e-2, "grad_clip_norm": 0.0}


# -- the state machine -------------------------------------------------------------------
class ViolatingBackend(Backend):
    """A ``Backend`` whose seams break the rules named in ``switches`` (a class attribute,
    set on the subclass :func:`~mock_server.testing.switches.create_app_with` builds)."""

    switches: frozenset[str] = frozenset()

    def _unknown_key(self, token: str) -> str | None:
        if "accepts_any_bearer" in self.switches:
            return self.api_keys[0]
        return super()._unknown_key(token)

    def _hidden(self, what: str, *, foreign: bool) -> WhitneyError:
        if foreign and "foreign_403" in self.switches:  # "this exists but is not yours"
            return WhitneyError(f"{what} belongs to another key", type="forbidden", status=403)
        return super()._hidden(what, foreign=foreign)

    def capabilities(self) -> dict[str, Any]:
        caps = super().capabilities()
        if "ppo_default_advertised_wrong" in self.switches and "ppo" in caps["loss_functions"]:
            caps["loss_functions"] = copy.deepcopy(caps["loss_functions"])
            caps["loss_functions"]["ppo"]["config"]["clip_high_threshold"]["default"] = 1.3
        return caps

    def session_view(self, session: Session) -> dict[str, Any]:
        view = super().session_view(session)
        if "session_metadata_dropped" in self.switches:
            view["metadata"] = {}
        return view

    def _extend(self, session: Session, ttl_seconds: int) -> None:
        if "heartbeat_no_extend" not in self.switches:
            super()._extend(session, ttl_seconds)

    def _busy_runs(self, session: Session) -> list[str]:
        if "close_with_active_runs" in self.switches:
            return []
        return super()._busy_runs(session)

    def _expire_run(self, run: Run) -> None:
        if "expiry_keeps_runs" not in self.switches:
            super()._expire_run(run)

    def _check_rank(self, rank: int, spec: ModelSpec) -> None:
        if "rank_limit_unvalidated" not in self.switches:
            super()._check_rank(rank, spec)

    def _begin_cancel(self, run: Run) -> None:
        super()._begin_cancel(run)
        if "cancel_immediately_terminal" in self.switches:
            run.state = "cancelled"

    def _finish_terminal(self, run: Run) -> None:
        if run.state == "cancelled" and "terminal_finish_mutates" in self.switches:
            run.state = "finished"
        super()._finish_terminal(run)

    def _is_turn(self, run: Run, seq: int) -> bool:
        return "no_ordering_holds" in self.switches or super()._is_turn(run, seq)

    def _on_replay(self, run: Run, prepare: Callable[[], Thunk]) -> None:
        if "replay_reexecutes" in self.switches:  # apply the replayed request's effect again
            try:
                prepare()()
            except WhitneyError:
                pass
        super()._on_replay(run, prepare)

    def _before_execute(self, run: Run, primitive: str) -> None:
        if primitive == "forward_backward" and "grads_not_accumulated" in self.switches:
            run.grads = None
        super()._before_execute(run, primitive)

    def _result(self, run: Run, primitive: str, result: dict[str, Any]) -> dict[str, Any]:
        on = self.switches
        if primitive in ("forward", "forward_backward") and "loss_mean" in on:
            tokens = max(1, int(result["metrics"]["tokens"]))
            result["loss"] = result["loss"] / tokens
            result["metrics"]["loss:sum"] = result["loss"]
        if primitive == "optim_step" and "snapshot_aliases_training" in on:
            for version in run.versions.values():
                version.lora = run.lora
        if primitive == "sample":
            if "sample_wrong_version" in on and run.versions:
                newest = max(run.versions)
                result["version"], result["step"] = newest, run.versions[newest].step
            for seq in result["sequences"]:
                if "sampler_logprobs_low_precision" in on:
                    seq["logprobs"] = [float(np.float16(x)) for x in seq["logprobs"]]
                if "stop_token_dropped" in on and seq["stop_reason"] == "stop" \
                        and len(seq["tokens"]) > 1:
                    seq["tokens"], seq["logprobs"] = seq["tokens"][:-1], seq["logprobs"][:-1]
        if primitive == "export_lora" and "export_sha_mismatch" in on:
            for entry in result["files"]:
                if entry["name"] == ADAPTER_CONFIG:
                    entry["sha256"] = hashlib.sha256(b"").hexdigest()
        return super()._result(run, primitive, result)

    def _on_failure(self, run: Run, error: WhitneyError) -> None:
        if "failed_op_clears_gradients" in self.switches:
            run.grads = None
        super()._on_failure(run, error)

    def _recorded(self, run: Run, seq: int) -> Operation | None:
        op = super()._recorded(run, seq)
        if op is not None and not op.ok and "failed_ops_unlogged" in self.switches:
            return None
        return op

    # -- contract 1.1 ----------------------------------------------------------------------
    def _creation_slot(self, key: str, idempotency_key: str) -> tuple[str, str] | None:
        if "idempotency_key_ignored" in self.switches:
            return None
        if "idempotency_keys_global" in self.switches:
            return "*", idempotency_key
        return super()._creation_slot(key, idempotency_key)

    def _listed(self, key: str, session: Session) -> bool:
        return "listing_leaks_foreign" in self.switches or super()._listed(key, session)

    def _cursor_after(self, last: Session) -> int:
        if "listing_pages_overlap" in self.switches:
            return last.ordinal + 1
        return super()._cursor_after(last)

    def _seq_state(self, run: Run, *, consumed: bool, next_seq: int | None = None
                   ) -> dict[str, Any]:
        if "seq_details_missing" in self.switches:
            return {}
        return super()._seq_state(run, consumed=consumed, next_seq=next_seq)

    def _free_exports(self, run: Run) -> None:
        if "exports_gone_after_close" in self.switches:
            run.exports.clear()
        else:
            super()._free_exports(run)


# -- request bodies ----------------------------------------------------------------------
def _submodel(annotation: Any) -> type[schemas.Body] | None:
    if isinstance(annotation, type) and issubclass(annotation, schemas.Body):
        return annotation
    for arg in get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _strip_unknown(model: type[schemas.Body], payload: Any) -> Any:
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


def _rewrite(switches: frozenset[str], model: type[schemas.Body], payload: Any) -> Any:
    """Body-level violations, applied after parsing and before validation."""
    if not isinstance(payload, dict):
        return payload
    if "unknown_fields_ignored" in switches:
        payload = _strip_unknown(model, payload)
    adamw = payload.get("adamw") if model is schemas.OptimStep else None
    if isinstance(adamw, dict):
        adamw = dict(adamw)
        if "adamw_defaults" in switches:
            adamw = {**TORCH_ADAMW_DEFAULTS, **adamw}
        # "Ignored" means accepted and validated, then not used: only valid values change.
        if "grad_clip_ignored" in switches and _number_in(adamw.get("grad_clip_norm"), 0, None):
            adamw["grad_clip_norm"] = 0.0
        if "beta1_ignored" in switches and _number_in(adamw.get("beta1"), 0, 1):
            adamw["beta1"] = 0.9
        payload = {**payload, "adamw": adamw}
    if model is schemas.Forward and "substitutes_unknown_loss" in switches \
            and payload.get("loss_function") not in LOSSES:
        payload = {**payload, "loss_function": "importance_sampling"}
    if model is schemas.LoadState and "load_state_keeps_optimizer" in switches:
        payload = {**payload, "with_optimizer": True}
    if model is schemas.Sample and "seed_ignored" in switches \
            and isinstance(payload.get("sampling"), dict):
        payload = {**payload, "sampling": {**payload["sampling"], "seed": None}}
    return payload


def violating_reader(switches: frozenset[str], read: BodyReader) -> BodyReader:
    """Wrap the app's body reader ``read``: ``nan_accepted`` parses with Python's ``json``
    (which reads NaN and Infinity literals), then the body-level switches rewrite the payload."""

    def read_violating(raw: bytes, model: type[schemas.Body]) -> Any:
        if "nan_accepted" in switches:
            try:
                payload = json.loads(raw) if raw.strip() else {}
            except (ValueError, UnicodeDecodeError):
                payload = read(raw, model)  # truly malformed: the normal 400
        else:
            payload = read(raw, model)
        return _rewrite(switches, model, payload)

    return read_violating


# -- responses ---------------------------------------------------------------------------
class BareUnauthorized:
    """``unauthorized_not_enveloped``: every 401 answers a web framework's default body
    ``{"detail": message}`` (no envelope, no ``WWW-Authenticate``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_bare(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] == 401:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = orjson.dumps({"detail": orjson.loads(b"".join(chunks))["error"]["message"]})
            headers = [(name, value) for name, value in start.get("headers", [])
                       if name.lower() not in (b"content-length", b"www-authenticate")]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_bare)


def violating_middleware(switches: frozenset[str]) -> Sequence[Middleware]:
    """The wire-level middleware the chosen switches need."""
    return [Middleware(BareUnauthorized)] if "unauthorized_not_enveloped" in switches else []
