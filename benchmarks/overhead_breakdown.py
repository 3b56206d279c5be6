"""Where our per-request microseconds go: parts switched off one at a time, cumulatively.

Around a raw ASGI app that answers a fixed JSON body (so the framework's own cost is out of
the picture), each row turns off one more part of the middleware and reports what is
still added over the bare app: the difference between rows is that part's cost. The parts
are stubbed for the measurement only; no row is a supported configuration.

    python benchmarks/overhead_breakdown.py
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _apps import PAYLOAD, sim_node
from overhead import run_requests

import giul_asgi.meter as meter_module
import giul_asgi.middleware as middleware_module
import giul_asgi.stats as stats_module
from giul_asgi import EnergyMiddleware, Ledgers, Tier

BODY = json.dumps(PAYLOAD).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def raw(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": list(HEADERS)})
    await send({"type": "http.response.body", "body": BODY})


async def added_us() -> float:
    ours = EnergyMiddleware(raw, nodes=[sim_node()], tiers=[Tier("8b", 300.0)], ledgers=Ledgers())
    await run_requests(ours, "/x", 1000)
    diffs = []
    for _ in range(9):
        a = await run_requests(ours, "/x", 2000)
        b = await run_requests(raw, "/x", 2000)
        diffs.append((a - b) * 1e6)
    return statistics.median(diffs)


def main() -> None:
    print(f"# overhead_breakdown: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}\n")
    cached: dict[str, Any] = {}
    real_figure = meter_module.Meter.figure

    def cached_figure(self: Any, tokens: int | None = None) -> Any:
        if "f" not in cached:
            cached["f"] = real_figure(self, tokens)
        return cached["f"]

    steps: list[tuple[str, Callable[[], None]]] = [
        ("everything on", lambda: None),
        ("- statistics", lambda: setattr(stats_module.EnergyStats, "defer",
                                         lambda self, *args: None)),
        ("- X-Energy-* headers", lambda: setattr(middleware_module, "energy_headers",
                                                 lambda e: [])),
        ("- energy block text", lambda: setattr(middleware_module, "energy_json",
                                                lambda e: b"{}")),
        ("- body parse", lambda: setattr(middleware_module, "parse_object", lambda b: None)),
        ("- the figure (cached)", lambda: setattr(meter_module.Meter, "figure", cached_figure)),
    ]
    print("| parts | added us per JSON request |")
    print("|---|---:|")
    for label, switch_off in steps:
        switch_off()
        print(f"| {label} | {asyncio.run(added_us()):.1f} |")
    print("\nWhat remains in the last row: window open/close, routing, the ASGI wrappers and "
          "per-request objects, and the ledger settling each window at its next reading.")


if __name__ == "__main__":
    main()
