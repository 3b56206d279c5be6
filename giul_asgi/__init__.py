"""giul-asgi: what each answer of an LLM gateway cost in joules, shared fairly across a card.

    from giul_asgi import EnergyMiddleware, Node, Tier, Route

    app.add_middleware(
        EnergyMiddleware,
        nodes=[Node("h100-a", gpus=(0, 1), idle_w=140.0)],
        tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
        routes=[Route("/v1/chat/completions", node="h100-a", tier="70b")],
    )

Four rules hold everywhere: a request is charged above the operator's idle floor; a window
that measured <= 0 J is a failed measurement, never a free request; every figure says how,
by what and from where it was obtained; and requests that overlap on a card share its
energy rather than each taking all of it.
"""

from .config import Config, Node, Route, Tier, load_config
from .energy import Energy
from .errors import ConfigError, GiulError, ReaderUnavailable
from .ledger import Ledger, Ledgers, TimeSplit, TokenSplit, default_ledgers
from .meter import Meter, current_meter
from .middleware import EnergyMiddleware
from .stats import EnergyStats

__version__ = "0.1.0"

__all__ = [
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
