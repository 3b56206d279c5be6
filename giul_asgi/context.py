"""The meter of the request being handled, for handlers and the libraries they call.

    from giul_asgi import current_meter

    meter = current_meter()          # None outside a metered request
    if meter is not None:
        meter.bind(node="h100-b", tier="70b")
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .meter import Meter

#: Set by the middleware around the app; reset when the request leaves it.
meter_var: ContextVar[Meter | None] = ContextVar("giul_asgi_current_meter", default=None)


def current_meter() -> Meter | None:
    """The meter of the request this code is handling, or None outside a metered request."""
    return meter_var.get()
