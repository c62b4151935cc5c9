"""The live dashboard (issue 15): a page at ``/_mock/ui`` and its data at ``/_mock/ui/state``.

Served with the control plane (``create_app(control_plane=True)``, ``--control-plane``,
``WHITNEY_MOCK_CONTROL_PLANE=1``). The page and its script and style are public, static package
data (``mock_server/http/ui/``), served from memory, nothing fetched from anywhere else (the
Content-Security-Policy says so to the browser). The data is not public: the page asks for an
API key once, keeps it in the tab's ``sessionStorage`` and sends it as ``Authorization:
Bearer``; ``GET /_mock/ui/state?since=N`` answers with that key's sessions only (SEC-2), built
by :func:`mock_server.backend.readmodel.dashboard_state`, plus the faults in force on that key's
calls: those it armed, and those armed for every tenant (by the control key, or by any key
before faults had owners) that name no run or one of its own runs. A fault armed by another
key, or naming another key's run, never reaches the page.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backend.errors import NotFound, ValidationFailed
from ..backend.readmodel import dashboard_state
from ..backend.schemas import INT64_MAX
from ..backend.state import Backend
from .responses import json_response

__all__ = ["ASSETS", "UI_PATH", "dashboard_routes"]

UI_PATH = "/_mock/ui"

#: The page's files (``mock_server/http/ui/``) and their media types, by URL name.
ASSETS = {"index.html": "text/html; charset=utf-8",
          "dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}

_PAGE_HEADERS = {
    # Everything from this origin, nothing else: no CDN, no inline script, no framing.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_loaded: dict[str, bytes] = {}


def _asset(name: str) -> bytes:
    data = _loaded.get(name)
    if data is None:
        data = _loaded[name] = (resources.files(__package__) / "ui" / name).read_bytes()
    return data


async def page(request: Request) -> Response:
    """``GET /_mock/ui``: the page (public; it holds no data)."""
    return Response(_asset("index.html"), media_type=ASSETS["index.html"], headers=_PAGE_HEADERS)


async def asset(request: Request) -> Response:
    """``GET /_mock/ui/{name}``: the page's script and style (public)."""
    name = request.path_params["name"]
    if name not in ASSETS or name == "index.html":
        raise NotFound(f"the dashboard has no file {name!r}")
    return Response(_asset(name), media_type=ASSETS[name], headers=_PAGE_HEADERS)


def _since(request: Request) -> int:
    raw = request.query_params.get("since", "0")
    if not raw.isdigit() or int(raw) > INT64_MAX:
        raise ValidationFailed("since must be a non-negative integer (the last answer's "
                               "cursor)", details={"loc": "since"})
    return int(raw)


def _faults(request: Request, backend: Backend, key: str) -> list[dict[str, Any]]:
    """The faults in force on ``key``'s calls, and only those (SEC-2, see the module doc)."""
    registry = getattr(request.app.state, "mock_faults", None)
    seen = []
    for fault in getattr(registry, "faults", ()):
        owner = getattr(fault, "owner", None)  # the API key that armed it; None: every tenant
        if owner is not None and owner != key:
            continue
        run_id = fault.spec.run_id
        if run_id is not None:
            run = backend.runs.get(run_id)
            if run is None or run.key != key:
                continue
        view = fault.view()
        view.pop("owner", None)
        # counters of a fault for every tenant count every tenant's calls (the page says so)
        view["scope"] = "every tenant" if owner is None and run_id is None else "this key"
        seen.append(view)
    return seen


async def state(request: Request) -> Response:
    """``GET /_mock/ui/state?since=N``: the key's sessions, runs and what changed since N."""
    backend: Backend = request.app.state.backend
    backend.tick()
    key = backend.authenticate(request.headers.get("authorization"))
    data = dashboard_state(backend, key, since=_since(request))
    data["faults"] = _faults(request, backend, key)
    return json_response(data, headers={"Cache-Control": "no-store"})


def dashboard_routes() -> list[Route]:
    """The page, its data and its assets; mounted with the control plane."""
    return [
        Route(UI_PATH, page, methods=["GET"]),
        Route(UI_PATH + "/", page, methods=["GET"]),
        Route(UI_PATH + "/state", state, methods=["GET"]),
        Route(UI_PATH + "/{name}", asset, methods=["GET"]),
    ]
