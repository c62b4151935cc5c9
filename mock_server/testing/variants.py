"""Legal variants the mock can be built with, to prove the conformance suite fails a server only
for breaking the contract: each uses one freedom the contract leaves a server (EXT-1, the
capabilities it lets a server choose, what it leaves unnamed) and is otherwise the faithful mock.

``create_app_with(legal_variants={...})`` (:mod:`.switches`) switches them on, in-process only.
``tests/testing/test_legal_variants.py`` proves, for each, that the ``contract`` profile passes it
and that the ``strict`` profile reports exactly the difference from the mock's own shapes (or
nothing, when the variant changes no shape the mock fixes).

They act through the same seams as the violations (:mod:`.violations`):

- :class:`VariantBackend` overrides ``Backend`` seams and public helpers (capabilities, views,
  ids, results) and declares its own base model (``Backend(base_models=...)``);
- :func:`variant_reader` wraps the request-body reader (sampling seeds);
- :class:`WireRewrite` is ASGI middleware for what only shows on the wire (error objects,
  ``Whitney-Replayed``).
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backend import schemas
from ..backend.config import API_PREFIX
from ..backend.errors import NotFound, ValidationFailed
from ..backend.records import Outcome, Run, Session, Thunk
from ..backend.state import Backend
from ..engine.specs import ModelSpec
from ..http.endpoints import BodyReader
from ..http.responses import error_messages

__all__ = ["LEGAL_VARIANTS", "VariantBackend", "WireRewrite", "variant_middleware",
           "variant_reader"]

LEGAL_VARIANTS: dict[str, str] = {
    "extra_response_fields":
        "EXT-1: every response object carries fields the contract does not define (run view "
        "base_model, session view ttl_seconds, capabilities server_version and extras in "
        "limits, features, base_models and a loss entry, extras in every primitive result "
        "and its nested objects), some of them changing from one read to the next.",
    "extra_error_fields":
        "EXT-1: the error envelope and error object carry extra keys (documentation_url, "
        "retryable) and every details object an extra key (hint).",
    "other_error_types":
        "EXT-1: other error.type values and details shapes where the contract names none: "
        "401 auth_failed, 404 session_missing / run_not_found / seq_not_recorded / "
        "export_missing, 405 bad_method, 422 missing_field / invalid_value with "
        "details.problems (no details.errors), unknown_field's names in details.unknown, "
        "limit_exceeded and quota_exceeded naming the limit in details.which, 409 "
        "loss_overflow / update_overflow / checkpoint_mismatch.",
    "replayed_false":
        "EXT-1 / ORD-3: first executions of primitives carry 'Whitney-Replayed: false' (only "
        "'true' marks a replay).",
    "small_vocab":
        "DISC-1: the only base model has a 32-token vocabulary with EOS 17 and no BOS.",
    "large_vocab":
        "DISC-1: the only base model has 262,144 token ids, EOS 1 and BOS 2 (Gemma-like).",
    "tight_limits":
        "DISC-1: small limits (2 datums and 48 tokens per request, 2 samples of at most 4 "
        "tokens, 64 KiB bodies, 4 sessions, 2 runs per session, 3 versions per run) and a "
        "base model with max_context 40 and max_lora_rank 2.",
    "minimal_limits":
        "DISC-1: every limit at the least a server could declare and still train (1 datum, "
        "16 tokens per request, 1 sample of 1 token, 2 KiB bodies, 1 session, 1 run per "
        "session, 1 version per run) and a base model with max_context 24 and max_lora_rank "
        "1; the suite reports what it cannot exercise there instead of failing.",
    "fewer_features":
        "DISC-1 / VER-4 / LIFE-2: every optional feature declared false (session_ttl: "
        "ttl_seconds refused with 422; deterministic_sampling: sampling.seed not honoured; "
        "contract 1.1's idempotent_create, session_listing, seq_error_details, "
        "exports_after_close: the 1.0 behaviour) and logprob_tolerance 1e-5.",
    "fewer_losses":
        "DISC-1 / section 4a: only cross_entropy and importance_sampling are declared; the "
        "others are 422 unsupported_loss_function like any unknown loss.",
    "different_ids":
        "LIFE-1 / LIFE-5 / CKPT-1 / EXPORT-1: session, run, checkpoint and export ids are UUIDs "
        "(the contract fixes no id format).",
    "slow_cancel":
        "LIFE-7: a run stays cancelling for 1 s after cancel (the contract bounds no delay).",
    "ttl_bounds":
        "LIFE-2: min_ttl_seconds 2 and max_ttl_seconds 600.",
    "fewer_primitives":
        "DISC-1 / section 3.1: only forward, forward_backward, optim_step, "
        "save_weights_for_sampler and sample are declared (no logprobs, save_state, load_state, "
        "export_lora, hence no exports_after_close); the others answer 404 like any unknown "
        "path.",
    "float32_results":
        "VER-3 / DISC-1: every number in a primitive result is rounded to float32, and "
        "features.logprob_tolerance is 1e-4.",
    "timestamp_offset":
        "Section 3: timestamps written with a '+00:00' offset and millisecond precision "
        "(RFC 3339 UTC either way).",
}

# -- the variants' numbers ------------------------------------------------------------------
SMALL_VOCAB = ModelSpec.declare("variant/small-32", 32, eos_token_id=17)
LARGE_VOCAB = ModelSpec.declare("variant/large-262144", 262_144, eos_token_id=1, bos_token_id=2)
TIGHT_MODEL = ModelSpec.declare("variant/tight-258", 258, eos_token_id=257, bos_token_id=256,
                                max_context=40, max_lora_rank=2)
TIGHT_LIMITS = {"max_body_bytes": 64 * 1024, "max_datums_per_request": 2,
                "max_tokens_per_request": 48, "max_num_samples": 2, "max_sample_tokens": 4,
                "max_sessions": 4, "max_runs_per_session": 2, "max_versions_per_run": 3}
MINIMAL_MODEL = ModelSpec.declare("variant/minimal-258", 258, eos_token_id=257,
                                  bos_token_id=256, max_context=24, max_lora_rank=1)
MINIMAL_LIMITS = {"max_body_bytes": 2048, "max_datums_per_request": 1,
                  "max_tokens_per_request": 16, "max_num_samples": 1, "max_sample_tokens": 1,
                  "max_sessions": 1, "max_runs_per_session": 1, "max_versions_per_run": 1}
TTL_BOUNDS = {"min_ttl_seconds": 2, "max_ttl_seconds": 600}
SLOW_CANCEL_MS = 1000
FEWER_LOSSES = ("cross_entropy", "importance_sampling")
UNDECLARED_PRIMITIVES = ("logprobs", "save_state", "load_state", "export_lora")


def _float32(value: Any) -> Any:
    """``value`` with every float rounded to the nearest float32."""
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, list):
        return [_float32(v) for v in value]
    if isinstance(value, dict):
        return {k: _float32(v) for k, v in value.items()}
    return value


def _iso_offset(text: Any) -> Any:
    """``2025-01-02T03:04:05.678901Z`` -> ``2025-01-02T03:04:05.678+00:00``."""
    if not isinstance(text, str) or not text.endswith("Z"):
        return text
    moment = datetime.fromisoformat(text[:-1] + "+00:00").astimezone(UTC)
    return moment.isoformat(timespec="milliseconds")


# -- the state machine -------------------------------------------------------------------
class VariantBackend(Backend):
    """A ``Backend`` that uses the freedoms named in ``switches`` (a class attribute, set on the
    subclass :func:`~mock_server.testing.switches.create_app_with` builds)."""

    switches: frozenset[str] = frozenset()

    def __init__(self, **options: Any) -> None:
        on = self.switches
        for name, spec in (("small_vocab", SMALL_VOCAB), ("large_vocab", LARGE_VOCAB),
                           ("tight_limits", TIGHT_MODEL), ("minimal_limits", MINIMAL_MODEL)):
            if name in on:  # the only base model this server serves (DISC-1, LIFE-5)
                options["base_models"] = [spec]
        if "slow_cancel" in on:
            options["cancel_delay_ms"] = max(SLOW_CANCEL_MS, options.get("cancel_delay_ms", 0))
        super().__init__(**options)
        overrides = {**(TIGHT_LIMITS if "tight_limits" in on else {}),
                     **(MINIMAL_LIMITS if "minimal_limits" in on else {}),
                     **(TTL_BOUNDS if "ttl_bounds" in on else {})}
        self.limits = self.limits.with_overrides(overrides)
        if "fewer_primitives" in on:  # no export_lora: nothing to keep after close
            self.features = replace(self.features, exports_after_close=False)
        if "fewer_features" in on:  # every optional feature off (1.1's too: a 1.0 behaviour)
            off = {f.name: False for f in fields(self.features)
                   if isinstance(getattr(self.features, f.name), bool)}
            self.features = replace(self.features, **off, logprob_tolerance=1e-5)
        if "float32_results" in on:
            self.features = replace(self.features, logprob_tolerance=1e-4)

    def capabilities(self) -> dict[str, Any]:
        caps = super().capabilities()
        on = self.switches
        if "fewer_primitives" in on:
            caps["primitives"] = [p for p in caps["primitives"] if p not in UNDECLARED_PRIMITIVES]
        if "fewer_losses" in on:
            caps["loss_functions"] = {name: spec for name, spec in caps["loss_functions"].items()
                                      if name in FEWER_LOSSES}
        if "extra_response_fields" in on:
            caps = copy.deepcopy(caps)
            caps["server_version"] = "variant-server 9.9.9"
            caps["limits"]["max_concurrent_runs"] = 8
            caps["features"]["streaming"] = False
            for entry in caps["base_models"]:
                entry["family"] = "mock"
            first_loss = next(iter(caps["loss_functions"].values()))
            first_loss["description"] = "a loss the server documents"
        return caps

    # -- ids and timestamps ---------------------------------------------------------------
    def new_id(self, prefix: str) -> str:
        if "different_ids" in self.switches:
            self._counter += 1
            return str(uuid.UUID(bytes=self.rng.bytes(16), version=4))
        return super().new_id(prefix)

    # -- views --------------------------------------------------------------------------------
    def session_view(self, session: Session) -> dict[str, Any]:
        view = super().session_view(session)
        on = self.switches
        if "timestamp_offset" in on:
            view["created_at"] = _iso_offset(view["created_at"])
            view["expires_at"] = _iso_offset(view["expires_at"])
        if "extra_response_fields" in on:
            view["ttl_seconds"] = session.ttl_seconds
            view["run_ids"] = list(session.run_ids)  # changes as runs are created
            view["read_at"] = self.clock()  # changes on every read
        return view

    def run_view(self, run: Run) -> dict[str, Any]:
        view = super().run_view(run)
        on = self.switches
        if "timestamp_offset" in on:
            view["created_at"] = _iso_offset(view["created_at"])
            for entry in view["versions"]:
                entry["created_at"] = _iso_offset(entry["created_at"])
        if "extra_response_fields" in on:
            view["base_model"] = run.base_model
            view["lora"] = {"rank": run.lora.rank, "alpha": run.lora.alpha}
            view["held_requests"] = len(run.held)
            view["read_at"] = self.clock()
            for entry in view["versions"]:
                entry["saved_by"] = "save_weights_for_sampler"
        return view

    # -- primitives -------------------------------------------------------------------------
    async def submit(self, *, key: str, run_id: str, primitive: str, body: Any,
                     digest: bytes) -> Outcome:
        if "fewer_losses" in self.switches and primitive in ("forward", "forward_backward") \
                and body.loss_function not in FEWER_LOSSES:
            run = self.owned_run(key, run_id)

            def refuse() -> Thunk:
                raise ValidationFailed(f"loss_function {body.loss_function!r} is not supported",
                                       type="unsupported_loss_function",
                                       details={"supported": list(FEWER_LOSSES)})

            return await self._submit(run, body.seq, primitive, digest, refuse)
        return await super().submit(key=key, run_id=run_id, primitive=primitive, body=body,
                                    digest=digest)

    def _result(self, run: Run, primitive: str, result: dict[str, Any]) -> dict[str, Any]:
        if "float32_results" in self.switches:
            result = _float32(result)
        if "extra_response_fields" in self.switches:
            result = {**result, "primitive": primitive, "run_step": run.step}
            if "metrics" in result:
                result["metrics"] = {**result["metrics"], "positions_per_datum": 1.0}
            for key, extra in (("outputs", "num_positions"), ("sequences", "num_tokens")):
                if key in result:
                    result[key] = [{**item, extra: len(item.get("logprobs") or [])}
                                   for item in result[key]]
            if "files" in result:
                result["files"] = [{**item, "media_type": "application/octet-stream"}
                                   for item in result["files"]]
        return super()._result(run, primitive, result)


# -- request bodies ----------------------------------------------------------------------
def variant_reader(switches: frozenset[str], read: BodyReader) -> BodyReader:
    """Wrap the app's body reader: ``fewer_features`` does not honour ``sampling.seed`` (legal
    when ``deterministic_sampling`` is false)."""

    def read_variant(raw: bytes, model: type[schemas.Body]) -> Any:
        payload = read(raw, model)
        if "fewer_features" in switches and model is schemas.Sample \
                and isinstance(payload, dict) and isinstance(payload.get("sampling"), dict):
            payload = {**payload, "sampling": {**payload["sampling"], "seed": None}}
        return payload

    return read_variant


# -- the wire ----------------------------------------------------------------------------
_PRIMITIVE_PATH = re.compile(rf"^{re.escape(API_PREFIX)}/runs/[^/]+/(?!finish$|cancel$)[a-z_]+$")
_OPERATION_PATH = re.compile(rf"^{re.escape(API_PREFIX)}/runs/[^/]+/operations/[^/]+$")

# other_error_types: situations the contract names no type for, by the mock's type.
RENAMED = {"unauthorized": "auth_failed", "operation_not_found": "seq_not_recorded",
           "export_not_found": "export_missing", "method_not_allowed": "bad_method",
           "non_finite_loss": "loss_overflow", "non_finite_update": "update_overflow",
           "checkpoint_incompatible": "checkpoint_mismatch", "rate_limited": "slow_down",
           "internal_error": "server_error"}


def _other_types(error: dict[str, Any], path: str) -> None:
    """``other_error_types`` on one error object, in place."""
    etype, details = error.get("type"), error.get("details")
    details = details if isinstance(details, dict) else {}
    if etype == "not_found":  # SEC-2: foreign and unknown ids alike, named by the path
        rest = path[len(API_PREFIX):]
        error["type"] = ("session_missing" if rest.startswith("/sessions/") else
                         "run_not_found" if rest.startswith("/runs/") else "no_route")
    elif etype in RENAMED:
        error["type"] = RENAMED[etype]
    elif etype == "validation_error":
        problems = details.pop("errors", None) or []
        missing = any("required" in str(p.get("msg", "")).lower() for p in problems
                      if isinstance(p, dict))
        error["type"] = "missing_field" if missing else "invalid_value"
        details["problems"] = [f"{'.'.join(map(str, p.get('loc', [])))}: {p.get('msg')}"
                               for p in problems if isinstance(p, dict)]
    elif etype == "unknown_field" and "fields" in details:
        details["unknown"] = details.pop("fields")
    elif etype in ("limit_exceeded", "quota_exceeded") and "limit" in details:
        details["which"] = details.pop("limit")
    error["details"] = details


def _extra_error_fields(envelope: dict[str, Any] | None, error: dict[str, Any]) -> None:
    """``extra_error_fields`` on one error object (and its envelope), in place."""
    error["retryable"] = error.get("type") in ("seq_gap", "rate_limited", "internal_error")
    details = error.get("details")
    if isinstance(details, dict):
        details["hint"] = "see the contract for this error"
    if envelope is not None:
        envelope["documentation_url"] = f"https://whitney.invalid/errors/{error.get('type')}"


async def _no_such_route(scope: Scope, receive: Receive, send: Send) -> None:
    """``fewer_primitives``: an undeclared primitive's path answers as an unknown one."""
    for message in error_messages(NotFound(f"no route for {scope.get('path')}")):
        await send(message)


