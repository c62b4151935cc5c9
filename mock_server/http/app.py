"""``create_app``: one Backend behind the route table, wrapped in the mock's middleware.

From the inside out: the routes (:mod:`.routes`) with the envelope exception handlers, any
extra middleware the caller passes, ``EnvelopeMiddleware`` (request ids, 500s), the fault
middleware when the control plane is on, and the request log outermost.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from ..backend.config import DEFAULT_API_KEY, Features, Limits
from ..backend.errors import WhitneyError
from ..backend.state import Backend
from ..engine.specs import ModelSpec, declare_base_models
from .control import control_routes, install_faults
from .dashboard import dashboard_routes
from .endpoints import BodyReader, http_error, read_json, whitney_error
from .logs import RequestLogMiddleware
from .responses import EnvelopeMiddleware
from .routes import starlette_routes

__all__ = ["create_app"]


def create_app(*, api_keys: Iterable[str] = (DEFAULT_API_KEY,), seed: int = 0,
               limits: Limits | dict[str, Any] | None = None, order_wait_ms: int | None = None,
               cancel_delay_ms: int = 50, features: Features | None = None,
               control_plane: bool = False, control_key: str | None = None,
               violations: Iterable[str] = frozenset(),
               clock: Callable[[], float] | None = None, closed_retention: int = 256,
               base_models: Iterable[ModelSpec | str | Mapping[str, Any] | PathLike[str]]
               | None = None,
               backend_factory: Callable[..., Backend] = Backend,
               body_reader: BodyReader = read_json,
               middleware: Sequence[Middleware] = ()) -> Starlette:
    """Build a mock Whitney server as an ASGI app.

    ``api_keys``: accepted bearer keys (each its own tenant, SEC-2). ``seed``: ids and unseeded
    sampling. ``limits``: a ``Limits`` or a dict of overrides; ``order_wait_ms`` overrides
    ``limits.order_wait_ms`` (ORD-2). ``cancel_delay_ms``: time spent in ``cancelling``
    (LIFE-7). ``control_plane``: serve ``/_mock/`` (trace, faults, reset); ``control_key``: the
    bearer key for what touches every tenant there (reset, faults without a run), never an API
    key; generated when not given (``app.state.control_key``). ``closed_retention``:
    how many closed or expired sessions stay readable (their weights are freed at once; older
    ones are forgotten, so memory stays flat). ``clock``: a ``time.time``-like callable for
    tests.

    ``base_models``: the base models to serve (capabilities list exactly these, in order);
    none = the built-in ``whitney-mock/tiny-byte``. Each is a ``ModelSpec``, a one-line
    declaration ``"ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]"``, a
    mapping shaped like a capabilities ``base_models[]`` entry, or a ``pathlib.Path`` to a
    local Hugging Face model folder (see ``mock_server.engine.specs.declare_base_models``).
    A bad declaration raises ``ValueError`` with one line naming it.

    ``violations``: in-process contract violations that prove the conformance suite can fail,
    never reachable over HTTP. They live in ``mock_server.testing``; a non-empty set is handed
    to ``mock_server.testing.switches.create_app_with`` (the one import of ``testing`` from
    here, made only then).

    The seams that ``testing`` builds on: ``backend_factory`` (called with the backend's
    keyword arguments; a ``Backend`` subclass), ``body_reader`` (request bytes to the JSON
    value to validate), ``middleware`` (ASGI middleware just outside the routes, inside the
    request-id and 500 envelope).
    """
    declared = declare_base_models(base_models)  # ValueError before anything is built
    if violations:
        from ..testing.switches import create_app_with

        return create_app_with(
            violations=violations, api_keys=api_keys, seed=seed, limits=limits,
            order_wait_ms=order_wait_ms, cancel_delay_ms=cancel_delay_ms, features=features,
            control_plane=control_plane, control_key=control_key, clock=clock,
            closed_retention=closed_retention,
            base_models=declared)
    base_limits = limits if isinstance(limits, Limits) else Limits().with_overrides(limits)
    if order_wait_ms is not None:
        base_limits = base_limits.with_overrides({"order_wait_ms": order_wait_ms})
    clock_option = {} if clock is None else {"clock": clock}
    backend = backend_factory(api_keys=tuple(api_keys), seed=seed, limits=base_limits,
                              features=features, cancel_delay_ms=cancel_delay_ms,
                              closed_retention=closed_retention, base_models=declared,
                              **clock_option)
    routes = starlette_routes()
    if control_plane:
        routes += control_routes() + dashboard_routes()  # /_mock/ui: the live dashboard
    app = Starlette(routes=routes,
                    exception_handlers={WhitneyError: whitney_error, HTTPException: http_error})
    app.router.redirect_slashes = False  # a trailing slash is 404 in the envelope, not a 307
    app.state.backend = backend
    # The control plane's own key (what touches every tenant: reset, faults without a run):
    # given, or generated per app; MockWhitney reads it from here.
    app.state.control_key = (control_key or secrets.token_urlsafe(24)) if control_plane else None
    app.state.body_reader = body_reader
    for extra in reversed(middleware):  # add_middleware wraps: the first given ends up outer
        app.add_middleware(extra.cls, *extra.args, **extra.kwargs)
    app.add_middleware(EnvelopeMiddleware)
    if control_plane:  # outside the envelope: a drop must escape it (see faults.py)
        install_faults(app)
    app.add_middleware(RequestLogMiddleware)  # outermost: logs what the client gets
    return app
