"""whitney-kit's mock of the Whitney training service.

Public surface::

    create_app(...)          the ASGI app (Starlette) with its own in-memory Backend
    InProcessTransport(app)  a sync httpx transport serving the app without a socket
    Backend, Limits, Features, WhitneyError
"""

from .http.app import create_app
from .backend.errors import WhitneyError
from .backend.config import Features, Limits
from .backend.state import Backend
from .transport import InProcessTransport

__all__ = ["Backend", "Features", "InProcessTransport", "Limits", "WhitneyError", "create_app"]
