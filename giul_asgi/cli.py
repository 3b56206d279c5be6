"""`giul-asgi`: what this host can meter, and (later) the demo gateway and the agent.

    giul-asgi probe              what each GPU answers: counter, power gauges, MIG
    giul-asgi probe --simulate   the same walk through a simulated card (no GPU needed)
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from collections.abc import Sequence

from . import __version__
from .config import Node
from .ledger import Ledgers
from .meter import Meter
from .readers import SimulatedCard, SimulatedReader, probe_nvml


def probe(seconds: float, simulate: bool) -> int:
    print(f"giul-asgi {__version__} probe on {platform.node()} ({platform.platform()})")
    print(f"python {platform.python_version()}")
    if simulate:
        return _probe_simulated(seconds)
    gpus = probe_nvml()
    if not gpus:
        print("NVML: not available (no driver, no GPU, or nvidia-ml-py missing)")
        print("-> EnergyMiddleware() here reports method=unknown, or estimated where a tier")
        print("   gives joules_per_1k_hint; nothing is invented. Try --simulate to see a")
        print("   metered request on a simulated card.")
        return 0
    for gpu in gpus:
        print(f"\ngpu {gpu.index}: {gpu.name or '?'}")
        if gpu.error:
            print(f"  error: {gpu.error}")
            continue
        print(f"  energy counter (nvmlDeviceGetTotalEnergyConsumption): {_yes(gpu.counter)}")
        print(f"  instant power (NVML_FI_DEV_POWER_INSTANT):            {_yes(gpu.instant_power)}")
        print(f"  averaged power (nvmlDeviceGetPowerUsage):             {_yes(gpu.average_power)}")
        if gpu.mig:
            print("  MIG mode: energy is board-level; a slice cannot be metered alone")
        backend = "nvml_counter" if gpu.counter else (
            "nvml_power" if gpu.instant_power or gpu.average_power else "none")
        print(f"  -> backend {backend}")
    return _measure(Node("probe", gpus=tuple(g.index for g in gpus)), seconds)


def _probe_simulated(seconds: float) -> int:
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1)
    node = Node("simulated", idle_w=70.0, reader_factory=lambda _n: SimulatedReader(card))
    print("simulated card: 70 W idle, 700 W cap, counter steps every 100 ms;")
    print("the request puts 180 W of load on it while it runs")
    return _measure(node, seconds, card)


def _measure(node: Node, seconds: float, card: SimulatedCard | None = None) -> int:
    print(f"\nmetering one {seconds:.1f} s window on node {node.name!r} (idle floor "
          f"{'unknown' if node.idle_w is None else f'{node.idle_w} W'}):")

    async def window() -> None:
        truth = None
        async with Meter.for_node(node, ledgers=Ledgers()) as m:
            job = card.start_job(180.0) if card is not None else None
            await asyncio.sleep(seconds)
            if card is not None and job is not None:
                truth = card.stop_job(job).true_joules
        energy = await m.settled(timeout=2.0)
        print(f"  joules={energy.joules} method={energy.method} backend={energy.backend} "
              f"source={energy.source} settled={energy.settled}")
        print(f"  uncertainty_joules={energy.uncertainty_joules} mean_watts={energy.mean_watts}")
        if truth is not None:
            print(f"  the simulated truth: {truth:.3f} J above idle")
        if energy.error:
            print(f"  note: {energy.error}")

    started = time.perf_counter()
    asyncio.run(window())
    print(f"  ({time.perf_counter() - started:.2f} s)")
    return 0


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="giul-asgi", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe", help="what this host's GPUs can be metered with")
    p.add_argument("--seconds", type=float, default=1.0, help="length of the test window")
    p.add_argument("--simulate", action="store_true", help="use a simulated card")
    args = parser.parse_args(argv)
    if args.command == "probe":
        return probe(args.seconds, args.simulate)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