class WireRewrite:
    """ASGI middleware for the wire-level variants: ``replayed_false`` adds
    ``Whitney-Replayed: false`` to primitive responses that are not replays;
    ``other_error_types`` and ``extra_error_fields`` rewrite every error object (the envelope
    of a 4xx/5xx, and the ``error`` of a failed operation's record, so ORD-5 and the response
    agree)."""

    def __init__(self, app: ASGIApp, switches: frozenset[str]) -> None:
        self.app = app
        self.switches = switches

    def _rewrite(self, path: str, status: int, body: bytes) -> bytes:
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(document, dict) or not isinstance(document.get("error"), dict):
            return body
        error = document["error"]
        envelope = document if status >= 400 else None  # else: a failed operation's record
        if "other_error_types" in self.switches:
            _other_types(error, path)
        if "extra_error_fields" in self.switches:
            _extra_error_fields(envelope, error)
        return orjson.dumps(document)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        app = self.app
        if "fewer_primitives" in self.switches and scope.get("method") == "POST" \
                and _PRIMITIVE_PATH.match(path) \
                and path.rsplit("/", 1)[-1] in UNDECLARED_PRIMITIVES:
            app = _no_such_route
        replayed_false = "replayed_false" in self.switches and scope.get("method") == "POST" \
            and _PRIMITIVE_PATH.match(path) is not None
        rewrite_errors = bool({"other_error_types", "extra_error_fields"} & self.switches)
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_rewritten(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if replayed_false and not any(k.lower() == b"whitney-replayed"
                                              for k, _ in headers):
                    headers.append((b"whitney-replayed", b"false"))
                message = {**message, "headers": headers}
                is_json = any(k.lower() == b"content-type" and v.startswith(b"application/json")
                              for k, v in headers)
                status = message["status"]
                if rewrite_errors and is_json and (status >= 400 or (
                        scope.get("method") == "GET" and _OPERATION_PATH.match(path))):
                    start = message
                    return
                await send(message)
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = self._rewrite(path, start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await app(scope, receive, send_rewritten)


def variant_middleware(switches: frozenset[str]) -> Sequence[Middleware]:
    """The wire-level middleware the chosen variants need."""
    wire = {"replayed_false", "other_error_types", "extra_error_fields", "fewer_primitives"}
    return [Middleware(WireRewrite, switches=switches)] if wire & switches else []
