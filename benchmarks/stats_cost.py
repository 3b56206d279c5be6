"""What the statistics cost a JSON request, and how much of it is holding meters until they settle.

Three middleware stacks around the same app, timed in turn in one process against the bare
app: the statistics as shipped (each meter held until its window settles, then counted);
a probe that counts each request at once from its provisional figure and keeps nothing
(not a valid design: a figure must settle before it is counted; it only prices holding);
and no statistics at all.

    python benchmarks/stats_cost.py
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _apps import PATHS, bench_app, our_middleware
from overhead import run_requests
from starlette.applications import Starlette

from giul_asgi import EnergyStats, Meter


class CountAtOnce(EnergyStats):
    """The probe: counts at the end of the request, from the provisional figure."""

    def defer(self, route: str, status: int | None, outcome: str, meter: Meter) -> None:
        node, tier, method, joules, tokens, seconds = meter.tally()
        self._bucket(route, node, tier).add(method, joules, tokens, seconds, outcome)


class NoStatistics(EnergyStats):
    def defer(self, route: str, status: int | None, outcome: str, meter: Meter) -> None:
        return None


def app(stats: EnergyStats | None) -> Starlette:
    return bench_app([] if stats is None else [our_middleware(stats=stats)])


async def main() -> None:
    path = PATHS["json"]
    bare = app(None)
    stacks: dict[str, Any] = {
        "statistics as shipped (held until settled)": app(EnergyStats()),
        "probe: counted at once, nothing held": app(CountAtOnce()),
        "no statistics": app(NoStatistics()),
    }
    for stack in (bare, *stacks.values()):
        await run_requests(stack, path, 1000)
    added: dict[str, list[float]] = {label: [] for label in stacks}
    for _ in range(9):
        for label, stack in stacks.items():
            ours = await run_requests(stack, path, 2000)
            base = await run_requests(bare, path, 2000)
            added[label].append((ours - base) * 1e6)
    print(f"# stats_cost: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}\n")
    print("| stack | added us per JSON request (median of 9) | fastest repeat |")
    print("|---|---:|---:|")
    for label, values in added.items():
        print(f"| {label} | {statistics.median(values):.1f} | {min(values):.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
