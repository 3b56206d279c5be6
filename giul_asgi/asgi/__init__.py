"""The ASGI side: the middleware, its settings, one request's exchange, the responders, routing.

Nothing below this package knows about ASGI.
"""

from .middleware import EnergyMiddleware
from .options import Options

__all__ = ["EnergyMiddleware", "Options"]
