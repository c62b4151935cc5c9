"""whitney-kit's mock of the Whitney training service.

Public surface::

    create_app(...)          the ASGI app (Starlette) with its own in-memory Backend
    InProcessTransport(app)  a sync httpx transport serving the app without a socket
    Backend, Limits, Features, WhitneyError
"""

from .app import create_app
from .errors import WhitneyError
from .limits import Features, Limits
from .state import Backend
from .transport import InProcessTransport

__all__ = ["Backend", "Features", "InProcessTransport", "Limits", "WhitneyError", "create_app"]
