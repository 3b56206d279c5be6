"""Where our per-request microseconds go, and how far below them any version of us can get.

Around a raw ASGI app that answers a fixed JSON body (so the framework's own cost is out of
the picture), in one run and interleaved round by round:

1. **Parts switched off one at a time.** Each row stubs one part of the middleware for its
   own rounds only, and reports what that saves against the full middleware timed in the
   same round (a median of per-round differences). The stubs are for the measurement; no
   row is a supported configuration. Parts overlap: "the body parse" also drops the
   splice and the block, since there is nothing to splice into.
2. **References.** ``floor`` writes our output (eleven headers, a block of our shape) and
   measures nothing. ``lean`` is the least code that meters with our own ledger and writes
   our output with our own writers: one window per request, the figure, the headers, the
   block, one statistics record. It has no routing, no stream or failure handling, no
   current_meter(), and it counts the provisional figure instead of waiting for the
   settled one, so it is a lower bound for any middleware built on this ledger, not a
   usable one.

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
from _apps import PAYLOAD, Floor, loads, sim_node
from overhead import run_requests

import giul_asgi.meter as meter_module
import giul_asgi.middleware as middleware_module
import giul_asgi.stats as stats_module
from giul_asgi import EnergyMiddleware, Ledgers, Tier
from giul_asgi.report import energy_headers, energy_json, usage_tokens
from giul_asgi.stats import EnergyStats

BODY = json.dumps(PAYLOAD).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
ROUNDS, PER_ROUND = 15, 2000


async def raw(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": list(HEADERS)})
    await send({"type": "http.response.body", "body": BODY})


class Lean:
    """The least code that meters a JSON answer with our ledger and writes our output."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.ledger = Ledgers().get(sim_node())
        self.stats = EnergyStats()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ledger = self.ledger
        ledger.ensure_started()
        window = ledger.open()
        held: list[Any] = []

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                held.append(message)
                return
            start = held[0]
            body = message.get("body", b"")
            tokens = usage_tokens(loads(body).get("usage"))
            ledger.close(window, tokens)
            figure = ledger.figure(window, "8b", "/x", tokens, "output", 300.0)
            held.append(figure)
            body = body[:-1] + b',"energy":' + energy_json(figure) + b"}"
            headers = list(start["headers"])
            headers[1] = (b"content-length", b"%d" % len(body))
            headers += energy_headers(figure)
            start["headers"] = headers
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, wrapped)
        self.stats.record("/x", 200, "ok", held[1])


def _cached(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` answering its first result forever: the part's output without its work."""
    memo: list[Any] = []

    def cached(*args: Any) -> Any:
        if not memo:
            memo.append(make(*args))
        return memo[0]

    return cached


# Each part: (label, [(object, attribute, stand-in)]), applied only during its own rounds.
Patch = list[tuple[Any, str, Any]]
PARTS: list[tuple[str, Patch]] = [
    ("statistics", [(stats_module.EnergyStats, "defer", lambda self, *args: None)]),
    ("eleven X-Energy-* headers", [(middleware_module, "energy_headers",
                                    _cached(lambda e: list(energy_headers(e))))]),
    ("the energy block's text", [(middleware_module, "energy_json", _cached(energy_json))]),
    ("the body parse (and so splice and block)", [(middleware_module, "parse_object",
                                                   lambda body: None)]),
    ("the figure", [(meter_module.Meter, "figure", _cached(meter_module.Meter.figure))]),
    ("the route template", [(middleware_module, "route_template", lambda scope: None)]),
]


def _apply(patch: Patch) -> Patch:
    old = [(obj, name, getattr(obj, name)) for obj, name, _ in patch]
    for obj, name, value in patch:
        setattr(obj, name, value)
    return old


async def measure() -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    ours = EnergyMiddleware(raw, nodes=[sim_node()], tiers=[Tier("8b", 300.0)],
                            ledgers=Ledgers())
    apps = {"raw": raw, "floor": Floor(raw), "lean": Lean(raw), "ours": ours}
    for app in apps.values():
        await run_requests(app, "/x", 2000)
    plain: dict[str, list[float]] = {name: [] for name in apps}
    parts: dict[str, list[float]] = {label: [] for label, _ in PARTS}
    for _ in range(ROUNDS):
        for name, app in apps.items():
            plain[name].append(await run_requests(app, "/x", PER_ROUND) * 1e6)
        for label, patch in PARTS:
            old = _apply(patch)
            try:
                parts[label].append(await run_requests(ours, "/x", PER_ROUND) * 1e6)
            finally:
                _apply(old)
    return plain, parts


def main() -> None:
    print(f"# overhead_breakdown: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}\n")
    plain, parts = asyncio.run(measure())

    def added(name: str) -> tuple[float, float]:
        """(median of per-round differences, difference of the fastest rounds)."""
        med = statistics.median(a - b for a, b in zip(plain[name], plain["raw"], strict=True))
        return med, min(plain[name]) - min(plain["raw"])

    print(f"{ROUNDS} rounds of {PER_ROUND} requests, every row timed in every round; "
          f"the raw app alone: {statistics.median(plain['raw']):.1f} us per request. The VM's "
          "stalls only ever add time, so the fastest rounds are the least disturbed.\n")
    print("## Parts switched off one at a time\n")
    med, fast = added("ours")
    print(f"Our middleware adds {med:.1f} us per JSON request in these rounds "
          f"({fast:.1f} in the fastest).\n")
    print("| part switched off | saves us: median | middle half of rounds | fastest rounds |")
    print("|---|---:|---|---:|")
    for label, _ in PARTS:
        saved = sorted(a - b for a, b in zip(plain["ours"], parts[label], strict=True))
        q1, q3 = saved[len(saved) // 4], saved[3 * len(saved) // 4]
        fastest = min(plain["ours"]) - min(parts[label])
        print(f"| {label} | {statistics.median(saved):.1f} | {q1:.1f} to {q3:.1f} | "
              f"{fastest:.1f} |")
    print("\n## References\n")
    print("| stack | added us per JSON request: median | fastest rounds |")
    print("|---|---:|---:|")
    for name, what in (("floor", "floor: our output, nothing measured"),
                       ("lean", "lean: our ledger and writers, nothing else"),
                       ("ours", "giul-asgi")):
        med, fast = added(name)
        print(f"| {what} | {med:.1f} | {fast:.1f} |")


if __name__ == "__main__":
    main()
