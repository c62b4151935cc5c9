"""``create_app``: the route table, the envelope middleware and the wiring of one Backend."""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import endpoints as r
from ..backend.errors import WhitneyError
from ..backend.config import Features, Limits
from ..backend.primitives import PREPARERS
from ..backend.state import Backend

logger = logging.getLogger("mock_server")

API = "/v1/training"


class EnvelopeMiddleware:
    """TRANSPORT-1 ``X-Request-Id`` on every response, and a 500 envelope for any crash.

    Starlette's ServerErrorMiddleware re-raises after answering; the mock must answer in the
    contract's envelope and keep serving, so unexpected exceptions stop here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                request_id = value.decode("latin-1")[:200]
                break
        request_id = request_id or os.urandom(16).hex()  # uuid4().hex's format, 5x cheaper
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # the client hung up before its body was read: no one to answer
            return
        except Exception:
            logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            body = orjson.dumps({"error": {"type": "internal_error",
                                           "message": "the mock hit an internal error",
                                           "details": {"request_id": request_id}}})
            await send_with_id({"type": "http.response.start", "status": 500,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
            await send_with_id({"type": "http.response.body", "body": body})


def routes() -> list[Route]:
    # Primitives first: Starlette tries routes in order, and they are the hot ones.
    table = [Route(f"{API}/runs/{{run_id}}/{name}", r.primitive_endpoint(name), methods=["POST"])
             for name in PREPARERS]
    table += [
        Route(f"{API}/capabilities", r.capabilities, methods=["GET"]),
        Route(f"{API}/sessions", r.create_session, methods=["POST"]),
        Route(f"{API}/sessions/{{session_id}}", r.get_session, methods=["GET"]),
        Route(f"{API}/sessions/{{session_id}}/heartbeat", r.heartbeat, methods=["POST"]),
        Route(f"{API}/sessions/{{session_id}}/close", r.close_session, methods=["POST"]),
        Route(f"{API}/sessions/{{session_id}}/runs", r.create_run, methods=["POST"]),
        Route(f"{API}/runs/{{run_id}}", r.get_run, methods=["GET"]),
        Route(f"{API}/runs/{{run_id}}/finish", r.finish_run, methods=["POST"]),
        Route(f"{API}/runs/{{run_id}}/cancel", r.cancel_run, methods=["POST"]),
        Route(f"{API}/runs/{{run_id}}/operations/{{seq:int}}", r.get_operation, methods=["GET"]),
        Route(f"{API}/runs/{{run_id}}/exports/{{export_id}}/{{name}}", r.get_export_file,
              methods=["GET"]),
    ]
    return table


def create_app(*, api_keys: tuple[str, ...] | list[str] = ("whitney-mock-key",), seed: int = 0,
               limits: Limits | dict[str, Any] | None = None, order_wait_ms: int | None = None,
               cancel_delay_ms: int = 50, features: Features | None = None,
               control_plane: bool = False, violations: frozenset[str] | set[str] = frozenset(),
               clock: Any = None, closed_retention: int = 256) -> Starlette:
    """Build a mock Whitney server as an ASGI app.

    ``api_keys``: accepted bearer keys (each its own tenant, SEC-2). ``seed``: ids and unseeded
    sampling. ``limits``: a ``Limits`` or a dict of overrides; ``order_wait_ms`` overrides
    ``limits.order_wait_ms`` (ORD-2). ``cancel_delay_ms``: time spent in ``cancelling``
    (LIFE-7). ``control_plane``: serve ``/_mock/`` (trace, faults, reset). ``violations``:
    in-process contract violations used to prove the conformance suite can fail (see
    ``mock_server.violations``); never reachable over HTTP. ``closed_retention``: how many
    closed or expired sessions stay readable (their weights are freed at once; older ones
    are forgotten, so memory stays flat). ``clock``: a ``time.time``-like callable for tests.
    """
    base_limits = limits if isinstance(limits, Limits) else Limits().with_overrides(limits)
    if order_wait_ms is not None:
        base_limits = base_limits.with_overrides({"order_wait_ms": order_wait_ms})
    kwargs: dict[str, Any] = {}
    if clock is not None:
        kwargs["clock"] = clock
    backend = Backend(api_keys=tuple(api_keys), seed=seed, limits=base_limits,
                      features=features, cancel_delay_ms=cancel_delay_ms,
                      violations=frozenset(violations), closed_retention=closed_retention,
                      **kwargs)
    table = routes()
    if control_plane:
        from .control import control_routes

        table += control_routes()
    app = Starlette(routes=table,
                    exception_handlers={WhitneyError: r.whitney_error, HTTPException: r.http_error})
    app.state.backend = backend
    app.add_middleware(EnvelopeMiddleware)
    if control_plane:  # outside the envelope: a drop must escape it (see faults.py)
        from .control import install_faults

        install_faults(app)
    from .logs import RequestLogMiddleware

    app.add_middleware(RequestLogMiddleware)  # outermost: logs what the client gets
    return app
