"""How wide the figures of requests drawing alike are on the README's simulated card, batched.

A found limit, kept measurable: the time split's own doubt (giul_asgi/ledger/doubt.py) learns
how far members of a span draw from one rate from contrasts of neighbouring stretches, which
assume that rate is the same in both. On the README's simulated card (``Node(...,
reader="simulated")``: 200 W a window up to a 700 W cap, its counter stepping every 100 ms
+-20 ms, the load of a read's interval spread over it), a batch's rate per request falls as the
batch grows, and the contrasts read that as the members' spread. This runs rounds of requests
drawing alike, one every ``--seconds / --at-once`` (about ``--at-once`` in flight), on the real clock in this
process, and prints each round's median first and settled width (uncertainty / joules) and the
spread learnt (``c``; 0 for requests drawing alike). ``--options`` passes the reader's own keys
(``{"cap_w": 100000}``: no cap).

    python benchmarks/simulated_batch.py
    python benchmarks/simulated_batch.py --options '{"cap_w": 100000}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
from datetime import UTC, datetime

from giul_asgi import Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter


async def one(ledger: Ledger, delay: float, seconds: float, meters: list[Meter], firsts: list[float]) -> None:
    """A request ``delay`` after its round began, lasting ``seconds``: its first width kept."""
    await asyncio.sleep(delay)
    meter = Meter(ledger)
    meter.open()
    await asyncio.sleep(seconds)
    meter.close()
    first = meter.figure()
    if first.joules and first.uncertainty_joules is not None:
        firsts.append(first.uncertainty_joules / first.joules)
    meters.append(meter)


async def rounds(
    ledger: Ledger, count: int, at_once: int, seconds: float,
) -> list[tuple[float, float, float | None]]:
    """Per round: (first width, settled width, learnt c), medians over the round's requests."""
    out = []
    for _ in range(count):
        meters: list[Meter] = []
        firsts: list[float] = []
        await asyncio.gather(*(one(ledger, seconds * i / at_once, seconds, meters, firsts)
                               for i in range(2 * at_once)))
        await asyncio.sleep(1.0)
        settled = [e.uncertainty_joules / e.joules for m in meters
                   if (e := m.figure()).settled and e.joules and e.uncertainty_joules is not None]
        learnt = ledger.book._by_time.learnt()
        out.append((statistics.median(firsts), statistics.median(settled),
                    None if learnt is None else math.sqrt(learnt)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--at-once", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=0.6)
    parser.add_argument("--options", default="{}", help="the simulated reader's options, as JSON")
    args = parser.parse_args()
    options = json.loads(args.options)
    ledger = Ledger(Node("sim", idle_w=70.0, reader="simulated", workers_dir=False, options=options))
    ledger.ensure_started()
    try:
        results = asyncio.run(rounds(ledger, args.rounds, args.at_once, args.seconds))
    finally:
        ledger.stop()
    print(f"# simulated_batch.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print(f"    {args.rounds} rounds of {2 * args.at_once} requests of {args.seconds:g} s, one every "
          f"{args.seconds / args.at_once * 1000:g} ms (about {args.at_once} in flight); reader options "
          f"{options}\n")
    print("| round | first width (median) | settled width (median) | spread learnt (c) |")
    print("|---:|---:|---:|---:|")
    for i, (first, settled, c) in enumerate(results, 1):
        print(f"| {i} | {100 * first:.0f}% | {100 * settled:.0f}% | {'-' if c is None else f'{c:.2f}'} |")


if __name__ == "__main__":
    main()
