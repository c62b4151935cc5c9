"""whitney-kit's mock of the Whitney training service.

Public surface (imported on first use, so ``import mock_server`` costs nothing)::

    create_app(...)          the ASGI app (Starlette) with its own in-memory Backend
    InProcessTransport(app)  a sync httpx transport serving the app without a socket
    Backend, Limits, Features, WhitneyError

Inside, four layers, each importing only the ones below it: ``engine`` (numpy: the model,
losses, optimizer, sampling, PEFT files), ``backend`` (the state machine, no HTTP), ``http``
(Starlette: routes, endpoints, middleware, control plane) and ``testing`` (``MockWhitney``, the
pytest plugin, in-process switches).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend.config import Features, Limits
    from .backend.errors import WhitneyError
    from .backend.state import Backend
    from .http.app import create_app
    from .transport import InProcessTransport

__all__ = ["Backend", "Features", "InProcessTransport", "Limits", "WhitneyError", "create_app"]

_HOMES = {
    "Backend": ".backend.state",
    "Features": ".backend.config",
    "InProcessTransport": ".transport",
    "Limits": ".backend.config",
    "WhitneyError": ".backend.errors",
    "create_app": ".http.app",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value
    return value
