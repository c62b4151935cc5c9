"""The mock's control plane under ``/_mock/`` (contract §5): trace, faults, reset.

Not part of the Whitney contract, off unless ``create_app(control_plane=True)``. The fault kinds
and how they match calls are described in :mod:`mock_server.http.faults`; ``openapi.yaml`` (tag
``mock-control-plane``) has the bodies.

- ``GET /_mock/trace[?run_id=]``  executed primitives per run, in seq order (ORD-4 records);
- ``GET|POST|DELETE /_mock/faults`` list, arm, clear faults;
- ``POST /_mock/reset``            forget all state and faults, optionally reconfigure.

Tenancy (SEC-2 holds here too): two kinds of bearer key are accepted.

- An ordinary API key reaches only its own runs: the trace lists its runs, a fault it arms
  must name one of its runs (``run_id``; another key's run or an unknown one is 404, as on the
  contract's paths) and fires only on that key's own calls, and listing or clearing faults
  sees only those. Anything that touches every tenant answers 403 ``control_key_required``.
- The control key (``create_app(control_key=...)``, ``--control-key`` /
  ``WHITNEY_MOCK_CONTROL_KEY``; generated per app when not given, ``app.state.control_key``,
  and used by ``MockWhitney`` and the fixtures) sees and may do everything: every run's trace,
  faults on any call (with or without ``run_id``), ``reset`` and its configuration overrides.
  It is not an API key: the contract's paths answer it 401.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backend import schemas
from ..backend.config import Limits
from ..backend.errors import NotFound, ValidationFailed, WhitneyError
from ..backend.state import Backend
from .endpoints import authorization, read_body
from .faults import Fault, FaultMiddleware, FaultRegistry, parse_fault
from .responses import json_response

__all__ = ["control_routes", "install_faults"]


def install_faults(app: Any) -> FaultRegistry:
    """Wrap ``app`` with the fault middleware; called by ``create_app(control_plane=True)``."""
    backend: Backend = app.state.backend
    registry = FaultRegistry(backend, {"seed": backend.seed, "limits": backend.limits,
                                       "api_keys": backend.api_keys,
                                       "cancel_delay_ms": backend.cancel_delay_ms})
    app.state.mock_faults = registry
    app.add_middleware(FaultMiddleware, registry=registry)
    return registry


# -- endpoints --------------------------------------------------------------------------------
class ResetBody(schemas.Body):
    seed: Annotated[int, Field(ge=0, le=schemas.INT64_MAX)] | None = None
    limits: dict[str, int] | None = None
    api_keys: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None \
        = None
    cancel_delay_ms: Annotated[int, Field(ge=0, le=600_000)] | None = None


def is_control_key(request: Request) -> bool:
    """Whether the request's bearer token is the app's control key (constant time)."""
    control_key: str | None = getattr(request.app.state, "control_key", None)
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    return (control_key is not None and scheme.lower() == "bearer"
            and hmac.compare_digest(token.strip().encode(), control_key.encode()))


def _authorized(request: Request) -> tuple[Backend, FaultRegistry, str | None]:
    """The backend, the fault registry and the caller: ``None`` for the control key, else the
    API key (SEC-1: 401 for anything else)."""
    backend: Backend = request.app.state.backend
    caller = None
    given = authorization(request)  # SEC-1: exactly one Authorization header
    if not is_control_key(request):
        caller = backend.authenticate(given)
    return backend, request.app.state.mock_faults, caller


def _needs_control_key(what: str) -> WhitneyError:
    return WhitneyError(f"{what} touches every tenant: it needs the control key (--control-key / "
                        f"WHITNEY_MOCK_CONTROL_KEY; MockWhitney and the fixtures use it), not an "
                        f"API key, which reaches only its own runs", type="control_key_required",
                        status=403)


def _own_run(backend: Backend, caller: str | None, run_id: str) -> None:
    """404 unless ``run_id`` exists and, for an API key, is its own (SEC-2, as on the
    contract's paths)."""
    run = backend.runs.get(run_id)
    if run is None or (caller is not None and run.key != caller):
        raise NotFound(f"run {run_id!r} not found")


def _visible(backend: Backend, caller: str | None, fault: Fault) -> bool:
    """A fault an API key may see: one it armed (on its own run)."""
    return caller is None or fault.owner == caller


async def _payload(request: Request) -> Any:
    return schemas.parse_json(await read_body(request))


async def trace(request: Request) -> Response:
    """``GET /_mock/trace[?run_id=]``: executed primitives per run, in seq order (the caller's
    runs; every run for the control key)."""
    backend, _, caller = _authorized(request)
    run_id = request.query_params.get("run_id")
    if run_id is not None:
        _own_run(backend, caller, run_id)
    return json_response({"runs": backend.trace(run_id, key=caller)})


async def list_faults(request: Request) -> Response:
    """``GET /_mock/faults``: every fault added since the last reset, with its counters (an API
    key sees the faults it armed)."""
    backend, registry, caller = _authorized(request)
    return json_response({"faults": [f.view() for f in registry.faults
                                     if _visible(backend, caller, f)]})


async def add_fault(request: Request) -> Response:
    """``POST /_mock/faults``: register one fault (201 with its view). An API key may arm
    faults on its own runs only (they then fire on its own calls only)."""
    backend, registry, caller = _authorized(request)
    spec = parse_fault(await _payload(request))
    if caller is not None:
        if spec.run_id is None:
            raise _needs_control_key("a fault without run_id")
        _own_run(backend, caller, spec.run_id)
    fault = registry.add(spec, owner=caller)
    return json_response(fault.view(), 201)


async def clear_faults(request: Request) -> Response:
    """``DELETE /_mock/faults``: forget every fault (an API key: the faults it armed); state is
    untouched."""
    backend, registry, caller = _authorized(request)
    kept = [f for f in registry.faults if not _visible(backend, caller, f)]
    cleared = len(registry.faults) - len(kept)
    registry.faults[:] = kept
    return json_response({"cleared": cleared})


async def reset(request: Request) -> Response:
    """``POST /_mock/reset``: forget all state and faults; fields given replace the app's
    initial configuration (limits are overrides of the initial limits) until the next reset.
    Control key only."""
    backend, registry, caller = _authorized(request)
    if caller is not None:
        raise _needs_control_key("reset")
    body = schemas.validate(ResetBody, await _payload(request))
    initial = registry.initial
    base_limits: Limits = initial["limits"]
    try:
        limits = base_limits.with_overrides(body.limits)
    except (ValueError, TypeError) as exc:
        raise ValidationFailed(str(exc), details={"loc": "limits"}) from None
    backend.seed = initial["seed"] if body.seed is None else body.seed
    backend.limits = limits
    backend.api_keys = tuple(body.api_keys) if body.api_keys else initial["api_keys"]
    backend.cancel_delay_ms = (initial["cancel_delay_ms"] if body.cancel_delay_ms is None
                               else body.cancel_delay_ms)
    backend.reset()
    registry.faults.clear()
    return json_response({"seed": backend.seed, "limits": limits.as_dict(),
                  "cancel_delay_ms": backend.cancel_delay_ms,
                  "api_key_count": len(backend.api_keys)})


def control_routes() -> list[Route]:
    return [
        Route("/_mock/trace", trace, methods=["GET"]),
        Route("/_mock/faults", list_faults, methods=["GET"]),
        Route("/_mock/faults", add_fault, methods=["POST"]),
        Route("/_mock/faults", clear_faults, methods=["DELETE"]),
        Route("/_mock/reset", reset, methods=["POST"]),
    ]
