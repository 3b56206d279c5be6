"""Each step of a metered request, timed alone: where the middleware's microseconds go.

``overhead_breakdown.py`` switches parts off around a whole request; this times each part
by itself with ``timeit`` on a real figure from a live ledger on a busy simulated card, so
the two can be read against each other. Times are per call, best of five runs of many
calls (a slow spell of the VM only ever adds time).

    python benchmarks/hot_path.py
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import timeit
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _apps import CHUNK, PAYLOAD, USAGE, sim_node

from giul_asgi import EnergyStats, Ledgers, Meter, Tier
from giul_asgi.report import (
    SSEScanner,
    energy_headers,
    energy_json,
    find_usage,
    parse_object,
    splice_object,
    usage_tokens,
)

BODY = json.dumps(PAYLOAD, separators=(",", ":")).encode()
# With stream_options.include_usage, every chunk says "usage": null; the last one has it.
NULL_USAGE_CHUNK = CHUNK[:-3] + b',"usage":null}\n\n'
USAGE_CHUNK = b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode() + b"\n\n"


def per_call_us(fn: Callable[[], object], number: int = 20_000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


async def main() -> None:
    ledgers, tier = Ledgers(), Tier("8b", 300.0)
    ledger = ledgers.get(sim_node())
    meter = Meter(ledger, tier, route="/v1/chat/completions", ledgers=ledgers)
    meter.open()
    await asyncio.sleep(0.3)  # a few readings: the ledger knows the card's power
    meter.tokens(48)
    meter.close()
    figure = meter.figure()
    obj = parse_object(BODY)
    assert obj is not None
    block = energy_json(figure)

    def open_close() -> None:
        ledger.close(ledger.open())

    def new_meter() -> None:
        m = Meter(ledger, tier, route="/v1/chat/completions", ledgers=ledgers)
        m.open()
        m.close()

    rows: list[tuple[str, float]] = [
        ("ledger open + close (one window)", per_call_us(open_close)),
        ("Meter built, opened, closed", per_call_us(new_meter)),
        ("the figure (Meter.figure)", per_call_us(meter.figure)),
        ("eleven X-Energy-* headers", per_call_us(lambda: energy_headers(figure))),
        ("the energy block (JSON text)", per_call_us(lambda: energy_json(figure))),
        (f"parse the app's body ({len(BODY)} bytes)", per_call_us(lambda: parse_object(BODY))),
        ("token count from usage", per_call_us(lambda: usage_tokens(find_usage(obj)))),
        ("splice the block in", per_call_us(lambda: splice_object(BODY, obj, "energy", block))),
    ]

    # Statistics: a settled meter handed over, then counted (per request, in batches). On
    # a ledger of their own: the loops above left it 200 000 closed windows to settle.
    own = Ledgers()
    stats_ledger = own.get(sim_node())
    stats_ledger.ensure_started()
    await asyncio.sleep(0.3)
    meters = []
    for _ in range(20_000):
        m = Meter(stats_ledger, tier, route="/v1/chat/completions", ledgers=own)
        m.open()
        m.tokens(48)
        m.close()
        meters.append(m)
    for _ in range(100):  # the next readings settle them all
        await asyncio.sleep(0.05)
        if all(m.settled_now for m in meters):
            break
    best = float("inf")
    for chunk in range(5):
        stats = EnergyStats()
        batch = meters[chunk * 4000:(chunk + 1) * 4000]
        start = timeit.default_timer()
        for m in batch:
            stats.defer("/v1/chat/completions", 200, "ok", m)
        stats.fold()
        best = min(best, (timeit.default_timer() - start) / len(batch) * 1e6)
        counted = stats.snapshot()["total"]["requests"]
        assert counted == len(batch), f"only {counted} of {len(batch)} meters were counted"
    rows.append(("statistics: defer + count a settled meter", best))
    await ledgers.aclose()
    await own.aclose()

    print(f"# hot_path: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}\n")
    print("| step | us per call |")
    print("|---|---:|")
    for label, us in rows:
        print(f"| {label} | {us:.2f} |")
    print(f"\nSum of the steps: {sum(us for _, us in rows[1:]):.1f} us (the Meter row includes "
          "the window's open and close). Not timed here: the ASGI wrappers, routing, the "
          "response's header list and messages, and the reading that settles each window.")

    scanner = SSEScanner("output")
    assert scanner.quiet(CHUNK) and scanner.quiet(NULL_USAGE_CHUNK)
    stream_rows = [
        ("a chunk with nothing to act on, let through", per_call_us(lambda: scanner.quiet(CHUNK))),
        ('a chunk with "usage": null, let through',
         per_call_us(lambda: scanner.quiet(NULL_USAGE_CHUNK))),
        ("the chunk with usage, read (once a stream)",
         per_call_us(lambda: SSEScanner("output").feed(USAGE_CHUNK))),
    ]
    print("\n| stream step | us per call |")
    print("|---|---:|")
    for label, us in stream_rows:
        print(f"| {label} | {us:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
