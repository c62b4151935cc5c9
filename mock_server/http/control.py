"""The mock's control plane under ``/_mock/`` (contract §5): trace, faults, reset.

Not part of the Whitney contract, off unless ``create_app(control_plane=True)``, and behind the
same bearer auth as the contract (SEC-1). The fault kinds and how they match calls are described
in :mod:`mock_server.http.faults`; ``openapi.yaml`` (tag ``mock-control-plane``) has the bodies.

- ``GET /_mock/trace[?run_id=]``  executed primitives per run, in seq order (ORD-4 records);
- ``GET|POST|DELETE /_mock/faults`` list, arm, clear faults;
- ``POST /_mock/reset``            forget all state and faults, optionally reconfigure.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backend import schemas
from ..backend.config import Limits
from ..backend.errors import NotFound, ValidationFailed
from ..backend.state import Backend
from .endpoints import read_body
from .faults import FaultMiddleware, FaultRegistry, parse_fault
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


def _authorized(request: Request) -> tuple[Backend, FaultRegistry]:
    backend: Backend = request.app.state.backend
    backend.authenticate(request.headers.get("authorization"))  # SEC-1 applies here too
    return backend, request.app.state.mock_faults


async def _payload(request: Request) -> Any:
    return schemas.parse_json(await read_body(request))


async def trace(request: Request) -> Response:
    """``GET /_mock/trace[?run_id=]``: executed primitives per run, in seq order."""
    backend, _ = _authorized(request)
    run_id = request.query_params.get("run_id")
    if run_id is not None and run_id not in backend.runs:
        raise NotFound(f"run {run_id!r} not found")
    return json_response({"runs": backend.trace(run_id)})


async def list_faults(request: Request) -> Response:
    """``GET /_mock/faults``: every fault added since the last reset, with its counters."""
    _, registry = _authorized(request)
    return json_response({"faults": [f.view() for f in registry.faults]})


async def add_fault(request: Request) -> Response:
    """``POST /_mock/faults``: register one fault (201 with its view)."""
    _, registry = _authorized(request)
    fault = registry.add(parse_fault(await _payload(request)))
    return json_response(fault.view(), 201)


async def clear_faults(request: Request) -> Response:
    """``DELETE /_mock/faults``: forget every fault; state is untouched."""
    _, registry = _authorized(request)
    cleared = len(registry.faults)
    registry.faults.clear()
    return json_response({"cleared": cleared})


async def reset(request: Request) -> Response:
    """``POST /_mock/reset``: forget all state and faults; fields given replace the app's
    initial configuration (limits are overrides of the initial limits) until the next reset."""
    backend, registry = _authorized(request)
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
