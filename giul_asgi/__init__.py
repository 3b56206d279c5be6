"""giul-asgi: what each answer of an LLM gateway cost in joules, shared fairly across a card.

    from giul_asgi import EnergyMiddleware, Node, Tier, Route

    app.add_middleware(
        EnergyMiddleware,
        nodes=[Node("h100-a", gpus=(0, 1), idle_w=140.0)],
        tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
        routes=[Route("/v1/chat/completions", node="h100-a", tier="70b")],
    )

Five rules hold everywhere: a request is charged above the operator's idle floor; a window
that measured <= 0 J is a failed measurement, never a free request; every figure says how,
by what and from where it was obtained; requests that overlap on a card share its energy
rather than each taking all of it; and a figure's uncertainty is a promise.

The public names are imported on first use, so importing one part (a reader, the agent)
does not pull in the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_WHERE: dict[str, str] = {
    "Budget": "budgets",
    "Config": "config",
    "Node": "config",
    "Route": "config",
    "Tier": "config",
    "load_config": "config",
    "Energy": "energy",
    "ConfigError": "errors",
    "GiulError": "errors",
    "ReaderUnavailable": "errors",
    "Ledger": "ledger",
    "Ledgers": "ledger",
    "TimeSplit": "ledger",
    "TokenSplit": "ledger",
    "default_ledgers": "ledger",
    "Meter": "meter",
    "current_meter": "context",
    "EnergyMiddleware": "asgi",
    "EnergyStats": "stats",
}

if TYPE_CHECKING:
    from .asgi import EnergyMiddleware
    from .budgets import Budget
    from .config import Config, Node, Route, Tier, load_config
    from .context import current_meter
    from .energy import Energy
    from .errors import ConfigError, GiulError, ReaderUnavailable
    from .ledger import Ledger, Ledgers, TimeSplit, TokenSplit, default_ledgers
    from .meter import Meter
    from .stats import EnergyStats


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'giul_asgi' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Budget",
    "Config",
    "ConfigError",
    "Energy",
    "EnergyMiddleware",
    "EnergyStats",
    "GiulError",
    "Ledger",
    "Ledgers",
    "Meter",
    "Node",
    "ReaderUnavailable",
    "Route",
    "Tier",
    "TimeSplit",
    "TokenSplit",
    "__version__",
    "current_meter",
    "default_ledgers",
    "load_config",
]
