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

from starlette.datastructures import URLPath
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound, Route, compile_path
from starlette.types import Receive, Scope, Send

from ..backend.config import API_PREFIX
from ..backend.primitives import PRIMITIVES
from . import endpoints

__all__ = ["ROUTES", "PrimitiveRoutes", "RouteSpec", "match", "starlette_routes"]

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


class PrimitiveRoutes(BaseRoute):
    """Every ``POST /runs/{run_id}/{primitive}`` of the table as one Starlette route.

    The hot path: one prefix test and one dict lookup find any primitive, where the router
    would try a regex per route in turn, and the endpoint runs without Starlette's
    per-request exception wrapper (a primitive endpoint answers its own ``WhitneyError``s in
    the envelope). Other methods on these paths are 405, as for any route.
    """

    def __init__(self, specs: list[RouteSpec]) -> None:
        self.routes = {spec.name: spec.route() for spec in specs}
        self.endpoints = {spec.name: spec.endpoint for spec in specs}
        self.prefix = API_PREFIX + "/runs/"

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http":
            path: str = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):  # as Starlette's get_route_path
                path = path[len(root):]
            if path.startswith(self.prefix):
                run_id, slash, name = path[len(self.prefix):].partition("/")
                endpoint = self.endpoints.get(name) if run_id and slash else None
                if endpoint is not None:
                    child = {"endpoint": endpoint, "path_params": {"run_id": run_id}}
                    return (Match.FULL if scope["method"] == "POST" else Match.PARTIAL), child
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: object) -> URLPath:
        route = self.routes.get(name)
        if route is None:
            raise NoMatchFound(name, path_params)
        return route.url_path_for(name, **path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            raise HTTPException(status_code=405, headers={"Allow": "POST"})
        response = await scope["endpoint"](Request(scope, receive))
        await response(scope, receive, send)


def starlette_routes() -> list[BaseRoute]:
    """The table for Starlette's router, in order: the primitives first (the hot ones), as
    one :class:`PrimitiveRoutes`."""
    primitives = [spec for spec in ROUTES if spec.name in PRIMITIVES]
    return [PrimitiveRoutes(primitives),
            *(spec.route() for spec in ROUTES if spec.name not in PRIMITIVES)]
