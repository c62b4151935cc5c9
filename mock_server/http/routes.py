"""The contract's routes, in one table: the app routes with it, fault injection matches calls
with it, and the request log finds a call's run with it.

A route's ``name`` is what a fault targets (``optim_step``, ``get_run`` ...); primitives come
from the primitive registry, first, because Starlette tries routes in order and they are the
hot ones.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, compile_path

from ..backend.config import API_PREFIX
from ..backend.primitives import PRIMITIVES
from . import endpoints

__all__ = ["ROUTES", "RouteSpec", "match", "starlette_routes"]

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class RouteSpec:
    """One route: ``method`` on ``path`` (Starlette syntax, under ``API_PREFIX``)."""

    name: str
    method: str
    path: str
    endpoint: Endpoint
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", compile_path(API_PREFIX + self.path)[0])

    def route(self) -> Route:
        """This route for Starlette's router."""
        return Route(API_PREFIX + self.path, self.endpoint, methods=[self.method], name=self.name)


ROUTES: list[RouteSpec] = [
    *(RouteSpec(name, "POST", f"/runs/{{run_id}}/{name}", endpoints.primitive_endpoint(name))
      for name in PRIMITIVES),
    RouteSpec("capabilities", "GET", "/capabilities", endpoints.capabilities),
    RouteSpec("create_session", "POST", "/sessions", endpoints.create_session),
    RouteSpec("list_sessions", "GET", "/sessions", endpoints.list_sessions),
    RouteSpec("get_session", "GET", "/sessions/{session_id}", endpoints.get_session),
    RouteSpec("heartbeat", "POST", "/sessions/{session_id}/heartbeat", endpoints.heartbeat),
    RouteSpec("close_session", "POST", "/sessions/{session_id}/close", endpoints.close_session),
    RouteSpec("create_run", "POST", "/sessions/{session_id}/runs", endpoints.create_run),
    RouteSpec("get_run", "GET", "/runs/{run_id}", endpoints.get_run),
    RouteSpec("finish_run", "POST", "/runs/{run_id}/finish", endpoints.finish_run),
    RouteSpec("cancel_run", "POST", "/runs/{run_id}/cancel", endpoints.cancel_run),
    RouteSpec("get_operation", "GET", "/runs/{run_id}/operations/{seq:int}",
              endpoints.get_operation),
    RouteSpec("get_export_file", "GET", "/runs/{run_id}/exports/{export_id}/{name}",
              endpoints.get_export_file),
]


def match(method: str | None, path: str) -> tuple[RouteSpec, dict[str, str]] | None:
    """The route serving ``method`` (None: any method) on ``path``, and its path parameters."""
    if not path.startswith(API_PREFIX):
        return None
    for spec in ROUTES:
        if method is None or spec.method == method:
            found = spec.regex.match(path)
            if found:
                return spec, found.groupdict()
    return None


def starlette_routes() -> list[Route]:
    """The table for Starlette's router, in order."""
    return [spec.route() for spec in ROUTES]
